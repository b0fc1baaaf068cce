"""One table of limits (minitransformer/limits.py): whatever `train` accepts and saves, `--resume`, `evaluate` and
`translate` accept. Every bounded option is walked at each edge and one past it through the parser; every saved
setting through the check a resumed or evaluated run's settings get; the edges that cost little run end to end
through all four commands. The edges that would make real work huge (a batch of 65,536 sequences, 100,000 held-out
sequences, a model 8,192 wide, a BPE vocabulary of a million) are checked at the parser, the saved settings and
the checkpoint reader's config check, which is all they pass through before the work."""

import argparse
import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from minitransformer.kit import limits
from minitransformer.kit.cli import main
from minitransformer.kit.cli.parser import build_parser
from minitransformer.kit.running import checkpoint as ck
from minitransformer.kit.running import checkpoint_checks
from minitransformer.kit.running import trainer as train_module
from minitransformer.kit.running.settings import (
    MODEL_OPTIONS,
    check_saved_settings,
    task_settings,
)
from minitransformer.model import TransformerConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED = {"train": ["--task", "copy"], "translate": ["--checkpoint", "x"], "evaluate": ["--checkpoint", "x"],
            "explain": ["--checkpoint", "x", "a sentence"],
            "gradcheck": [], "download": [], "classroom grade": ["hw"], "classroom autograder": ["hw", "-o", "a.zip"]}
MODEL_SIZES = ("d_model", "num_heads", "num_encoder_layers", "d_ff", "d_k", "d_v")


def bounded_options():
    """(command, flag, dest, setting) of every option whose value the parser reads into a range of limits.py."""
    def walk(parser, command):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):          # a command's own commands too
                for name, p in action.choices.items():
                    yield from walk(p, f"{command} {name}".strip())
            elif getattr(action.type, "setting", None):
                yield command, action.option_strings[0], action.dest, action.type.setting
    return list(walk(build_parser(), ""))


def text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def edges(setting):
    """(values inside, values one past) at both ends of a setting's range."""
    low, high, ends = limits.bounds(setting)
    if setting not in limits.FLOAT_SETTINGS:
        return [low, high], [low - 1, high + 1]
    low_in, high_in = math.nextafter(low, math.inf), math.nextafter(high, -math.inf)
    inside = [low if ends[0] == "[" else low_in, high if ends[1] == "]" else high_in]
    past = [math.nextafter(low, -math.inf) if ends[0] == "[" else low,
            math.nextafter(high, math.inf) if ends[1] == "]" else high]
    return inside, past


def parse(command, flag, value):
    return build_parser().parse_args([*command.split(), *REQUIRED[command], f"{flag}={text(value)}"])


def test_every_limit_of_the_table_has_an_option():
    settings = {setting for *_, setting in bounded_options()}
    assert settings == set(limits.INT_SETTINGS) | set(limits.FLOAT_SETTINGS) | set(MODEL_SIZES)


