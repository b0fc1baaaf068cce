"""benchmarks/bench_tasks.py: its arguments and its verdict (the training runs themselves are the benchmark's,
not the tests': they take minutes)."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import bench_tasks


@pytest.mark.parametrize("args, message", [
    (["--tasks", "copy,revers"], "argument --tasks: expected tasks among copy, reverse, toy"),
    (["--tasks", ""], "argument --tasks"),
    (["--seeds", "x"], "argument --seeds: expected non-negative integers"),
    (["--seeds", "0,-1"], "argument --seeds"),
])
def test_bad_arguments_are_refused_before_any_run(args, message, monkeypatch, capsys):
    monkeypatch.setattr(bench_tasks, "run", lambda *a: pytest.fail("a run started"))
    with pytest.raises(SystemExit) as stop:
        bench_tasks.main(args)
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("copy_seconds, status", [(12.0, 0), (45.0, 1)])   # copy's limit: 30 s of training
def test_the_exit_status_says_whether_every_target_was_met(copy_seconds, status, monkeypatch, tmp_path, capsys):
    metrics = {"copy": {"exact_match": 1.0, "train_seconds": copy_seconds},
               "toy": {"bleu": 99.0, "train_seconds": 80.0}}
    monkeypatch.setattr(bench_tasks, "run", lambda task, seed, out: metrics[task])
    assert bench_tasks.main(["--tasks", "copy,toy", "--seeds", "0,1", "--out", str(tmp_path)]) == status
    printed = capsys.readouterr().out
    assert ("targets missed: copy seed 0, copy seed 1" in printed) == bool(status)
