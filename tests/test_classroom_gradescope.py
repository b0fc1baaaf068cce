"""Gradescope's autograder as Gradescope runs it: the zip unpacked into a root laid out as Gradescope lays it out,
setup.sh run in a fresh virtual environment (the wheel inside the zip installed), run_autograder on each way a
student uploads: the solutions, a blank copy, loose files, a folder, a zip, nothing at all."""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from minitransformer.kit.classroom import gradescope
from minitransformer.kit.classroom.maker import PACKAGE, make
from minitransformer.kit.cli import main

SEED = 4242


def test_diagnoses_show_when_the_teacher_says_and_the_seed_never():
    results = {"score": 10, "seed": SEED, "flags": {"linear": ["identical to the reference solution"]}, "notes": [],
               "output": f"graded with seed {SEED}", "files": {"layers/linear.py": "linear.py"},
               "tests": [{"name": "part 1: linear", "score": 10, "max_score": 10, "status": "passed", "output": "ok"},
                         {"name": "part 1: relu", "score": 0, "max_score": 10, "status": "failed",
                          "output": "your dx is wrong"}]}
    shown = gradescope.for_students(results, "after_due_date")
    assert [(t["name"], t["score"], t["max_score"], t["visibility"]) for t in shown["tests"]] == [
        ("part 1: linear", 10, 10, "visible"), ("part 1: relu", 0, 10, "visible"),
        ("part 1: relu: diagnosis", 0, 0, "after_due_date"), ("for the teacher", 0, 0, "hidden")]
    assert shown["tests"][1]["output"] == "failed; the diagnosis shows after the due date"
    assert shown["tests"][2]["output"] == "your dx is wrong" and shown["extra_data"]["seed"] == SEED
    visible = json.dumps([shown["output"], [t for t in shown["tests"] if t["visibility"] != "hidden"]])
    assert str(SEED) not in visible and "identical" not in visible
    assert [t["visibility"] for t in gradescope.for_students(results, "visible")["tests"]][:2] == ["visible"] * 2


def test_bad_options_get_a_one_line_error(tmp_path, capsys):
    make(tmp_path / "hw", "relu")
    assert main(["classroom", "autograder", str(tmp_path / "hw"), "-o", str(tmp_path / "a.tar")]) == 2
    assert "-o must name a .zip file, got" in capsys.readouterr().err
    assert main(["classroom", "autograder", str(tmp_path / "nowhere"), "-o", str(tmp_path / "a.zip")]) == 2
    assert "holds no assignment.json" in capsys.readouterr().err


