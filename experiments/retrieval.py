"""Training on key-value retrieval, shared by attention_variants.py and no_softmax.py.

The task: n (key, value) pairs with distinct keys, and m queries, each a key among them; the answer is that
key's value. The model (models.Retrieval) can only answer through its one attention layer, so how well and
how fast it learns is a measurement of the scoring function. Chance is 1 / num_values.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy
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


def run_grid(s: dict, title: str, labels: dict, show_progress: bool = True) -> dict:
    """Train every (kind, d_k, seed) of the settings ``s``, one progress bar over all their steps; the runs, their
    summary per kind and d_k, and the labels of the kinds."""
    jobs = [(kind, d_k, seed) for d_k in s["d_ks"] for kind in s["kinds"] for seed in s["seeds"]]
    bar = progress(len(jobs) * s["steps"], title, disable=not show_progress)
    runs = []
    for kind, d_k, seed in jobs:
        bar.set_postfix_str(f"{kind} d_k={d_k} seed={seed}")
        runs.append(train(kind, d_k, seed, s, bar))
    bar.close()
    return {"runs": runs, "summary": aggregate(runs, s["kinds"], s["d_ks"]), "labels": labels}
