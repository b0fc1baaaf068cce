"""``minitransformer train``: settings, run folder, data, model, training, final score, files.

``cmd_train`` runs these steps in order:

    _make_out_folder           --out, created (or refused if it is a file)
    _settings_and_checkpoint   the task's defaults with the options typed; with --resume, the saved run's
    _refuse_an_earlier_run     a fresh run never writes over a file already in --out (unless --overwrite)
    check_outputs              a resumed run refuses an --out whose files it writes are symbolic links
    task_data                  the task's model config, batches and metric (task_data.py); a resumed run's
                               must be the model its checkpoint holds
    _build_trainer             the model (fast tier, or the core with --reference), loss, Adam, Noam, Trainer
    _start                     resume the run, or remove the earlier run's files (--overwrite)
    trainer.fit()
    _final_score               exact match or test BLEU, and a sentence for the attention plot
    _write_results             metrics.json, loss.png, attention.png; the last lines name each file written

The resume policy: a resumed run keeps the settings it was started with (it computes what the uninterrupted
run would have), except RESUMABLE_OVERRIDES typed on this command line, which only change when the run stops
and what it reports.
"""

from __future__ import annotations

import os
import sys
import time

from minitransformer import backend
from minitransformer.kit.data.tasks import TASKS as SEQUENCE_TASKS
from minitransformer.kit.data.tasks import exact_match
from minitransformer.kit.running import checkpoint as ckpt
from minitransformer.kit.running.files import write_json
from minitransformer.kit.running.train import Trainer, full_config
from minitransformer.optim import NoamSchedule

from .common import (
    CLIError,
    bleu_of,
    check_outputs,
    choose_blas_threads,
    describe_blas_threads,
    load_pairs,
    plot_attention,
    plot_loss,
    tier,
)
from .defaults import MODEL_OPTIONS, check_saved_settings, task_settings
from .task_data import task_data

# What --resume may change: when and how the run stops and reports, never what it computes.
RESUMABLE_OVERRIDES = ("steps", "epochs", "max_minutes", "eval_every", "save_every", "keep", "average",
                       "target", "progress", "plots", "heldout", "beam_size", "on_nonfinite", "limit")

# The files `train` writes into --out besides the checkpoints, and those `evaluate` writes there by default.
# --overwrite removes exactly these names (and the checkpoints), never another file of the folder.
PLOT_FILES = ("loss.png", "attention.png")
EVAL_FILES = tuple(f"eval-{split}.json" for split in ("train", "valid", "test", "heldout"))

# Options that only switch something off for this command (there is no flag to switch them back on), so a
# resumed run takes them from this command line, never from the saved run.
THIS_COMMAND_ONLY = ("progress", "plots")


def cmd_train(args) -> int:
    out = args.out or os.path.join("runs", args.task)
    _make_out_folder(out)                                  # first: every later message may name files in it
    settings, resume_from = _settings_and_checkpoint(args, out)
    if settings.get("average", 1) > settings["keep"]:
        raise CLIError(f"--average {settings['average']} needs that many step checkpoints kept: --keep must be at "
                       f"least {settings['average']}, got {settings['keep']}")
    if resume_from is None and not args.overwrite:
        _refuse_an_earlier_run(out, settings["plots"])
    if resume_from is None and args.resume:
        print(f"--resume: no checkpoint in {out} yet: starting from scratch", file=sys.stderr)
    task = settings["task"]
    backend.manual_seed(settings["seed"])
    wall_start = time.perf_counter()

    if resume_from is not None:
        check_outputs(out, _files_written(out, settings))   # before any work: a trap refuses the run, not its end
    data = task_data(settings, resume_from)
    if resume_from is not None and full_config(resume_from.config) != data.config.to_dict():
        raise CLIError(f"--resume: {resume_from.path} does not hold the model its saved settings describe "
                       f"(its config is {'missing' if resume_from.config is None else 'another'})")
    workers = _workers(settings)
    threads = choose_blas_threads(data.config, workers)
    trainer = _build_trainer(settings, data, out, workers)
    _start(trainer, args, out, resume_from)
    model, config = trainer.model, data.config
    print(f"training {task}: {model.num_parameters():,} parameters, d_model={config.d_model}, "
          f"heads={config.num_heads}, layers={config.num_encoder_layers}+{config.num_decoder_layers}, "
          f"d_ff={config.d_ff} -> {out}")
    print(describe_blas_threads(threads, config, workers))
    if workers > 1:
        print(f"workers: {workers} threads, each running a part of every batch on a replica of the model "
              f"(--workers 1: the whole batch on one)")
    summary = trainer.fit()
    stopped = trainer.stop_description()
    print(f"stopped: {stopped}")

    averaged = _average_last_checkpoints(settings, out, model)
    scores, example = _final_score(settings, data, model, averaged)
    metrics = {"task": task, "tier": "reference" if settings.get("reference") else "fast",
               "steps": summary["steps"], "epoch": summary["epoch"], "loss": summary["loss"],
               "valid_loss": summary["valid_loss"], "train_seconds": summary["train_seconds"],
               "train_cpu_seconds": summary["train_cpu_seconds"],
               "tokens_per_second": summary["tokens_per_second"], "stop_reason": summary["stop_reason"],
               "stopped": stopped, "skipped_steps": summary["skipped_steps"], **threads, "workers": workers, "seed": settings["seed"],
               "config": config.to_dict(), "settings": settings, **scores}
    metrics["wall_seconds"] = time.perf_counter() - wall_start
    written = _write_results(out, metrics, trainer, data, example)
    print(f"\n{summary['steps']} steps, {summary['train_seconds']:.1f} s of training "
          f"({summary['tokens_per_second']:,.0f} tokens/s), {metrics['wall_seconds']:.1f} s in all; {stopped}")
    print("files written:")
    width = max(len(path) for path, _ in written)
    for path, what in written:
        print(f"  {path:<{width}}  {what}")
    return 0


