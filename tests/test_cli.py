"""The command line: train writes its files, translate/evaluate read a checkpoint, bad input exits 2 cleanly."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import minitransformer as mt
from minitransformer.kit.data.tasks import exact_match
from minitransformer.kit.running import checkpoint as ck
from minitransformer.kit.running.trainer import Trainer
from minitransformer.kit.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "24", "--no-progress"]
PNG = b"\x89PNG\r\n\x1a\n"
LATEST, EXT = ck.LATEST, os.path.splitext(ck.LATEST)[1]        # the checkpoint format's own file names


def step_file(step: int) -> str:
    return f"checkpoint-{step}{EXT}"


def run_cli(*args, stdin=None):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "minitransformer", *args], env=env, capture_output=True, text=True,
                          input=stdin, timeout=120, check=False)


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """A toy-corpus run of a few steps (in this process), shared by the translate/evaluate tests."""
    out = str(tmp_path_factory.mktemp("toy"))
    code = main(["train", "--task", "toy", "--steps", "6", "--save-every", "2", "--max-tokens", "300",
                 "--limit", "4", "--out", out, "--no-plots", *SMALL])
    assert code == 0
    return out


def test_train_copy_writes_metrics_checkpoint_and_plots(tmp_path, capsys):
    out = str(tmp_path / "copy")
    assert main(["train", "--task", "copy", "--steps", "12", "--eval-every", "5", "--heldout", "20",
                 "--out", out, *SMALL]) == 0
    metrics = json.loads(Path(os.path.join(out, "metrics.json")).read_text())
    assert metrics["task"] == "copy" and metrics["steps"] == 12 and metrics["heldout"] == 20
    assert 0.0 <= metrics["exact_match"] <= 1.0
    for key in ("loss", "train_seconds", "tokens_per_second", "config", "wall_seconds"):
        assert key in metrics
    assert metrics["config"]["d_model"] == 16 and metrics["tokens_per_second"] > 0
    assert ck.load_checkpoint(os.path.join(out, LATEST)).step == 12
    for name in ("loss.png", "attention.png"):
        with open(os.path.join(out, name), "rb") as f:
            assert f.read(8) == PNG
    printed = capsys.readouterr().out
    assert "exact match (copy, 20 held-out sequences, greedy): " in printed
    assert "stopped: step limit reached (12 steps)" in printed and metrics["stopped"] == "step limit reached (12 steps)"
    # the last lines name every file of the run, by its path
    listed = printed.split("files written:\n")[1].splitlines()
    assert [line.split()[0] for line in listed] == [os.path.join(out, name) for name in (
        "metrics.json", LATEST, step_file(12), "loss.png", "attention.png", "explain.html")]


def test_train_output_names_the_metric_and_why_it_stopped(tmp_path, capsys):
    out = str(tmp_path / "copy")
    # with the progress bar (no --no-progress): an evaluation line every 3 steps
    assert main(["train", "--task", "copy", "--steps", "20", "--eval-every", "3", "--target", "0", "--heldout", "10",
                 "--no-plots", "--out", out, *[a for a in SMALL if a != "--no-progress"]]) == 0
    printed = capsys.readouterr().out
    (line,) = [line for line in printed.splitlines() if line.startswith("step 3 ")]
    assert "valid loss" in line and "valid exact match" in line and line.endswith("%") and "metric" not in line
    assert "stopped: target reached at step 3 (valid exact match" in printed and ">= 0.0%)" in printed


def test_train_chooses_the_blas_threads_and_the_environment_wins(tmp_path):
    """A model this small trains on one BLAS thread, chosen by the program; OPENBLAS_NUM_THREADS still decides
    when the user sets it. (OpenBLAS reads its variables when it starts: a fresh process each.)"""
    from minitransformer.fast import threads

    if threads.blas_threads() is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS this process can reach")
    env = {k: v for k, v in os.environ.items() if k not in threads.BLAS_ENV_VARS}
    env["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    seen = {}
    for name, extra in (("chosen", {}), ("user", {"OPENBLAS_NUM_THREADS": "2"})):
        out = str(tmp_path / name)
        proc = subprocess.run([sys.executable, "-m", "minitransformer", "train", "--task", "copy", "--steps", "2",
                               "--heldout", "5", "--no-plots", "--out", out, *SMALL], env={**env, **extra},
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        metrics = json.loads(Path(out, "metrics.json").read_text())
        seen[name] = (metrics["blas_threads"], metrics["blas_threads_set_by"])
        assert f"BLAS threads: {seen[name][0]}, " in proc.stdout
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # OpenBLAS takes at most one thread per core
    assert seen == {"chosen": (1, "minitransformer"), "user": (min(2, cores), "OPENBLAS_NUM_THREADS")}


def test_a_command_leaves_the_callers_blas_threads_as_they_were(tmp_path, monkeypatch):
    from minitransformer.fast import threads

    if threads.blas_threads() is None:
        pytest.skip("NumPy's BLAS is not an OpenBLAS this process can reach")
    for var in threads.BLAS_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    before = threads.blas_threads()
    try:
        threads.set_blas_threads(2)
        chosen = []
        real_fit = Trainer.fit
        monkeypatch.setattr(Trainer, "fit", lambda self: chosen.append(threads.blas_threads()) or real_fit(self))
        assert main(["train", "--task", "copy", "--steps", "1", "--heldout", "5", "--no-plots", "--out",
                     str(tmp_path / "copy"), *SMALL]) == 0
        assert chosen == [1] and threads.blas_threads() == 2
    finally:
        threads.set_blas_threads(before)


def test_blas_threads_fall_back_silently_without_openblas(monkeypatch):
    from minitransformer.fast import threads

    nothing = threads.threadpoolctl.ThreadpoolController().select(user_api="none")   # as with Accelerate: no BLAS found
    monkeypatch.setattr(threads, "_blas_controller", lambda: (nothing, None))
    for var in threads.BLAS_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    assert threads.blas_threads() is None and threads.set_blas_threads(1) is False
    assert threads.use_blas_threads(1) == (None, "unknown")
    with pytest.raises(ValueError, match="set_blas_threads: n must be a positive int"):
        threads.set_blas_threads(0)


@pytest.mark.parametrize("reference", [False, True])
def test_train_builds_the_fast_tier_or_with_reference_the_core(tmp_path, capsys, monkeypatch, reference):
    """train builds mt.fast.Transformer, and exactly mt.Transformer (not a subclass) with --reference; metrics.json
    says which, a resumed run keeps its tier, and evaluate decodes any checkpoint with the fast tier."""
    from minitransformer import decoding, fast

    built = []
    real_fit = Trainer.fit

    def recording_fit(self):
        built.append(type(self.model))
        return real_fit(self)

    monkeypatch.setattr(Trainer, "fit", recording_fit)
    out = str(tmp_path / "copy")
    base = ["train", "--task", "copy", "--heldout", "5", "--no-plots", "--out", out, *SMALL]
    tier = mt.Transformer if reference else fast.Transformer
    assert main(base + ["--steps", "2"] + (["--reference"] if reference else [])) == 0
    assert len(built) == 1 and built[0] is tier
    metrics = json.loads(Path(os.path.join(out, "metrics.json")).read_text())
    assert metrics["tier"] == ("reference" if reference else "fast") and metrics["settings"]["reference"] is reference

    capsys.readouterr()
    assert main(base + ["--steps", "3", "--resume"] + ([] if reference else ["--reference"])) == 0
    assert len(built) == 2 and built[1] is tier
    if not reference:
        assert "continuing with the saved run's settings for reference" in capsys.readouterr().err

    decoded_by = []
    real_greedy = decoding.greedy_decode

    def recording_greedy(model, src, **kw):
        decoded_by.append(type(model))
        return real_greedy(model, src, **kw)

    monkeypatch.setattr(decoding, "greedy_decode", recording_greedy)
    assert main(["evaluate", "--checkpoint", out]) == 0
    assert decoded_by and set(decoded_by) == {fast.Transformer}


def test_translate_and_evaluate_read_a_toy_checkpoint(toy_run, capsys, monkeypatch):
    metrics = json.loads(Path(os.path.join(toy_run, "metrics.json")).read_text())
    assert metrics["task"] == "toy" and "bleu" in metrics and metrics["sentences"] == 4
    capsys.readouterr()

    assert main(["translate", "--checkpoint", toy_run, "the dog sees the cat ."]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1

    monkeypatch.setattr(sys, "stdin", io.StringIO("the dog sees the cat .\n\na man runs .\n"))
    assert main(["translate", "--checkpoint", os.path.join(toy_run, LATEST), "--beam-size", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1] == ""              # one line out per line in, empty stays empty

    json_path = os.path.join(toy_run, "eval.json")
    assert main(["evaluate", "--checkpoint", toy_run, "--split", "test", "--limit", "3", "--json", json_path]) == 0
    assert "BLEU (toy test, 3 sentences, greedy)" in capsys.readouterr().out
    result = json.loads(Path(json_path).read_text())
    assert result["split"] == "test" and result["sentences"] == 3 and 0 <= result["bleu"] <= 100

    assert main(["evaluate", "--checkpoint", toy_run, "--limit", "3", "--average", "2", "--beam-size", "2"]) == 0
    assert "average of 2 checkpoints" in capsys.readouterr().out
    result = json.loads(Path(os.path.join(toy_run, "eval-test.json")).read_text())
    assert result["averaged"] == 2 and len(result["checkpoint"]) == 2


def test_evaluate_decodes_with_the_beam_and_alpha_it_reports(toy_run, tmp_path, capsys, monkeypatch):
    """evaluate --beam-size/--alpha reach beam search for translation and for sequence tasks, and the JSON
    says what was run: an option that is parsed and recorded must also be the one the decoder used."""
    from minitransformer import decoding

    calls = []

    def recording_beam_search(model, src, beam_size=4, alpha=0.6, **kw):
        calls.append((beam_size, alpha))
        return real_beam_search(model, src, beam_size=beam_size, alpha=alpha, **kw)

    real_beam_search = decoding.beam_search
    monkeypatch.setattr(decoding, "beam_search", recording_beam_search)    # cli and tasks look it up when they run
    json_path = str(tmp_path / "toy.json")
    assert main(["evaluate", "--checkpoint", toy_run, "--limit", "3", "--beam-size", "3", "--alpha", "1.5",
                 "--json", json_path]) == 0
    assert calls and set(calls) == {(3, 1.5)}
    assert "beam 3, alpha 1.5" in capsys.readouterr().out
    result = json.loads(Path(json_path).read_text())
    assert (result["beam_size"], result["alpha"], result["split"]) == (3, 1.5, "test")

    out = str(tmp_path / "copy")
    assert main(["train", "--task", "copy", "--steps", "2", "--heldout", "5", "--no-plots", "--out", out, *SMALL]) == 0
    calls.clear()
    assert main(["evaluate", "--checkpoint", out, "--beam-size", "2", "--alpha", "0"]) == 0
    assert calls and set(calls) == {(2, 0.0)}
    assert "exact match (copy, 5 held-out sequences, beam 2, alpha 0.0)" in capsys.readouterr().out
    result = json.loads(Path(os.path.join(out, "eval-heldout.json")).read_text())
    assert (result["beam_size"], result["alpha"], result["split"]) == (2, 0.0, "heldout")


def test_translate_copy_checkpoint_takes_ids(tmp_path, capsys):
    out = str(tmp_path / "copy")
    assert main(["train", "--task", "copy", "--steps", "2", "--heldout", "5", "--no-plots", "--out", out, *SMALL]) == 0
    capsys.readouterr()
    assert main(["translate", "--checkpoint", out, "4 5 6"]) == 0
    ids = capsys.readouterr().out.split()
    assert all(i.isdigit() for i in ids)
    assert main(["translate", "--checkpoint", out, "the dog"]) == 2
    assert "give token ids separated by spaces" in capsys.readouterr().err


def test_gradcheck_prints_a_table(capsys):
    """`minitransformer gradcheck` is the classroom's proof that every backward matches finite differences:
    a row for every layer class and every block of the model, each within the bound."""
    assert main(["gradcheck", "--max-entries", "4"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.endswith((" ok", " FAIL"))]
    labels = [row.rsplit(None, 3)[0] for row in rows]
    blocks = [name for name, c in vars(mt.model).items()
              if isinstance(c, type) and issubclass(c, mt.Module) and c.__module__ == mt.model.__name__]
    assert len(blocks) == 6                                   # EncoderLayer ... Transformer
    for name in [*mt.layers.__all__, *blocks, "CrossEntropyLoss"]:
        assert any(label == name or label.startswith(name + " (") for label in labels), name
    assert "all passed" in out
    errors = [float(row.split()[-2]) for row in rows]
    assert len(errors) == 26 and max(errors) < 1e-6 and all(row.endswith(" ok") for row in rows)


# ------------------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("args, message", [
    (["train", "--task", "nope"], "invalid choice: 'nope'"),
    (["train", "--task", "copy", "--steps", "0"], "expected an integer in [1, 1,000,000,000], got '0'"),
    (["train", "--task", "copy", "--steps", "5", "--epochs", "2"], "not allowed with argument"),
    (["train", "--task", "copy", "--dropout", "1.5"], "expected a number in [0, 0.99], got '1.5'"),
    (["evaluate", "--checkpoint", "x", "--alpha", "-1"], "argument --alpha: expected a number in [0, 10], got '-1'"),
    (["train", "--task", "copy", "--resume", "--overwrite"], "argument --overwrite: not allowed with argument --resume"),
    (["translate", "--checkpoint", "x", "--alpha", "-0.5"], "argument --alpha: expected a number in [0, 10], got '-0.5'"),
    (["train"], "the following arguments are required: --task"),
    (["evaluate", "--checkpoint", "x", "--split", "dev"], "invalid choice: 'dev'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    ([], "required: COMMAND"),
])
def test_bad_arguments_exit_2_with_usage(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: minitransformer" in err and message in err


def test_bad_arguments_in_a_subprocess_have_no_traceback():
    proc = run_cli("train", "--task", "copy", "--lr-factor", "-1")
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and "argument --lr-factor: expected a number in [1e-06, 100], got '-1'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_checkpoint_names_the_path(tmp_path):
    missing = str(tmp_path / "no-such-run")
    proc = run_cli("translate", "--checkpoint", missing, "hello")
    assert proc.returncode == 2 and missing in proc.stderr and "Traceback" not in proc.stderr


def test_damaged_checkpoint_is_refused_with_a_message(tmp_path, capsys):
    out = str(tmp_path / "copy")
    assert main(["train", "--task", "copy", "--steps", "2", "--heldout", "5", "--no-plots", "--out", out, *SMALL]) == 0
    path = os.path.join(out, LATEST)
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(path).write_bytes(bytes(data))                     # in place: the step file is another file
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", out]) == 2
    err = capsys.readouterr().err
    assert path in err and "checksum mismatch" in err


def test_resume_without_checkpoint_starts_fresh_and_resume_continues(tmp_path, capsys):
    out = str(tmp_path / "copy")
    args = ["train", "--task", "copy", "--heldout", "5", "--no-plots", "--out", out, "--eval-every", "1000", *SMALL]
    assert main(args + ["--steps", "3", "--resume"]) == 0
    assert "starting from scratch" in capsys.readouterr().err
    assert main(args + ["--steps", "5", "--resume", "--lr-factor", "3"]) == 0
    captured = capsys.readouterr()
    assert "resumed" in captured.out and "lr_factor" in captured.err          # the saved settings win
    metrics = json.loads(Path(os.path.join(out, "metrics.json")).read_text())
    assert metrics["steps"] == 5 and metrics["settings"]["lr_factor"] == 0.5


def test_fresh_run_refuses_to_mix_with_an_old_one(tmp_path, capsys):
    out = str(tmp_path / "copy")
    args = ["train", "--task", "copy", "--steps", "2", "--heldout", "5", "--no-plots", "--out", out, *SMALL]
    assert main(args) == 0
    assert main(args) == 2
    assert "already holds the checkpoints of a run" in capsys.readouterr().err
    assert main(args + ["--overwrite", "--steps", "1"]) == 0
    assert sorted(n for n in os.listdir(out) if n.endswith(EXT)) == [step_file(1), LATEST]


def test_python_dash_m_help():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "train" in proc.stdout and "gradcheck" in proc.stdout


def test_nonfinite_exit_code_is_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(mt.fast.CrossEntropyLoss, "forward", lambda self, logits, target: float("nan"))
    out = str(tmp_path / "nan")
    assert main(["train", "--task", "copy", "--steps", "3", "--heldout", "5", "--no-plots", "--out", out, *SMALL]) == 1
    err = capsys.readouterr().err
    assert "non-finite loss nan at step 1" in err and "no checkpoint was written" in err
    assert not os.path.exists(os.path.join(out, LATEST))


# ------------------------------------------------------------------------------------------ run folders

def step_files(folder):
    """The steps of the step checkpoint files in a folder, sorted."""
    return sorted(int(n[len("checkpoint-"):-len(EXT)]) for n in os.listdir(folder)
                  if n.startswith("checkpoint-") and n.endswith(EXT))


def test_plain_resume_keeps_the_runs_own_stop_and_report_settings(tmp_path, capsys):
    """Only what the user typed replaces a saved setting, never the task's defaults: otherwise a plain --resume
    of a 6-step run would train on to the default 3000 steps, saving every 500 and keeping 5."""
    out = str(tmp_path / "copy")
    base = ["train", "--task", "copy", "--heldout", "5", "--no-plots", "--out", out, *SMALL]
    assert main(base + ["--steps", "6", "--eval-every", "3", "--save-every", "3", "--keep", "2"]) == 0
    capsys.readouterr()
    assert main(base + ["--resume"]) == 0                   # the run is done: nothing more to do
    assert "overriding" not in capsys.readouterr().err
    metrics = json.loads(Path(os.path.join(out, "metrics.json")).read_text())
    assert metrics["steps"] == 6
    assert {k: metrics["settings"][k] for k in ("steps", "eval_every", "save_every", "keep")} == \
        {"steps": 6, "eval_every": 3, "save_every": 3, "keep": 2}

    assert main(base + ["--resume", "--steps", "9"]) == 0   # a typed option does override, and says so
    assert "overriding the saved run's steps 6 -> 9" in capsys.readouterr().err
    metrics = json.loads(Path(os.path.join(out, "metrics.json")).read_text())
    assert metrics["steps"] == 9 and metrics["settings"]["save_every"] == 3
    assert step_files(out) == [6, 9]                        # saved every 3 steps, the last 2 kept
    history = ck.load_checkpoint(os.path.join(out, LATEST)).extra["trainer"]["valid_history"]
    assert [row[0] for row in history] == [3, 6, 9]          # evaluated every 3 steps


def test_resume_without_checkpoint_npz_continues_from_the_newest_step_file(tmp_path, capsys):
    """The latest checkpoint deleted: --resume continues from the newest step file. Starting from scratch instead would
    put two runs in one folder, and pruning would delete the new run's files while keeping the old run's."""
    out = str(tmp_path / "copy")
    base = ["train", "--task", "copy", "--heldout", "5", "--no-plots", "--eval-every", "1000", "--out", out, *SMALL]
    assert main(base + ["--steps", "8", "--save-every", "2", "--keep", "3"]) == 0
    os.remove(os.path.join(out, LATEST))
    capsys.readouterr()
    assert main(base + ["--resume", "--steps", "10"]) == 0
    captured = capsys.readouterr()
    assert step_file(8) in captured.err and "resumed" in captured.out and "at step 8" in captured.out
    assert step_files(out) == [6, 8, 10]
    assert ck.load_checkpoint(os.path.join(out, LATEST)).step == 10
    assert json.loads(Path(os.path.join(out, "metrics.json")).read_text())["steps"] == 10


def test_overwrite_removes_the_old_run_only_once_the_new_one_is_ready(tmp_path, capsys):
    out = tmp_path / "copy"
    base = ["train", "--task", "copy", "--heldout", "5", "--no-plots", "--out", str(out), *SMALL]
    assert main(base + ["--steps", "2"]) == 0
    for name in ("loss.png", "attention.png", "explain.html", "eval-test.json", "notes.txt", f"checkpoint-best{EXT}"):
        (out / name).write_text("from before")              # the old run's plots and evaluation, the user's own
    before = sorted(os.listdir(out))
    capsys.readouterr()
    # a bad config, then missing data: refused, and nothing of the old run is lost
    assert main(base + ["--overwrite", "--heads", "3"]) == 2
    assert main(["train", "--task", "multi30k", "--data-dir", str(tmp_path / "missing"), "--out", str(out),
                 "--overwrite", *SMALL]) == 2
    assert sorted(os.listdir(out)) == before
    capsys.readouterr()
    assert main(base + ["--overwrite", "--steps", "1"]) == 0
    # the old run's files are gone (stale plots and evaluations too), the user's files stay
    assert sorted(os.listdir(out)) == [step_file(1), f"checkpoint-best{EXT}", LATEST, "metrics.json",
                                       "notes.txt"]
    assert (out / "notes.txt").read_text() == (out / f"checkpoint-best{EXT}").read_text() == "from before"
    assert json.loads((out / "metrics.json").read_text())["steps"] == 1


def test_evaluate_average_ends_at_the_named_checkpoint(tmp_path, capsys):
    out = str(tmp_path / "copy")
    assert main(["train", "--task", "copy", "--steps", "5", "--save-every", "1", "--heldout", "5", "--no-plots",
                 "--eval-every", "1000", "--out", out, *SMALL]) == 0
    json_path = str(tmp_path / "eval.json")
    assert main(["evaluate", "--checkpoint", os.path.join(out, step_file(3)), "--average", "2",
                 "--json", json_path]) == 0
    result = json.loads(Path(json_path).read_text())
    assert [os.path.basename(p) for p in result["checkpoint"]] == [step_file(2), step_file(3)]
    assert result["step"] == 3 and result["averaged"] == 2
    # the folder (or the latest checkpoint): the newest N, and the step of the newest
    assert main(["evaluate", "--checkpoint", out, "--average", "2", "--json", json_path]) == 0
    result = json.loads(Path(json_path).read_text())
    assert [os.path.basename(p) for p in result["checkpoint"]] == [step_file(4), step_file(5)]
    assert result["step"] == 5
    capsys.readouterr()
    # fewer step files up to the named one than asked for: averages those, and says so
    assert main(["evaluate", "--checkpoint", os.path.join(out, step_file(1)), "--average", "3",
                 "--json", json_path]) == 0
    assert "only 1 checkpoint" in capsys.readouterr().err
    result = json.loads(Path(json_path).read_text())
    assert [os.path.basename(p) for p in result["checkpoint"]] == [step_file(1)] and result["step"] == 1


def test_train_average_scores_the_mean_of_its_last_checkpoints(tmp_path, capsys, monkeypatch):
    """--average N: the model the final score measures holds the mean of the last N step checkpoints' weights
    (computed here from the files), the score is the one evaluate --average N gives, and the latest checkpoint stays
    the last step's, for --resume."""
    import numpy

    from minitransformer.kit.running import runs

    scored = []

    def recording_exact_match(model, heldout, **decoding):
        scored.append(model.state_dict())
        return exact_match(model, heldout, **decoding)

    monkeypatch.setattr(runs, "exact_match", recording_exact_match)
    out = str(tmp_path / "copy")
    assert main(["train", "--task", "copy", "--steps", "7", "--save-every", "2", "--average", "3", "--keep", "3",
                 "--heldout", "20", "--no-plots", "--eval-every", "1000", "--out", out, *SMALL]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads(Path(out, "metrics.json").read_text())
    assert metrics["averaged"] == 3 and metrics["averaged_steps"] == [4, 6, 7]
    assert "average of 3 checkpoints, steps 4-7" in printed and f"--checkpoint {out} --average 3" in printed
    files = [ck.load_checkpoint(os.path.join(out, step_file(step))).weights for step in (4, 6, 7)]
    (weights,) = scored
    for name, value in weights.items():
        mean = (files[0][name].astype(numpy.float64) + files[1][name] + files[2][name]) / 3
        numpy.testing.assert_allclose(value, mean, rtol=1e-6, atol=1e-7)
    assert any(not numpy.allclose(weights[k], files[2][k]) for k in weights)    # not the last model
    last = ck.load_checkpoint(os.path.join(out, LATEST))
    assert last.step == 7 and all(numpy.array_equal(last.weights[k], files[2][k]) for k in files[2])
    json_path = str(tmp_path / "eval.json")
    assert main(["evaluate", "--checkpoint", out, "--average", "3", "--json", json_path]) == 0
    assert json.loads(Path(json_path).read_text())["exact_match"] == metrics["exact_match"]


def test_train_average_above_keep_is_refused(tmp_path, capsys):
    args = ["train", "--task", "copy", "--steps", "2", "--average", "4", "--keep", "3", "--out", str(tmp_path), *SMALL]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--average 4" in err and "--keep must be at least 4, got 3" in err
    assert os.listdir(tmp_path) == []                      # refused before any work


def test_translate_average_uses_the_mean_of_the_checkpoints(toy_run, capsys):
    """translate --average N reads the same averaged model as evaluate --average N: its translations are
    those of a model loaded with the mean weights."""
    import numpy

    from minitransformer.kit.cli.common import load_run
    from minitransformer.kit.cli.translate import output_limit
    from minitransformer.kit.data.batching import translate_ids
    from minitransformer.kit.data.task_data import encode_sources

    sentence = "the dog sees the cat ."
    assert main(["translate", "--checkpoint", toy_run, "--average", "2", "--quiet", sentence]) == 0
    line = capsys.readouterr().out.strip()
    _, model, src_tok, tgt_tok, _ = load_run(toy_run)
    files = [ck.load_checkpoint(p).weights for p in ck.list_checkpoints(toy_run)[-2:]]
    model.load_state_dict({k: ((files[0][k].astype(numpy.float64) + files[1][k]) / 2).astype(files[0][k].dtype)
                           for k in files[0]})
    model.eval()
    ids = translate_ids(model, encode_sources(model, src_tok, [sentence]), length_limit=output_limit)[0]
    assert line == tgt_tok.decode(ids)


@pytest.mark.parametrize("name", ["metrics.json", "loss.png", "attention.png", "explain.html"])
def test_fresh_run_refuses_an_out_holding_a_file_it_would_write(tmp_path, capsys, name):
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_text("the user's own")
    args = ["train", "--task", "copy", "--steps", "1", "--heldout", "5", "--out", str(out), *SMALL]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert name in err and "--overwrite" in err and "another --out" in err
    assert main(args + ["--resume"]) == 2                   # nothing to resume: a fresh start, refused the same way
    assert name in capsys.readouterr().err
    assert sorted(os.listdir(out)) == [name] and (out / name).read_text() == "the user's own"


def test_fresh_run_without_plots_leaves_a_png_it_would_not_write(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "loss.png").write_text("the user's own")
    assert main(["train", "--task", "copy", "--steps", "1", "--heldout", "5", "--no-plots", "--out", str(out),
                 *SMALL]) == 0
    assert (out / "loss.png").read_text() == "the user's own"


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_out_that_is_a_file_is_an_error_naming_out(tmp_path, capsys, resume):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    assert main(["train", "--task", "copy", "--steps", "1", "--out", str(afile), *resume, *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minitransformer train: error: --out") and "is a file" in err
    assert "starting from scratch" not in err
    assert afile.read_text() == "not a folder"


def test_run_of_zero_steps_writes_its_metrics_and_no_loss_plot(tmp_path, capsys):
    out = tmp_path / "copy"
    assert main(["train", "--task", "copy", "--max-minutes", "1e-9", "--heldout", "5", "--out", str(out),
                 *SMALL]) == 0
    assert json.loads((out / "metrics.json").read_text())["steps"] == 0
    assert not (out / "loss.png").exists() and (out / "attention.png").read_bytes()[:8] == PNG
    assert "no training steps: loss.png not written" in capsys.readouterr().out


def test_model_switches_of_the_paper_reach_the_config_and_survive_a_resume(tmp_path):
    """--d-k, --d-v, --positional and --norm-first (the paper's Table 3 varies them) set the TransformerConfig; a resumed
    run keeps them."""
    out = str(tmp_path / "switches")
    args = ["train", "--task", "copy", "--heldout", "5", "--no-plots", "--no-progress", "--out", out, *SMALL]
    assert main([*args, "--steps", "2", "--d-k", "5", "--d-v", "3", "--positional", "learned",
                 "--norm-first"]) == 0
    config = json.loads((tmp_path / "switches" / "metrics.json").read_text())["config"]
    assert (config["d_k"], config["d_v"], config["positional"], config["norm_first"]) == (5, 3, "learned", True)
    assert main([*args, "--steps", "3", "--resume"]) == 0
    saved = ck.load_checkpoint(os.path.join(out, LATEST)).config
    assert (saved["d_v"], saved["positional"]) == (3, "learned")


@pytest.mark.parametrize("task", ["copy", "reverse", "toy", "multi30k"])
def test_every_tasks_defaults_are_settings_a_run_accepts(task):
    """A task's defaults pass the checks a saved run's settings get, and never average more checkpoints than
    they keep (train would refuse its own defaults)."""
    from minitransformer.kit.running.settings import check_saved_settings, task_settings

    settings = task_settings(task)
    check_saved_settings(settings, task, "defaults", complete=True)
    assert 1 <= settings["average"] <= settings["keep"]
