"""The command line a new user meets: translate answers each line as it arrives and says when the input looks like
the language the model writes; --version; every command describes itself; train --help lists each task's
defaults; --target in the unit the run prints; --no-progress hides only the bar."""

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

import minitransformer as mt
from minitransformer.kit.cli import main
from minitransformer.kit.cli.parser import build_parser
from minitransformer.kit.data import datasets
from minitransformer.kit.running.settings import TASK_DEFAULTS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "24", "--no-progress", "--no-plots"]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("toy"))
    assert main(["train", "--task", "toy", "--steps", "4", "--max-tokens", "300", "--limit", "2", "--out", out,
                 *SMALL]) == 0
    return out


def translate_process(run):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OPENBLAS_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "minitransformer", "translate", "--checkpoint", run, "--quiet"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def test_translate_prints_each_line_as_soon_as_it_arrives(toy_run):
    """A user typing one sentence at a time sees each translation before typing the next: the second line is
    sent only once the first translation has been read."""
    proc = translate_process(toy_run)
    try:
        proc.stdin.write("the dog sees the cat .\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "no translation within 120 s of the first line while standard input stays open"
        first = proc.stdout.readline()
        assert first.endswith("\n") and first.strip()
        proc.stdin.write("a man runs .\n")
        proc.stdin.close()
        rest = proc.stdout.read().splitlines()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
        assert len(rest) == 1 and rest[0].strip()
    finally:
        proc.kill()
        proc.wait()


def test_input_in_the_target_language_gets_one_hint(toy_run, capsys, monkeypatch):
    import io

    german = [t for _, t in datasets.load_toy("train")[:2]]
    english = [s for s, _ in datasets.load_toy("train")[:2]]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(german) + "\n"))
    capsys.readouterr()
    assert main(["translate", "--checkpoint", toy_run]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2
    hints = [line for line in captured.err.splitlines() if "language this model translates into" in line]
    assert hints == [hints[0]] and hints[0].startswith("line 1: ")      # once, not once per line
    assert main(["translate", "--checkpoint", toy_run, *english]) == 0
    assert "language this model translates into" not in capsys.readouterr().err
    assert main(["translate", "--checkpoint", toy_run, "--quiet", german[0]]) == 0
    assert capsys.readouterr().err == ""


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"minitransformer {mt.__version__}\n"


def test_every_command_describes_itself_and_no_help_points_into_the_source():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert set(sub.choices) >= {"train", "translate", "evaluate", "gradcheck", "download"}
    for name, command in sub.choices.items():
        assert command.description and len(command.description) > 40, name
        text = command.format_help()
        for source in (".py", "datasets.", "multi30k_dir", "kit/", "kit."):
            assert source not in text, (name, source)


def test_every_command_describes_itself_under_python_dash_OO():
    """python -OO strips docstrings: a description taken from one would be None there."""
    code = ("import json; from minitransformer.kit.cli.parser import build_parser\n"
            "(sub,) = [a for a in build_parser()._actions if a.dest == 'command']\n"
            "print(json.dumps({name: command.description for name, command in sub.choices.items()}))")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-OO", "-c", code], env=env, capture_output=True, text=True, check=True)
    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    assert json.loads(done.stdout) == {name: command.description for name, command in sub.choices.items()}


def test_train_help_lists_each_tasks_defaults():
    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    text = sub.choices["train"].format_help()
    blocks = text.split("each task's defaults")[1]
    for task, expected in (("copy", ["--preset tiny", "--d-model 32", "--layers 1", "--steps 3000", "--target 100"]),
                           ("toy", ["--dropout 0.1", "--max-tokens 2000", "--target 99.0"]),
                           ("multi30k", ["--preset small", "--epochs 20", "--average 4", "--vocab-size 8000",
                                         "--max-minutes 43.0"])):
        block = blocks.split(f"\n  {task} ")[1].split("\n  ")[0:3]
        for option in expected:
            assert any(option in line for line in block), (task, option)
    for task, defaults in TASK_DEFAULTS.items():           # every entry of the table, in its option's words
        for key, value in defaults.items():
            if key not in ("model", "preset") and value is not None:
                assert f"--{key.replace('_', '-')} {value}" in blocks.replace("\n           ", ""), (task, key)


def test_target_is_in_the_unit_the_run_prints(tmp_path, capsys):
    """copy prints exact match in percent: --target 80 means 80% (kept as the fraction 0.8); toy prints BLEU."""
    out = str(tmp_path / "copy")
    assert main(["train", "--task", "copy", "--steps", "3", "--eval-every", "1", "--target", "0", "--heldout", "5",
                 "--out", out, *SMALL]) == 0
    assert "stopped: target reached at step 1" in capsys.readouterr().out
    out = str(tmp_path / "copy80")
    assert main(["train", "--task", "copy", "--steps", "1", "--target", "80", "--heldout", "5", "--out", out,
                 *SMALL]) == 0
    assert json.loads(Path(out, "metrics.json").read_text())["settings"]["target"] == 0.8
    with pytest.raises(SystemExit):
        main(["train", "--task", "copy", "--target", "101"])
    assert "argument --target: expected a number in [0, 100], got '101'" in capsys.readouterr().err


def test_no_progress_hides_the_bar_not_the_validation_lines(tmp_path, capsys):
    out = str(tmp_path / "copy")
    assert main(["train", "--task", "copy", "--steps", "4", "--eval-every", "2", "--label-smoothing", "0.1",
                 "--heldout", "5", "--out", out, *SMALL]) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["2", "4"]
    assert all("valid loss " in line and "(with label smoothing 0.1)" in line and "valid exact match" in line
               for line in lines)
    assert "step/s" not in captured.err and "it/s" not in captured.err      # no bar