# ============================================================================ settings and the run folder

def _settings_and_checkpoint(args, out: str) -> tuple:
    """(the run's settings, the checkpoint --resume continues from, or None for a fresh run)."""
    settings = task_settings(args)
    resume_path = ckpt.latest_checkpoint(out) if args.resume else None
    if resume_path is None:
        return settings, None
    if ckpt.step_of_file(resume_path) is not None:          # checkpoint.npz is missing
        print(f"--resume: {os.path.join(out, ckpt.LATEST)} does not exist: continuing from the newest "
              f"step checkpoint, {resume_path}", file=sys.stderr)
    resume_from = ckpt.load_checkpoint(resume_path)
    return _resumed_settings(args, settings, resume_from), resume_from


def _typed_options(args) -> set:
    """The `train` options given on this command line. Each one's argparse default is None, so an option that
    is not None was typed (unlike the values of `task_settings`, which fill in the task's defaults)."""
    not_settings = ("command", "task", "out", "resume", "overwrite", "data_dir")
    return {name for name, value in vars(args).items() if value is not None and name not in not_settings}


def _resumed_settings(args, settings: dict, resume_from) -> dict:
    """The saved run's settings, with the RESUMABLE_OVERRIDES the user typed on this command line.

    Only typed options count: `settings` also holds the task's defaults, and those must not replace what
    the run was started with (a plain --resume of a 6-step run would otherwise train on to the default 3000).
    """
    saved = resume_from.extra.get("settings")
    if not isinstance(saved, dict) or saved.get("task") != args.task:
        raise CLIError(f"--resume: {resume_from.path} is not a checkpoint of a `train --task {args.task}` run")
    saved = check_saved_settings(saved, args.task, f"checkpoint {resume_from.path}", complete=True)
    typed = _typed_options(args)
    overrides = {k: settings[k] for k in RESUMABLE_OVERRIDES if k in typed and k not in THIS_COMMAND_ONLY}
    if "steps" in typed or "epochs" in typed:            # one replaces the other (they are exclusive options)
        overrides["steps"], overrides["epochs"] = settings["steps"], settings["epochs"]
    changed = [f"{k} {saved.get(k)} -> {v}" for k, v in overrides.items() if saved.get(k) != v]
    if changed:
        print(f"--resume: overriding the saved run's {', '.join(changed)}", file=sys.stderr)

    saved_config = resume_from.config or {}
    ignored = []
    for option in sorted(typed - set(RESUMABLE_OVERRIDES)):
        if option in MODEL_OPTIONS:
            field = MODEL_OPTIONS[option]
            differs = settings["model"].get(field) != saved_config.get(field)
        else:
            differs = settings.get(option) != saved.get(option)
        if differs:
            ignored.append(option)
    if ignored:
        print(f"--resume: continuing with the saved run's settings for {', '.join(ignored)}", file=sys.stderr)
    return {**saved, **overrides, **{k: settings[k] for k in THIS_COMMAND_ONLY},
            "data_dir": settings["data_dir"] or saved.get("data_dir")}


