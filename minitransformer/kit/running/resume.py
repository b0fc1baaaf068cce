"""Can a trainer continue exactly from this checkpoint? A resume is all or nothing: every part of the file the run
will load is compared with what the trainer has, so a refused file leaves trainer, model and generators as they were.
"""

from __future__ import annotations

from minitransformer.config import TransformerConfig
from minitransformer.kit.running.checkpoint_checks import check_state
from minitransformer.limits import MAX_COUNT


def check_resumable(trainer, ck) -> dict:
    """Refuse (ValueError naming the file and the field) a checkpoint ``trainer`` cannot continue exactly: another
    config, or a state ``check_state`` finds unfit for this run's ``state_dict()``s. -> the training state."""
    path, state = ck.path, ck.extra.get("trainer")
    saved, ours = full_config(ck.config), full_config(trainer.config)
    if saved is not None and ours is not None and saved != ours:
        changed = sorted(k for k in set(saved) | set(ours) if saved.get(k) != ours.get(k))
        raise ValueError(f"Trainer.resume: checkpoint {path} was trained with another model config "
                         f"(differs in {changed}); build the model from the checkpoint's config to resume")
    for absent, what in ((state is None, "training state (was it written by Trainer?)"),
                         (ck.optimizer is None, "optimiser state"),
                         (trainer.scheduler is not None and ck.scheduler is None,
                          "scheduler state, and this run has a scheduler")):
        if absent:
            raise ValueError(f"Trainer.resume: checkpoint {path} holds no {what}")
    check_state(path, "weights", ck.weights, {name: p.data for name, p in trainer.model.named_parameters()})
    check_state(path, "optimizer", ck.optimizer, {**trainer.optimizer.state_dict(), "lr": 0.0})      # lr: any rate >= 0
    if trainer.scheduler is not None:
        check_state(path, "scheduler", ck.scheduler, trainer.scheduler.state_dict())
        for key, value in ck.scheduler.items():
            if key != "step" and isinstance(value, (int, float)) and not value > 0:
                raise ValueError(f"checkpoint {path}: scheduler[{key!r}] must be positive, got {value}")
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {path}: the training state must be an object, "  # noqa: TRY004
                         f"got {type(state).__name__}")
    state = {"train_cpu_seconds": 0.0, **state}                     # a field that older checkpoints lack
    for key in ("data", "history", "valid_history", "train_seconds", "tokens_seen", "skipped"):
        if key not in state:
            raise ValueError(f"checkpoint {path} is missing the training state's {key!r}")
    check_state(path, "the training state's data position", state["data"], trainer.train_data.state_dict())
    if hasattr(trainer.train_data, "__len__") and state["data"].get("position", 0) > len(trainer.train_data):
        raise ValueError(f"checkpoint {path}: the data position {state['data']['position']} is beyond the "
                         f"{len(trainer.train_data)} batches of an epoch of this run's data")
    # tokens_seen as a number, not a count: a long run reads more tokens than limits.MAX_COUNT
    counters = ("train_seconds", "train_cpu_seconds", "tokens_seen", "skipped")
    check_state(path, "the training state", {k: state[k] for k in counters}, dict(zip(counters, (0.0, 0.0, 0.0, 0))))
    for key, width in (("history", 4), ("valid_history", 3)):
        rows = state[key]
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == width and all(map(_number, r))
                                                 and type(r[0]) is int and 0 <= r[0] <= MAX_COUNT for r in rows):
            raise ValueError(f"checkpoint {path}: the training state's {key} must be a list of [{width} numbers] rows, "
                             f"a step first")
    return state


def full_config(config):
    """A config dict with every field's default filled in (older checkpoints lack d_k, positional); else as it is."""
    try:
        return TransformerConfig.from_dict(config).to_dict()
    except (TypeError, ValueError):
        return config


def _number(value) -> bool:
    """A JSON number that converts to a float (NaN and infinity included: a history may hold them)."""
    return isinstance(value, float) or (type(value) is int and abs(value) <= 2 ** 53)
