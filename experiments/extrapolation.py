"""Positional extrapolation: trained on lengths 1..L, tested on 1..2L, with sinusoidal or learned positions.

§3.5 chooses the sinusoids over a learned table, which performed about as well (Table 3, row E), "because it
may allow the model to extrapolate to sequence lengths longer than the ones encountered during training".
Here copy and reverse (``minitransformer.kit.data.tasks``) are trained with source lengths 1..L (L = 10, the symbol
model of ``train --task copy``, its settings unchanged) and tested per length n = 1..2L on 200 fresh strings
each: exact match of the greedy decoding, the mean length of what it writes, and, at n = 2L, the token
accuracy at each target position under teacher forcing (where along the sequence it goes wrong).

Both models hold 2L + 2 positions (config.max_len): a source of 2L symbols, and the decoder's <bos>, 2L
symbols and room for the <eos>. A learned table's row p is initialised like the token embeddings, from
N(0, d_model^-0.5), and only rows that occur in a training batch ever get a gradient: source rows 0..L-1 and
target rows 0..L (<bos> + L symbols). Every other row keeps its random initial value to the bit (Adam's step
for a parameter entry whose gradient was always zero is 0 / (0 + eps) = 0), which the script checks and
reports: beyond L the model reads positions it has never seen, drawn at random.

    python experiments/extrapolation.py            # about 7 CPU-minutes: 4 minutes on 2 cores
    python experiments/extrapolation.py --quick    # seconds
"""

from __future__ import annotations

import sys
from dataclasses import replace

import common  # first: it sets the BLAS threads before NumPy loads
import numpy
import training

import minitransformer as mt
from minitransformer.decoding import greedy_decode
from minitransformer.kit.data.task_data import task_data
from minitransformer.kit.data.tasks import (
    SequenceTask,
    TaskBatches,
    exact_match,
    heldout_batches,
)
from minitransformer.kit.running.runs import tier
from minitransformer.kit.running.trainer import unpack_batch

NAME = "extrapolation"
KINDS = ("sinusoidal", "learned")
TEST_SEED = 2_000_003          # the test strings: the same for every run, drawn apart from training's
PROTOCOL = common.protocol(NAME)
SETTINGS = PROTOCOL["settings"]
QUICK = {"tasks": ["copy"], "L": 4, "kinds": list(KINDS), "seeds": [0], "steps": {"copy": 150}, "per_length": 40}


def test_pairs(task: str, length: int, n: int) -> list:
    """``n`` random (src, tgt) pairs of the task with sources of exactly ``length`` symbols."""
    seq = SequenceTask(task, min_len=length, max_len=length)
    return seq.sample(numpy.random.default_rng([TEST_SEED, length]), n)


def run_data(settings: dict, L: int):
    """The task's data as `train` builds it, with training lengths 1..L and 2L + 2 positions in the model."""
    seq = SequenceTask(settings["task"], max_len=L)
    data = task_data(settings)
    heldout = seq.heldout(settings["heldout"])
    return replace(data, config=replace(data.config, max_len=2 * L + 2),
                   train_data=TaskBatches(seq, batch_size=settings["batch_size"], seed=settings["seed"]),
                   valid_batches=heldout_batches(heldout), heldout=heldout)


def position_accuracy(model, pairs: list) -> numpy.ndarray:
    """Teacher-forced accuracy of the next token at each target position, over ``pairs`` of equal length
    (the last position is the <eos>).                                        Returns (T,) with T = len(tgt) + 1"""
    batch = heldout_batches(pairs, batch_size=len(pairs))[0]
    src, tgt_in, tgt_out, _ = unpack_batch(batch)
    model.eval()
    logits = mt.backend.to_numpy(model(src, tgt_in))                                  # (B,T,V)
    return (logits.argmax(-1) == numpy.asarray(tgt_out)).mean(axis=0)                 # (T,)


