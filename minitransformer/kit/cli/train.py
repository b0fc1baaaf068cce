"""``minitransformer train`` as a straight line: the settings resolved once (``plan_run``, the one reader of the
command line), then data, model, trainer, fit, score, files."""

import os
import sys
import time

from minitransformer import backend
from minitransformer.kit.data.task_data import task_data
from minitransformer.kit.running import checkpoint as ckpt
from minitransformer.kit.running import runs
from minitransformer.kit.files import check_writable, write_json
from minitransformer.kit.running.settings import (MODEL_OPTIONS, OPTIONAL_SAVED, check_complete,
                                                  check_saved_settings, task_settings)
from minitransformer.kit.running.checkpoint_checks import full_config

from .common import CLIError, tokenizers_from_checkpoint

# What --resume may change: when and how the run stops and reports, never what it computes.
RESUMABLE_OVERRIDES = ("steps", "epochs", "max_minutes", "eval_every", "save_every", "keep", "average",
                       "target", "progress", "plots", "heldout", "beam_size", "on_nonfinite", "limit")
# Switches that only turn something off for this command: a resumed run takes them from this command line.
THIS_COMMAND_ONLY = ("progress", "plots")
# What evaluate writes into a run folder: --overwrite removes these, the checkpoints, runs.PLOT_FILES, metrics.json.
EVAL_FILES = tuple(f"eval-{split}.json" for split in ("train", "valid", "test", "heldout"))


def cmd_train(args) -> int:
    settings, out, resume_from, overwrite = plan_run(args)
    wall_start = time.perf_counter()
    backend.manual_seed(settings["seed"])
    data = task_data(settings, resume_from and tokenizers_from_checkpoint(resume_from))
    if resume_from is not None and full_config(resume_from.config) != data.config.to_dict():
        raise CLIError(f"--resume: {resume_from.path} does not hold the model its saved settings describe")
    workers = settings["workers"] if backend.get_backend() == "numpy" else 1  # a GPU would run the parts in turn
    threads = runs.choose_blas_threads(data.config, workers)
    trainer = runs.build_trainer(settings, data, out, workers)
    # Only now that config, data and model are built (a mistake in any leaves the old run whole): continue the
    # saved run, or, with --overwrite, delete what an earlier run and `evaluate` wrote in --out (those names only).
    if resume_from is not None:
        trainer.resume(resume_from)                        # read once, in plan_run
        print(f"resumed {out} at step {trainer.step} (epoch {trainer.train_data.epoch}, "
              f"batch {trainer.train_data.position})")
    elif overwrite:
        names = [os.path.basename(p) for p in ckpt.checkpoint_files(out)]
        names += [n for n in ("metrics.json", *runs.PLOT_FILES, *EVAL_FILES) if os.path.lexists(os.path.join(out, n))]
        for name in names:
            os.remove(os.path.join(out, name))
        if names:
            print(f"--overwrite: removed the earlier run's {', '.join(names)} from {out}", file=sys.stderr)
    c = data.config
    print(f"training {settings['task']}: {trainer.model.num_parameters():,} parameters, d_model={c.d_model}, "
          f"heads={c.num_heads}, layers={c.num_encoder_layers}+{c.num_decoder_layers}, d_ff={c.d_ff} -> {out}")
    print(runs.describe_blas_threads(threads, c, workers))
    if workers > 1:
        print(f"workers: {workers} threads, each running a part of every batch on a replica of the model "
              f"(--workers 1: the whole batch on one)")
    summary, stopped = trainer.fit(), trainer.stop_description()
    print(f"stopped: {stopped}")
    scores, example = runs.final_score(settings, data, trainer.model, out)
    metrics = {"task": settings["task"], "tier": "reference" if settings.get("reference") else "fast",
               **{k: summary[k] for k in ("steps", "epoch", "loss", "valid_loss", "train_seconds", "train_cpu_seconds",
                                          "tokens_per_second", "stop_reason")},
               "stopped": stopped, "skipped_steps": summary["skipped_steps"], **threads, "workers": workers,
               "seed": settings["seed"], "config": c.to_dict(), "settings": settings, **scores,
               "wall_seconds": time.perf_counter() - wall_start}
    written = _write_results(out, metrics, trainer, data, example)
    print(f"\n{summary['steps']} steps, {summary['train_seconds']:.1f} s of training "
          f"({summary['tokens_per_second']:,.0f} tokens/s), {metrics['wall_seconds']:.1f} s in all; {stopped}")
    print("files written:")
    width = max(len(path) for path, _ in written)
    for path, what in written:
        print(f"  {path:<{width}}  {what}")
    return 0