def _make_out_folder(out: str) -> None:
    """Create --out (and its parents), or say clearly why it cannot be the run's folder."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise CLIError(f"--out {out} is a file, not a folder: choose a folder for the run's files")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as err:
        raise CLIError(f"--out {out}: cannot create the folder ({err.strerror or err})") from None


def _files_written(out: str, settings: dict) -> list:
    """The names of the files a run writes in --out: metrics.json, the plots, the checkpoints (those already
    there included: the manager replaces and prunes them)."""
    steps = [os.path.basename(p) for p in ckpt.list_checkpoints(out)]
    return ["metrics.json", *(PLOT_FILES if settings["plots"] else ()), ckpt.LATEST, *steps]


def _refuse_an_earlier_run(out: str, plots: bool) -> None:
    """A fresh run (no --overwrite) must not write over anything in --out: refuse if a file it would write
    is there already (another run's, or the user's own), naming it and what to do instead."""
    checkpoints = ckpt.checkpoint_files(out)
    if checkpoints:
        raise CLIError(f"{out} already holds the checkpoints of a run ({os.path.basename(checkpoints[-1])} ...): "
                       f"continue it with --resume, start over with --overwrite, or choose another --out")
    would_write = ["metrics.json", *(PLOT_FILES if plots else ())]
    present = [name for name in would_write if os.path.lexists(os.path.join(out, name))]
    if present:
        raise CLIError(f"{out} already holds {', '.join(present)}, which this run would overwrite: start over "
                       f"with --overwrite (removes {'it' if len(present) == 1 else 'them'}), or choose another --out")


def _remove_earlier_run(out: str) -> list:
    """--overwrite: delete what an earlier run (and `evaluate`) wrote in --out, so that none of it sits beside
    the new run as if it were the new run's. Only those names: any other file of the folder stays. -> names."""
    names = [os.path.basename(p) for p in ckpt.checkpoint_files(out)]
    names += [n for n in ("metrics.json", *PLOT_FILES, *EVAL_FILES) if os.path.lexists(os.path.join(out, n))]
    for name in names:
        os.remove(os.path.join(out, name))
    return names


# ============================================================================ model and training

def _workers(settings: dict) -> int:
    """The worker threads of the run: its setting (1 for a run saved before there was one), on the CPU only (on
    a GPU the parts would run one after another, for nothing)."""
    return settings.get("workers", 1) if backend.get_backend() == "numpy" else 1


def _build_trainer(settings: dict, data, out: str, workers: int = 1) -> Trainer:
    """The model of the chosen tier, the label-smoothed loss, and Adam (the paper's betas and eps) whose
    learning rate the Noam schedule sets at every step, in a Trainer that saves into ``out``; with several
    workers, each step's batch is split across them (``fast.DataParallel``)."""
    config = data.config
    Transformer, CrossEntropyLoss, Adam = tier(bool(settings.get("reference")))
    model = Transformer(config)
    loss_fn = CrossEntropyLoss(ignore_index=config.pad_id, label_smoothing=settings["label_smoothing"])
    parallel = None
    if workers > 1:
        from minitransformer.fast import DataParallel

        parallel = DataParallel(model, loss_fn, workers)
    optimizer = Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = NoamSchedule(optimizer, config.d_model, warmup=settings["warmup"], factor=settings["lr_factor"])
    return Trainer(
        model, loss_fn, optimizer, data.train_data, scheduler=scheduler, valid_data=data.valid_batches,
        clip_norm=settings["clip_norm"], max_steps=settings.get("steps"), max_epochs=settings.get("epochs"),
        max_seconds=None if settings.get("max_minutes") is None else 60.0 * settings["max_minutes"],
        eval_every=settings["eval_every"], metric_fn=data.metric_fn, target=settings.get("target"),
        checkpoint_dir=out, save_every=settings["save_every"], keep=settings["keep"],
        on_nonfinite=settings["on_nonfinite"], progress=settings["progress"], config=config.to_dict(),
        tokenizers=data.tokenizers(), extra={"task": settings["task"], "settings": settings},
        metric_name=data.metric_name, metric_format=data.format_metric, parallel=parallel)


def _start(trainer: Trainer, args, out: str, resume_from) -> None:
    """Continue the saved run, or (--overwrite) clear the earlier run's files out of the new one's way."""
    if resume_from is not None:
        trainer.resume(resume_from.path)
        print(f"resumed {out} at step {trainer.step} (epoch {trainer.train_data.epoch}, "
              f"batch {trainer.train_data.position})")
    elif args.overwrite:
        # Only now, with the config, data and model built: a mistake in any of them leaves the old run whole.
        removed = _remove_earlier_run(out)
        if removed:
            print(f"--overwrite: removed the earlier run's {', '.join(removed)} from {out}", file=sys.stderr)


# ============================================================================ final score and files

def _average_last_checkpoints(settings: dict, out: str, model) -> list:
    """With the setting average N > 1: load the mean of the weights of the run's last N step checkpoints into
    the model (paper §6.1), which the final score then measures. The checkpoints themselves stay as they are
    (checkpoint.npz is the last step, for --resume). -> the files averaged, oldest first ([] without)"""
    n = settings.get("average", 1)
    if n == 1:
        return []
    used = ckpt.last_checkpoints(out, n)
    if len(used) < n:
        print(f"--average {n}: only {len(used)} step checkpoint(s) in {out}; "
              f"{'averaging those' if used else 'scoring the last model'}", file=sys.stderr)
    if used:
        model.load_state_dict(ckpt.average_checkpoints(used))
    return used