def learned_rows(model, initial, L: int) -> dict:
    """How far each learned position row moved from its initial value in training: the largest change over
    the rows training used (source 0..L-1, target 0..L) and over the rows it never used (the rest)."""
    out = {}
    for side, used in (("src", L), ("tgt", L + 1)):
        now = mt.backend.to_numpy(getattr(model, f"{side}_pos").P.data)              # (max_len, D)
        moved = numpy.abs(now - initial[side]).max(axis=1)                             # (max_len,)
        out[side] = {"rows_used": used, "rows": len(moved), "max_change_used": float(moved[:used].max()),
                     "max_change_unused": float(moved[used:].max()),
                     "norm_used": float(numpy.linalg.norm(now[:used], axis=1).mean()),
                     "norm_unused": float(numpy.linalg.norm(now[used:], axis=1).mean())}
    return out


def one_run(job: dict) -> dict:
    """Train one (task, positional kind, seed) and test it at every length 1..2L."""
    L = job["L"]
    settings = training.settings_for(job["task"], positional=job["kind"], seed=job["seed"], steps=job["steps"])
    data = run_data(settings, L)
    initial = None
    if job["kind"] == "learned":
        # train() seeds and builds the model first thing, so the same seed and config give its initial weights
        mt.backend.manual_seed(job["seed"])
        fresh = tier(False)[0](data.config)
        initial = {side: mt.backend.to_numpy(getattr(fresh, f"{side}_pos").P.data).copy() for side in ("src", "tgt")}
    (trainer, data), seconds = training.timed(training.train, settings, data)
    model = trainer.model
    lengths = list(range(1, 2 * L + 1))
    exact, out_len = [], []
    for n in lengths:
        pairs = test_pairs(job["task"], n, job["per_length"])
        exact.append(exact_match(model, pairs))
        src = numpy.array([s for s, _ in pairs], dtype=numpy.int64)                  # (B,n)
        out_len.append(float(numpy.mean([len(h) for h in greedy_decode(model, src, max_len=n + 2)])))
    longest = test_pairs(job["task"], 2 * L, job["per_length"])
    result = {**{k: job[k] for k in ("task", "kind", "seed", "steps")}, "lengths": lengths,
              "exact_match": exact, "output_length": out_len, "final_loss": trainer.summary()["loss"],
              "heldout_exact_match": exact_match(model, data.heldout[:500]),
              "position_accuracy_2L": position_accuracy(model, longest).tolist(), "train_seconds": seconds}
    if initial is not None:
        result["learned_rows"] = learned_rows(model, initial, L)
    return result


def run(s, progress=True) -> dict:
    jobs = [{"task": task, "kind": kind, "seed": seed, "L": s["L"], "steps": s["steps"][task],
             "per_length": s["per_length"]} for task in s["tasks"] for seed in s["seeds"] for kind in s["kinds"]]
    with common.progress(len(jobs), "extrapolation runs", disable=not progress) as bar:
        runs = training.run_many(one_run, jobs, bar)
    return summarize(runs, s)


def summarize(runs: list, s: dict) -> dict:
    """Per task and kind, the exact match over seeds (per length; the seen lengths 1..L, length L + 1 and the
    unseen lengths L+1..2L as one figure per seed), the greedy output length beyond L and the teacher-forced
    accuracy per position at 2L; and the comparisons, from the runs alone."""
    L = s["L"]
    summary = {}
    for task in s["tasks"]:
        for kind in s["kinds"]:
            mine = [r for r in runs if r["task"] == task and r["kind"] == kind]
            em = numpy.array([r["exact_match"] for r in mine])                       # (seeds, 2L)
            out_len = numpy.array([r["output_length"] for r in mine])[:, L:]         # (seeds, L)
            pos = numpy.array([r["position_accuracy_2L"] for r in mine]).mean(0)     # (2L+1,)
            summary[f"{task}/{kind}"] = {
                "seeds": [r["seed"] for r in mine],
                "exact_match_mean": em.mean(0).tolist(), "exact_match_min": em.min(0).tolist(),
                "exact_match_max": em.max(0).tolist(),
                "seen_lengths": common.summary(em[:, :L].mean(1)),
                "unseen_lengths": common.summary(em[:, L:].mean(1)),
                "at_L_plus_1": common.summary(em[:, L]),
                "output_length_unseen": common.summary(out_len.ravel()),
                "teacher_forced_2L_seen": common.summary(pos[:L]),
                "teacher_forced_2L_unseen": common.summary(pos[L:2 * L]),
            }
    return {"runs": runs, "summary": summary, "comparisons": comparisons(runs, s)}