def plan_run(args) -> tuple:
    """The run the command line asks for, the only function that reads it: (settings, checked: what the run computes
    with and saves in every checkpoint; the run folder; the Checkpoint continued or None; whether to remove an
    earlier run's files once the new run is built)."""
    typed = {k: v for k, v in vars(args).items() if v is not None and k not in ("command", "run")}
    task, resume, overwrite = typed.pop("task"), typed.pop("resume", False), typed.pop("overwrite", False)
    out = typed.pop("out", None) or os.path.join("runs", task)
    if os.path.lexists(out) and not os.path.isdir(out):    # first: every later message may name files in it
        raise CLIError(f"--out {out} is a file, not a folder: choose a folder for the run's files")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as err:
        raise CLIError(f"--out {out}: cannot create the folder ({err.strerror or err})") from None
    settings, resume_from = task_settings(task, typed), None
    path = ckpt.latest_checkpoint(out) if resume else None
    if path is not None:
        if ckpt.step_of_file(path) is not None:
            print(f"--resume: {os.path.join(out, ckpt.LATEST)} does not exist: continuing from the newest "
                  f"step checkpoint, {path}", file=sys.stderr)
        resume_from = ckpt.load_checkpoint(path)
        settings = _resumed_settings(settings, typed, resume_from)
    else:
        if resume:
            print(f"--resume: no checkpoint in {out} yet: starting from scratch", file=sys.stderr)
        settings = check_saved_settings(settings, task, "train", complete=True)   # only what a resume accepts
    if settings["average"] > settings["keep"]:
        raise CLIError(f"--average {settings['average']} needs that many step checkpoints kept: --keep must "
                       f"be at least {settings['average']}, got {settings['keep']}")
    plots = runs.PLOT_FILES if settings["plots"] else ()
    if resume_from is not None:                            # before any work: a trap refuses the run, not its end
        for name in ["metrics.json", *plots, ckpt.LATEST, *map(os.path.basename, ckpt.list_checkpoints(out))]:
            check_writable(os.path.join(out, name), name)
    elif not overwrite:                                    # a fresh run never writes over a file in --out
        checkpoints = ckpt.checkpoint_files(out)
        if checkpoints:
            raise CLIError(f"{out} already holds the checkpoints of a run ({os.path.basename(checkpoints[-1])} ...): "
                           f"continue it with --resume, start over with --overwrite, or choose another --out")
        present = [n for n in ("metrics.json", *plots) if os.path.lexists(os.path.join(out, n))]
        if present:
            raise CLIError(f"{out} already holds {', '.join(present)}, which this run would overwrite: start over "
                           f"with --overwrite (removes {'it' if len(present) == 1 else 'them'}), or choose another "
                           f"--out")
    return settings, out, resume_from, overwrite


def _resumed_settings(settings: dict, typed: dict, resume_from) -> dict:
    """The saved run's settings, with the RESUMABLE_OVERRIDES typed on this command line. Only typed options
    count, never the task's defaults (a plain --resume of a 6-step run would otherwise train on to 3000)."""
    saved, task = resume_from.extra.get("settings"), settings["task"]
    if not isinstance(saved, dict) or saved.get("task") != task:
        raise CLIError(f"--resume: {resume_from.path} is not a checkpoint of a `train --task {task}` run")
    check_complete(saved, task, f"checkpoint {resume_from.path}")    # its values were checked as it was read
    overrides = {k: settings[k] for k in RESUMABLE_OVERRIDES if k in typed and k not in THIS_COMMAND_ONLY}
    if "steps" in typed or "epochs" in typed:              # one replaces the other (exclusive options)
        overrides["steps"], overrides["epochs"] = settings["steps"], settings["epochs"]
    changed = [f"{k} {saved.get(k)} -> {v}" for k, v in overrides.items() if saved.get(k) != v]
    if changed:
        print(f"--resume: overriding the saved run's {', '.join(changed)}", file=sys.stderr)
    config = resume_from.config or {}
    ignored = [k for k in sorted(set(typed) - set(RESUMABLE_OVERRIDES) - {"data_dir"})
               if (settings["model"].get(MODEL_OPTIONS[k]) != config.get(MODEL_OPTIONS[k]) if k in MODEL_OPTIONS
                   else settings.get(k) != saved.get(k))]
    if ignored:
        print(f"--resume: continuing with the saved run's settings for {', '.join(ignored)}", file=sys.stderr)
    return {**OPTIONAL_SAVED, **saved, **overrides, **{k: settings[k] for k in THIS_COMMAND_ONLY},
            "data_dir": settings["data_dir"] or saved.get("data_dir")}


def _write_results(out: str, metrics: dict, trainer, data, example: list) -> list:
    """metrics.json and (unless --no-plots) the plots. -> (path, what it holds) of every file of the run."""
    write_json(os.path.join(out, "metrics.json"), metrics, "metrics")
    score = "test BLEU" if "bleu" in metrics else "held-out exact match"
    n, note = metrics["averaged"], f"the trained model (step {trainer.step}): translate or evaluate --checkpoint {out}"
    if n > 1:
        note = (f"the last model (step {trainer.step}); the score is of the mean of the last {n} step "
                f"checkpoints: translate or evaluate --checkpoint {out} --average {n}")
    written = [(os.path.join(out, "metrics.json"), f"final metrics: {score}, times, settings"),
               (os.path.join(out, ckpt.LATEST), note)]
    written += [(p, "a step checkpoint, for --resume and evaluate --average") for p in ckpt.list_checkpoints(out)]
    if metrics["settings"]["plots"]:
        written += runs.write_plots(trainer, data, example, out, metrics["task"])
    return written