def _averaged_words(averaged: list) -> str:
    """', average of 3 checkpoints, steps 1600-1763' for a score of averaged weights, else ''."""
    if not averaged:
        return ""
    first, last = ckpt.step_of_file(averaged[0]), ckpt.step_of_file(averaged[-1])
    return f", average of {len(averaged)} checkpoints, steps {first}-{last}"


def _final_score(settings: dict, data, model, averaged: list) -> tuple:
    """Score the trained model (or the mean of its last checkpoints: ``averaged``) on held-out data: exact
    match (copy, reverse) or test BLEU (toy, multi30k). -> (the scores for metrics.json, the attention plot's
    example: source ids, their labels, and the function that labels target ids)"""
    model.eval()
    average = {"averaged": max(len(averaged), 1), "averaged_steps": [ckpt.step_of_file(p) for p in averaged]}
    if settings["task"] in SEQUENCE_TASKS:
        heldout = data.heldout
        score = exact_match(model, heldout)
        print(f"exact match on {len(heldout)} held-out sequences{_averaged_words(averaged)}: {100 * score:.1f}%")
        example = heldout[0][0]
        symbols = {data.config.bos_id: "<bos>", data.config.eos_id: "<eos>"}
        return {"exact_match": score, "heldout": len(heldout), "decoding": "greedy", **average}, \
            (example, [str(i) for i in example], lambda ids: [symbols.get(i, str(i)) for i in ids])

    task, src_tok, tgt_tok = settings["task"], data.src_tok, data.tgt_tok
    test_text = load_pairs(task, "test", settings["data_dir"])[: settings["limit"]]
    lowercase = task == "multi30k"
    score, hyps = bleu_of(model, src_tok, tgt_tok, test_text, lowercase, beam_size=settings["beam_size"])
    decoding = "greedy" if settings["beam_size"] == 1 else f"beam {settings['beam_size']}"
    print("sample translations (test):")
    for (src, ref), hyp in list(zip(test_text, hyps))[:5]:
        print(f"  source     {src}\n  reference  {ref}\n  model      {hyp}\n")
    print(f"test BLEU ({decoding}{', lowercased' if lowercase else ''}{_averaged_words(averaged)}, "
          f"{len(test_text)} sentences): {score:.2f}")
    # a subordinate clause if there is one: German moves its verb, which the attention plot shows
    example_text = next((s for s, _ in test_text if "because" in s.split() or "weil" in s.split()), test_text[0][0])
    example = src_tok.encode(example_text)
    scores = {"bleu": score, "split": "test", "sentences": len(test_text), "lowercase": lowercase,
              "decoding": decoding, **average}
    return scores, (example, src_tok.token_labels(example), tgt_tok.token_labels)


def _write_results(out: str, metrics: dict, trainer: Trainer, data, example: tuple) -> list:
    """metrics.json and (unless --no-plots) the plots. -> (path, what it holds) of every file of the run in
    --out, checkpoints included, for the summary printed last."""
    metrics_path = os.path.join(out, "metrics.json")
    write_json(metrics_path, metrics, "metrics")
    score = "test BLEU" if "bleu" in metrics else "held-out exact match"
    model_note = f"the trained model (step {trainer.step}): translate or evaluate --checkpoint {out}"
    if metrics["averaged"] > 1:
        n = metrics["averaged"]
        model_note = (f"the last model (step {trainer.step}); the score is of the mean of the last {n} step "
                      f"checkpoints: translate or evaluate --checkpoint {out} --average {n}")
    written = [(metrics_path, f"final metrics: {score}, times, settings"), (os.path.join(out, ckpt.LATEST), model_note)]
    steps = ckpt.list_checkpoints(out)
    written += [(path, "a step checkpoint, for --resume and evaluate --average") for path in steps]
    if metrics["settings"]["plots"]:
        if trainer.history:
            plot_loss(trainer, os.path.join(out, "loss.png"), data.metric_name, 100.0 if data.metric_percent else 1.0)
            written.append((os.path.join(out, "loss.png"), f"training and validation loss, {data.metric_name}"))
        else:                                              # e.g. a time limit reached before the first step
            print("no training steps: loss.png not written")
        plot_attention(trainer.model, *example, os.path.join(out, "attention.png"),
                       title=f"Cross-attention ({metrics['task']}, a held-out example)")
        written.append((os.path.join(out, "attention.png"), "cross-attention of every head on a held-out example"))
    return written