def comparisons(runs: list, s: dict) -> dict:
    """Sinusoidal against learned positions, paired by seed, per task: on the lengths seen in training (the
    claim, Table 3 row E: about as well, exact match within +-0.02) and beyond them (the claim, §3.5: the
    sinusoids extrapolate further), at length L + 1 and over L+1..2L."""
    import stats

    L = s["L"]
    parts = {f"lengths 1..{L}": (slice(0, L), 0, "about as well on seen lengths"),
             f"length {L + 1}": (slice(L, L + 1), 1, "sinusoids extrapolate further"),
             f"lengths {L + 1}..{2 * L}": (slice(L, 2 * L), 1, "sinusoids extrapolate further")}
    out = {}
    for task in s["tasks"]:
        arms = {kind: {r["seed"]: r["exact_match"] for r in runs if r["task"] == task and r["kind"] == kind}
                for kind in ("learned", "sinusoidal")}
        for part, (where, expected, claim) in parts.items():
            a, b = ({"exact_match": {seed: float(numpy.mean(em[where])) for seed, em in arms[kind].items()}}
                    for kind in ("learned", "sinusoidal"))
            out[f"{task}: sinusoidal - learned, {part}"] = {
                "claim": claim, "formats": {"exact_match": "+.3f"},
                **stats.compare(a, b, {"exact_match": (expected, PROTOCOL["margins"]["exact_match"])},
                                PROTOCOL["bounds"])}
    return stats.correct(out)


def figures(payload) -> dict:
    s, res = payload["settings"], payload["results"]
    L, tasks = s["L"], s["tasks"]
    fig, axes = common.new_figure(len(tasks), width=4.6, height=3.4)
    diag, daxes = common.new_figure(len(tasks), 2, width=4.6, height=3.0)
    daxes = daxes.reshape(2, len(tasks))
    for t, task in enumerate(tasks):
        ax = axes[t]
        for i, kind in enumerate(s["kinds"]):
            mine = [r for r in res["runs"] if r["task"] == task and r["kind"] == kind]
            lengths = mine[0]["lengths"]
            em = numpy.array([r["exact_match"] for r in mine])                       # (seeds, 2L)
            ax.plot(lengths, em.mean(0), "o-", ms=3, color=f"C{i}", label=f"{kind} (mean of {len(mine)} seeds)")
            ax.fill_between(lengths, em.min(0), em.max(0), color=f"C{i}", alpha=0.2, lw=0)
            out_len = numpy.array([r["output_length"] for r in mine]).mean(0)
            daxes[0, t].plot(lengths, out_len, "o-", ms=3, color=f"C{i}", label=kind)
            pos = numpy.array([r["position_accuracy_2L"] for r in mine])              # (seeds, 2L+1)
            daxes[1, t].plot(numpy.arange(1, pos.shape[1] + 1), pos.mean(0), "o-", ms=3, color=f"C{i}", label=kind)
            daxes[1, t].fill_between(numpy.arange(1, pos.shape[1] + 1), pos.min(0), pos.max(0), color=f"C{i}",
                                     alpha=0.2, lw=0)
        ax.axvspan(L + 0.5, 2 * L + 0.5, color="grey", alpha=0.1, label="lengths never trained on")
        ax.set(title=f"{task}: trained on lengths 1..{L}", xlabel="source length", ylabel="exact match",
               ylim=(-0.02, 1.02))
        daxes[0, t].plot(lengths, lengths, ":", color="grey", lw=1, label="the target's length")
        daxes[0, t].set(title=f"{task}: mean length of the greedy output", xlabel="source length",
                        ylabel="output tokens")
        daxes[1, t].set(title=f"{task}, length {2 * L}: teacher-forced accuracy", xlabel="target position "
                        f"({2 * L + 1} = <eos>)", ylabel="token accuracy", ylim=(-0.02, 1.02))
        for a in (ax, daxes[0, t], daxes[1, t]):
            a.axvline(L + 0.5, color="grey", lw=0.8, ls="--")
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
    return {"exact_match": fig, "diagnostics": diag}


if __name__ == "__main__":
    common.main(sys.modules[__name__])
