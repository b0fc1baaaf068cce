"""Training on key-value retrieval, shared by attention_variants.py and no_softmax.py.

The task: n (key, value) pairs with distinct keys, and m queries, each a key among them; the answer is that
key's value. The model (models.Retrieval) can only answer through its one attention layer, so how well and
how fast it learns is a measurement of the scoring function. Chance is 1 / num_values.
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy
import resumable
from common import progress, summary
from models import Retrieval, retrieval_batch

import minitransformer as mt

RETRIEVAL = {"n": 32, "m": 8, "num_keys": 128, "num_values": 32, "d_model": 64, "batch": 64, "lr": 1e-3,
             "steps": 600, "eval_every": 25, "eval_examples": 256, "probe_examples": 64, "target_accuracy": 0.9}
QUICK_RETRIEVAL = dict(RETRIEVAL, n=8, m=2, num_keys=32, num_values=8, steps=30, eval_every=10,
                       eval_examples=64, probe_examples=16)


def train(kind: str, d_k: int, seed: int, s: dict, bar=None) -> dict:
    """Train one model; return its curves (evaluated every eval_every steps and at step 0) and its costs.

    accuracy, loss      on a fixed held-out set (the same for every run)
    max_weight          mean over queries of the largest attention weight (largest |weight| without softmax),
                        held-out set: how close to one-hot (saturated) the attention is
    score_grad          mean |dL/dscore| at the softmax's input (the weights' input without softmax) on a
                        fixed batch: the gradient that reaches the scores, which saturation makes vanish
    ms_per_step         wall time of a training step (forward, backward, Adam), evaluation excluded
    peak_bytes_per_step what NumPy allocated at the peak of one forward + backward (tracemalloc), above the
                        memory in use before it: the activations, the attention's intermediates, the gradients
    """
    mt.manual_seed(seed)
    model = Retrieval(s["num_keys"], s["num_values"], s["d_model"], d_k, kind)
    opt = mt.optim.Adam(model.parameters(), lr=s["lr"])
    loss_fn = mt.CrossEntropyLoss(ignore_index=-1)             # every query counts
    data = numpy.random.default_rng(seed)
    shape = (s["n"], s["m"], s["num_keys"], s["num_values"])
    held_out = retrieval_batch(numpy.random.default_rng(10_000), s["eval_examples"], *shape)
    probe = retrieval_batch(numpy.random.default_rng(20_000), s["probe_examples"], *shape)

    curves = {"step": [], "accuracy": [], "loss": [], "max_weight": [], "score_grad": []}

    def evaluate(step):
        model.eval()
        logits = model(*held_out[:3])                          # (E,m,V)
        curves["step"].append(step)
        curves["accuracy"].append(float((logits.argmax(axis=-1) == held_out[3]).mean()))
        curves["loss"].append(loss_fn(logits, held_out[3]))
        curves["max_weight"].append(float(numpy.abs(model.attention.attn).max(axis=-1).mean()))
        model.train()
        loss_fn(model(*probe[:3]), probe[3])
        model.backward(loss_fn.backward())
        curves["score_grad"].append(float(numpy.abs(model.score_grad).mean()))
        model.zero_grad()

    evaluate(0)
    seconds = 0.0
    for step in range(1, s["steps"] + 1):
        keys, values, queries, targets = retrieval_batch(data, s["batch"], *shape)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(keys, values, queries), targets)
        model.backward(loss_fn.backward())
        opt.step()
        seconds += time.perf_counter() - t0
        if step % s["eval_every"] == 0 or step == s["steps"]:
            evaluate(step)
        if bar is not None:
            bar.update()
    tracemalloc.start()                                        # one more forward + backward, its memory traced
    base = tracemalloc.get_traced_memory()[0]
    loss_fn(model(keys, values, queries), targets)
    model.backward(loss_fn.backward())
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    reached = [st for st, a in zip(curves["step"], curves["accuracy"]) if a >= s["target_accuracy"]]
    return {"kind": kind, "d_k": d_k, "seed": seed, **curves, "ms_per_step": 1e3 * seconds / s["steps"],
            "peak_bytes_per_step": int(peak),
            "final_accuracy": curves["accuracy"][-1], "final_loss": curves["loss"][-1],
            "steps_to_target": reached[0] if reached else None}


def steps_or_censored(run: dict, s: dict) -> int:
    """The steps to the target accuracy; a run that never got there counts as one evaluation past the end."""
    return run["steps_to_target"] if run["steps_to_target"] is not None else s["steps"] + s["eval_every"]


def aggregate(runs: list, kinds, d_ks) -> dict:
    """Per (kind, d_k): mean and spread over seeds of the final figures and the curves."""
    out = {}
    for kind in kinds:
        for d_k in d_ks:
            group = [r for r in runs if r["kind"] == kind and r["d_k"] == d_k]
            if not group:
                continue
            reached = [r["steps_to_target"] for r in group]

            curve = {key: numpy.mean([r[key] for r in group], axis=0).tolist()
                     for key in ("accuracy", "loss", "max_weight", "score_grad")}
            out[f"{kind}/{d_k}"] = {
                "kind": kind, "d_k": d_k, "seeds": len(group), "final_accuracy": summary([r["final_accuracy"] for r in group]),
                "final_loss": summary([r["final_loss"] for r in group]),
                "ms_per_step": summary([r["ms_per_step"] for r in group]),
                "peak_bytes_per_step": summary([r["peak_bytes_per_step"] for r in group]),
                "steps_to_target": reached, "reached_target": sum(x is not None for x in reached),
                "steps_to_target_mean": None if None in reached else float(numpy.mean(reached)),
                "max_weight_at_init": float(numpy.mean([r["max_weight"][0] for r in group])),
                "score_grad_at_init": float(numpy.mean([r["score_grad"][0] for r in group])),
                "step": group[0]["step"], "mean_curves": curve}
    return out


def mean_loss(run: dict) -> float:
    """The held-out loss averaged over every evaluation of a run, step 0 included: what the tuning minimises (the
    area under the loss curve: how soon a rate learns and whether it stays learned both count)."""
    return float(numpy.mean(run["loss"]))


def choose_lr(tuning: list, s: dict) -> tuple:
    """The rate of one arm from its tuning runs: the lowest mean_loss averaged over the tuning seeds; rates within
    s["tie"] (relative) of the lowest are tied and the smallest of them is taken. -> (rate, {rate: score}, tied)."""
    scores = {lr: float(numpy.mean([mean_loss(r) for r in tuning if r["lr"] == lr])) for lr in s["lrs"]}
    best = min(scores.values())
    tied = [lr for lr, v in scores.items() if v <= best * (1 + s["tie"])]
    return min(tied), scores, len(tied) > 1


def _key(kind: str, d_k: int, lr: float, seed: int, tuning: bool) -> str:
    return f"{kind.replace(':', '_')}-dk{d_k}-lr{lr:g}-{'t' if tuning else 's'}{seed}"


def _train_job(job: dict) -> dict:
    run = train(job["kind"], job["d_k"], job["seed"], dict(job["s"], lr=job["lr"]))
    return {**run, "lr": job["lr"], "mean_loss": mean_loss(run)}


def run_tuned(s: dict, arms: list, folder=None, log=print) -> dict:
    """Every arm (kind, d_k): its tuning runs (each rate of s["lrs"] on each of s["tune_seeds"]), its rate
    (choose_lr), then its compared seeds at that rate. Each run is stored in folder/finished/ and skipped when run
    again (resumable.py), so the study resumes where it stopped; no folder: a temporary one.
    -> {"runs", "tuning" (the tuning runs without their curves), "lrs" {kind/d_k: rate}, "scores", "ties"}"""
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            return run_tuned(s, arms, Path(tmp), log)
    out = {"runs": [], "tuning": [], "lrs": {}, "scores": {}, "ties": []}
    for kind, d_k in arms:
        jobs = [(_key(kind, d_k, lr, seed, True), {"s": s, "kind": kind, "d_k": d_k, "lr": lr, "seed": seed})
                for lr in s["lrs"] for seed in s["tune_seeds"]]
        resumable.run_pending(jobs, _train_job, folder, log=log)
        tuned = list(resumable.collect(folder, [k for k, _ in jobs]).values())
        lr, scores, tied = choose_lr(tuned, s)
        arm = f"{kind}/{d_k}"
        out["lrs"][arm], out["scores"][arm] = lr, {f"{k:g}": v for k, v in scores.items()}
        out["ties"] += [arm] if tied else []
        out["tuning"] += [{k: r[k] for k in ("kind", "d_k", "lr", "seed", "steps_to_target", "final_loss",
                                              "final_accuracy", "mean_loss")} for r in tuned]
        jobs = [(_key(kind, d_k, lr, seed, False), {"s": s, "kind": kind, "d_k": d_k, "lr": lr, "seed": seed})
                for seed in s["seeds"]]
        resumable.run_pending(jobs, _train_job, folder, log=log)
        out["runs"] += [{k: v for k, v in r.items() if k not in ("key", "finished")}
                        for r in resumable.collect(folder, [k for k, _ in jobs]).values()]
    return out