@pytest.fixture(scope="module")
def gradescope_root(tmp_path_factory):
    """(the unpacked zip, the virtual environment setup.sh installed into, the assignment, its solutions)."""
    root = tmp_path_factory.mktemp("gradescope")
    make(root / "hw1", ["linear", "relu"])
    make(root / "hw1-solutions", ["linear", "relu"], solutions=True)
    assert main(["classroom", "autograder", str(root / "hw1"), "-o", str(root / "autograder.zip"), "--seed",
                 str(SEED), "--visibility", "after_due_date"]) == 0
    with zipfile.ZipFile(root / "autograder.zip") as z:
        z.extractall(root / "source")
    for script in ("setup.sh", "run_autograder"):                 # extractall drops the mode bits Gradescope keeps
        (root / "source" / script).chmod(0o755)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(root / "venv")], check=True)
    env = {**environment(root), "PIP_NO_INDEX": "1"}              # offline: the dependencies are the system's
    done = subprocess.run(["bash", str(root / "source" / "setup.sh")], env=env, cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    where = subprocess.run(["python3", "-I", "-c", "import minitransformer; print(minitransformer.__file__)"],
                           env=env, cwd=root, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(root / "venv")), where               # the wheel from the zip, not this checkout
    return root


def environment(root, autograder=None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{root / 'venv' / 'bin'}{os.pathsep}{env['PATH']}"
    return {**env, gradescope.ROOT: str(autograder)} if autograder else env


def autograde(root, tmp_path, upload) -> dict:
    """Lay out /autograder under tmp_path (source, submission holding what `upload` puts there, results), run
    run_autograder there, return results.json."""
    shutil.copytree(root / "source", tmp_path / "source")
    (tmp_path / "submission").mkdir()
    (tmp_path / "results").mkdir()
    upload(tmp_path / "submission")
    done = subprocess.run([str(tmp_path / "source" / "run_autograder")], env=environment(root, tmp_path),
                          cwd=tmp_path / "source", capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((tmp_path / "results" / "results.json").read_text())


def scores(results) -> dict:
    return {t["name"]: t["score"] for t in results["tests"] if t["max_score"]}


@pytest.mark.slow
@pytest.mark.parametrize("upload", ["transformer folder", "loose files", "hw1/transformer", "a zip"])
def test_the_solutions_get_full_marks_however_they_are_uploaded(gradescope_root, tmp_path, upload):
    sol = gradescope_root / "hw1-solutions"

    def put(submission):
        if upload == "transformer folder":
            shutil.copytree(sol / PACKAGE, submission / PACKAGE)
        elif upload == "loose files":
            for f in ("linear.py", "activations.py"):
                shutil.copyfile(sol / PACKAGE / "layers" / f, submission / f)
        elif upload == "hw1/transformer":
            shutil.copytree(sol, submission / "hw1")
        else:
            shutil.make_archive(str(submission / "mine"), "zip", sol, PACKAGE)
    results = autograde(gradescope_root, tmp_path, put)
    assert results["score"] == 20 and scores(results) == {"part 1: linear": 10, "part 1: relu": 10}, results
    assert "layers/linear.py (from " in results["output"] and str(SEED) not in results["output"]
    assert results["extra_data"]["seed"] == SEED and isinstance(results["execution_time"], (int, float))


@pytest.mark.slow
def test_a_blank_copy_nothing_and_a_broken_autograder_each_score_zero_and_say_why(gradescope_root, tmp_path):
    blank = autograde(gradescope_root, tmp_path / "blank",
                      lambda s: shutil.copytree(gradescope_root / "hw1", s / "hw1"))
    assert blank["score"] == 0 and scores(blank) == {"part 1: linear": 0, "part 1: relu": 0}
    diagnoses = [t for t in blank["tests"] if t["name"].endswith(": diagnosis")]
    assert [t["visibility"] for t in diagnoses] == ["after_due_date"] * 2
    assert all("not written yet" in t["output"] for t in diagnoses)

    nothing = autograde(gradescope_root, tmp_path / "nothing", lambda s: (s / "notes.txt").write_text("oops"))
    assert nothing["score"] == 0 and nothing["output"].startswith("NO FILE OF THE ASSIGNMENT FOUND")
    assert all(t["score"] == 0 for t in nothing["tests"]) and len(scores(nothing)) == 2

    def broken(submission):
        shutil.copytree(gradescope_root / "hw1-solutions" / PACKAGE, submission / PACKAGE)
        (submission.parent / "source" / "config.json").write_text("{not json")
    failed = autograde(gradescope_root, tmp_path / "broken", broken)
    assert failed["score"] == 0 and failed["output"].startswith("The autograder failed (JSONDecodeError")


@pytest.mark.slow
def test_cheating_through_the_autograder_scores_zero_where_it_cheats(gradescope_root, tmp_path):
    """The shortest way to full marks (the reference's backward, imported), a kill of the grading process at import
    and a forged results line printed, each uploaded to Gradescope: the shortcut scores 0, the kill and the printed
    line change nothing (relu, whose file holds them, keeps the points of its code), and the results are written as
    the grader judged them."""
    sol = gradescope_root / "hw1-solutions" / PACKAGE / "layers"

    def put(submission):
        linear = sol.joinpath("linear.py").read_text() + (
            "\n\ndef _shortcut(self, dout):\n"
            "    from minitransformer.layers.linear import Linear as Reference\n"
            "    return Reference.backward(self, dout)\n\n\nLinear.backward = _shortcut\n")
        (submission / "linear.py").write_text(linear)
        (submission / "activations.py").write_text(sol.joinpath("activations.py").read_text() + (
            "\n\nimport os, signal\nprint('{\"score\": 20, \"tests\": []}')\ntry:\n    os.kill(os.getppid(), "
            "signal.SIGKILL)\nexcept OSError:\n    pass\n"))
    results = autograde(gradescope_root, tmp_path, put)
    assert results["score"] == 10 and scores(results) == {"part 1: linear": 0, "part 1: relu": 10}, results
    shown = json.dumps(results["tests"])
    assert "not available while grading" in shown