@pytest.mark.parametrize("command, flag, dest, setting", bounded_options())
def test_each_option_takes_its_edges_and_refuses_one_past_in_one_line(command, flag, dest, setting, capsys):
    inside, past = edges(setting)
    for value in inside:
        assert getattr(parse(command, flag, value), dest) == value
    for value in past:
        with pytest.raises(SystemExit) as exit_info:
            parse(command, flag, value)
        assert exit_info.value.code == 2
        (line,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert f"argument {flag}: expected {limits.expected(setting)}, got '{text(value)}'" in line


@pytest.mark.parametrize("value", ["9" * 400, "9223372036854775808", "1e300", "-1e300", "nan", "inf", "-inf", "1e-400",
                                   "0x10", "", " "])
def test_numbers_that_would_overflow_are_refused_before_any_arithmetic(value, capsys):
    for command, flag, _, setting in bounded_options():
        if value == "1e-400" and limits.bounds(setting)[2][0] == "[" and limits.bounds(setting)[0] == 0:
            continue                                       # 1e-400 is 0.0, inside [0, ...]
        with pytest.raises(SystemExit):
            build_parser().parse_args([*command.split(), *REQUIRED[command], f"{flag}={value}"])
        err = capsys.readouterr().err
        assert f"argument {flag}: expected" in err and "Traceback" not in err


def test_a_huge_number_in_a_subprocess_is_one_line_and_exit_2():
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for args in (["train", "--task", "copy", "--d-model", "9" * 400], ["translate", "--checkpoint", "x",
                                                                        "--beam-size", "9223372036854775808"]):
        proc = subprocess.run([sys.executable, "-m", "minitransformer", *args], env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and "OverflowError" not in proc.stderr
        setting = {"--d-model": "d_model", "--beam-size": "beam_size"}[args[-2]]
        expected = (f"minitransformer {args[0]}: error: argument {args[-2]}: expected {limits.expected(setting)}, "
                    f"got '{args[-1][:60]}'")
        assert [line for line in proc.stderr.splitlines() if "error:" in line] == [expected]


# ------------------------------------------------------------------------------------------ saved settings

@pytest.mark.parametrize("command, flag, dest, setting", [o for o in bounded_options() if o[0] == "train"])
def test_what_train_accepts_a_resume_accepts(command, flag, dest, setting):
    """By construction: every value the parser takes for `train` gives settings that pass the check a resumed
    (or evaluated) run's saved settings get."""
    for task in ("copy", "toy"):
        for value in edges(setting)[0]:
            settings = task_settings(task, {dest: value})
            checked = check_saved_settings(json.loads(json.dumps(settings)), task, "saved", complete=True)
            assert checked == settings


@pytest.mark.parametrize("setting", sorted(set(limits.INT_SETTINGS) | set(limits.FLOAT_SETTINGS) | set(MODEL_SIZES)))
def test_saved_settings_take_each_edge_and_refuse_one_past(setting):
    base = task_settings("toy")
    model = setting in MODEL_SIZES or setting == "dropout"
    inside, past = edges(setting)
    for value in inside + past:
        saved = copy.deepcopy(base)
        (saved["model"] if model else saved)[setting] = value
        if value in inside:
            check_saved_settings(saved, "toy", "checkpoint x", complete=True)
        else:
            name = f"model.{setting}" if model else setting
            with pytest.raises(ValueError, match=rf"checkpoint x: settings\.{name} must be "):
                check_saved_settings(saved, "toy", "checkpoint x", complete=True)


def test_the_largest_model_train_accepts_is_one_the_reader_accepts():
    caps = {field: limits.bounds(field)[1] for field in MODEL_SIZES}
    config = TransformerConfig.preset("tiny", src_vocab_size=limits.bounds("vocab_size")[1],
                                      tgt_vocab_size=limits.bounds("vocab_size")[1], max_len=256,
                                      **{**caps, "num_decoder_layers": caps["num_encoder_layers"]})
    assert checkpoint_checks.check_config(config.to_dict(), "checkpoint x").to_dict() == config.to_dict()
    assert set(MODEL_OPTIONS.values()) - {"positional", "norm_first", "dropout"} == set(MODEL_SIZES)


# ------------------------------------------------------------------------------------------ end to end

TINY = ["--d-model", "16", "--heads", "2", "--d-ff", "24", "--no-plots", "--no-progress"]
NEAR_ONE = repr(math.nextafter(1.0, 0.0))
LEAST = repr(math.nextafter(0.0, 1.0))
RUNS = {
    "high edges": ["--task", "copy", "--seed", "1000000000", "--steps", "2", "--max-minutes", "1e7", "--target",
                   "100", "--lr-factor", "100", "--warmup", "1000000000", "--label-smoothing", NEAR_ONE, "--clip-norm",
                   "1e6", "--dropout", "0.99", "--eval-every", "1000000000", "--save-every", "1", "--keep", "1000000",
                   "--average", "1000000", "--heldout", "1", "--batch-size", "1", "--layers", "1", *TINY],
    "low edges, deep": ["--task", "copy", "--seed", "0", "--steps", "1", "--warmup", "1", "--lr-factor", "1e-06",
                        "--clip-norm", "1e-06", "--label-smoothing", "0", "--dropout", "0", "--eval-every", "1",
                        "--save-every", "1000000000", "--keep", "1", "--average", "1", "--target", "0", "--heldout",
                        "1", "--batch-size", "1", "--workers", "1", "--layers", "128", *TINY],
    "many heads": ["--task", "copy", "--steps", "1", "--heads", "1024", "--d-k", "1", "--d-model", "16",
                   "--d-ff", "65536", "--layers", "1", "--workers", "1", "--batch-size", "1", "--heldout", "1",
                   "--no-plots", "--no-progress"],
    "widest heads": ["--task", "copy", "--steps", "1000000000", "--max-minutes", LEAST, "--d-model", "2", "--heads",
                     "1", "--d-k", "8192", "--d-ff", "1", "--layers", "1", "--heldout", "1", "--no-plots"],
    "epochs, workers": ["--task", "copy", "--epochs", "1000000000", "--max-minutes", LEAST, "--workers", "1024",
                        "--layers", "1", "--heldout", "1", *TINY],
    "whole test set": ["--task", "toy", "--steps", "1", "--limit", "1000000000", "--max-tokens", "10000000",
                       "--layers", "1", *TINY],
    "widest beam": ["--task", "toy", "--steps", "1", "--limit", "1", "--beam-size", "100", "--max-tokens", "300",
                    "--vocab-size", "1000000", "--layers", "1", *TINY],
}


@pytest.mark.parametrize("name", list(RUNS))
def test_a_run_at_the_edges_trains_resumes_evaluates_and_translates(name, tmp_path):
    out = str(tmp_path / "run")
    args = RUNS[name]
    assert main(["train", *args, "--out", out]) == 0
    metrics = json.loads(Path(out, "metrics.json").read_text())
    typed = vars(build_parser().parse_args(["train", *args]))
    for dest, value in typed.items():                       # saved as given (target: as a fraction for copy)
        if value is not None and dest in MODEL_OPTIONS:
            assert metrics["config"][MODEL_OPTIONS[dest]] == value, dest
        elif value is not None and dest in metrics["settings"]:
            assert metrics["settings"][dest] == (value / 100 if dest == "target" and typed["task"] == "copy"
                                                 else value), dest
    # a resume accepts the saved edges (and stops at once: --max-minutes at its lowest)
    assert main(["train", *args, "--out", out, "--resume", "--max-minutes", LEAST]) == 0
    # the decoding options at their highest; at their lowest for the deep model, where a beam of 100 costs most
    decoding = ["--beam-size", "100", "--alpha", "10", "--average", "1000000", "--limit", "1000000000"]
    if "128" in args:
        decoding = ["--beam-size", "1", "--alpha", "0", "--average", "1", "--limit", "1"]
    if typed["task"] == "toy":                             # a beam of 100 over one test sentence, not 500
        decoding[-1] = "1"
    assert main(["evaluate", "--checkpoint", out, *decoding]) == 0
    line = "4 5 6" if typed["task"] == "copy" else "the dog sees the cat ."
    assert main(["translate", "--checkpoint", out, *decoding[:-2], "--quiet", line]) == 0


# ------------------------------------------------------------------------------------------ bounded history

def test_a_runs_history_stays_bounded_and_a_resume_thins_it_the_same(tmp_path, monkeypatch):
    """Past HISTORY_ROWS rows the history keeps evenly spaced rows (and the newest), decided by the step alone: a run
    of any length stores bounded metadata, and a resumed run holds exactly the uninterrupted run's rows."""
    monkeypatch.setattr(train_module, "HISTORY_ROWS", 4)
    monkeypatch.setattr(train_module, "RECENT_ROWS", 2)
    base = ["train", "--task", "copy", "--heldout", "1", "--eval-every", "1", "--layers", "1", *TINY]
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    assert main([*base, "--steps", "40", "--out", whole]) == 0
    assert main([*base, "--steps", "23", "--out", split]) == 0
    assert main([*base, "--steps", "40", "--out", split, "--resume"]) == 0
    states = [ck.load_checkpoint(os.path.join(out, ck.LATEST)).extra["trainer"] for out in (whole, split)]
    for key, exact in (("history", 3), ("valid_history", 3)):      # a history row's 4th column is a speed
        rows = numpy.array(states[0][key])
        steps = rows[:, 0].tolist()
        # bounded (HISTORY_ROWS on the stride, RECENT_ROWS newest), spread over the whole run: the first row kept
        # lies within the first half
        assert 2 <= len(rows) <= 4 + 2 and steps[-1] == 40 and steps[0] <= 40 / 2, (key, steps)
        assert steps == sorted(set(steps)), steps
        assert numpy.array_equal(rows[:, :exact], numpy.array(states[1][key])[:, :exact]), key
