"""The classroom as a course uses it: each week's handout holds only what is due, its README's commands run, the
notebooks see a student's edits, and a whole class is graded in one command (files found wherever they sit, links
and unsafe zip members refused, a gradebook, feedback, a batch that resumes)."""

import ast
import csv
import inspect
import io
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

from minitransformer.kit.classroom import batch
from minitransformer.kit.classroom.exercises import EXERCISES
from minitransformer.kit.classroom.maker import PACKAGE, make
from minitransformer.kit.cli import main

WEEKS = {w: [n for n, e in EXERCISES.items() if e.part == w and "." not in n] for w in (1, 2, 3)}
SMALL = ["linear", "relu"]                   # a class graded in seconds: layers/linear.py, layers/activations.py


def body(source: str, cls: str, method: str) -> str | None:
    """The code of cls.method after its docstring, dedented, or None if the class or method is not there."""
    tree = ast.parse(textwrap.dedent(source))
    lines = textwrap.dedent(source).splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == method:
                    first = fn.body[1] if ast.get_docstring(fn) is not None and len(fn.body) > 1 else fn.body[0]
                    return textwrap.dedent("\n".join(lines[first.lineno - 1:fn.end_lineno]))
    return None


def revealed(folder) -> set:
    """The exercises whose reference code (any of their methods' bodies) the folder's transformer/ holds."""
    found = set()
    for name, e in EXERCISES.items():
        for file, cls, _, methods in e.methods():
            text = (folder / PACKAGE / file).read_text()
            for method in methods:
                reference = body(inspect.getsource(cls), cls.__name__, method)
                if "raise NotImplementedError" not in reference and body(text, cls.__name__, method) == reference:
                    found.add(name)
    return found


@pytest.fixture(scope="module")
def weeks(tmp_path_factory):
    root = tmp_path_factory.mktemp("weeks")
    for w, names in WEEKS.items():
        make(root / f"hw{w}", names, reveal=range(1, w))
        make(root / f"hw{w}-solutions", names, solutions=True, reveal=range(1, w))
    make(root / "everything", solutions=True)
    make(root / "nothing")
    return root


def test_no_handout_holds_the_reference_of_an_exercise_not_yet_due(weeks):
    assert revealed(weeks / "everything") == set(EXERCISES)          # the check sees every reference body...
    assert revealed(weeks / "nothing") == {n for n in EXERCISES if "." in n}    # ...and every stub (forwards given)
    for w in WEEKS:
        given = {n for n, e in EXERCISES.items() if e.part < w or e.part == w and "." in n}
        assert revealed(weeks / f"hw{w}") == given, w
        assert revealed(weeks / f"hw{w}-solutions") == {n for n, e in EXERCISES.items() if e.part <= w}, w
        for later in (v for v in WEEKS if v > w):       # any diff of week w's folders against week v's solutions
            assert not {n for n in revealed(weeks / f"hw{w}-solutions") if EXERCISES[n].part >= later}
    text = (weeks / "hw1" / PACKAGE / "layers" / "layernorm.py").read_text()
    assert 'raise NotImplementedError("LayerNorm.backward: part 2\'s exercise")' in text


def test_the_graders_sandbox_holds_no_reference_of_an_exercise_not_yet_due(weeks, tmp_path):
    """The package a student's code runs on while graded is the handout, as `make` wrote it, with the student's
    files over it: the reference bodies it holds are the handout's alone (test_classroom_hostile reads it from
    inside)."""
    from minitransformer.kit.classroom.maker import package, withheld_of, write_package

    week1 = [EXERCISES[n] for n in WEEKS[1]]
    write_package(tmp_path / PACKAGE, package(week1, False, withheld_of(week1)))
    assert revealed(tmp_path) == revealed(weeks / "hw1") == {n for n in EXERCISES if n.endswith(".forward")
                                                             and EXERCISES[n].part == 1}
    write_package(tmp_path / "all" / PACKAGE, package(week1))        # without withheld: the check can see a leak
    assert set(WEEKS[3]) <= revealed(tmp_path / "all")


def test_train_copy_comes_with_part_3_and_every_readme_command_runs_in_week_1(weeks):
    assert not (weeks / "hw1" / "train_copy.py").exists()
    assert "train_copy" not in (weeks / "hw1" / "README.md").read_text()
    assert (weeks / "hw3" / "train_copy.py").is_file()
    assert "python train_copy.py" in (weeks / "hw3" / "README.md").read_text()
    commands = [line.split("#")[0].split() for line in (weeks / "hw1" / "README.md").read_text().splitlines()
                if line.startswith("    python ")]
    assert len(commands) == 2
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for command in commands:
        done = subprocess.run([sys.executable, *command[1:]], cwd=weeks / "hw1-solutions", env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "all passed" in done.stdout, (command, done.stdout[-300:], done.stderr[-300:])


def test_reveal_must_name_parts(tmp_path, capsys):
    with pytest.raises(ValueError, match="--reveal must name parts among 1, 2, 3.*'4'"):
        make(tmp_path / "a", "linear", reveal="4")
    assert main(["classroom", "make", str(tmp_path / "b"), "--reveal", "one"]) == 2
    assert "--reveal must name parts" in capsys.readouterr().err


@pytest.mark.slow
def test_a_notebook_sees_an_edited_file_without_a_restart(weeks, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    shutil.copytree(weeks / "hw1", tmp_path / "hw1")
    nb = nbformat.read(tmp_path / "hw1" / "part1_layers.ipynb", as_version=4)
    check = next(c for c in nb.cells if "check.py relu" in c.source)
    explore = nbformat.v4.new_code_cell("r = mt.layers.ReLU()\nr(np.ones((2, 3)))\ntry:\n"
                                        "    print('BACKWARD', r.backward(np.ones((2, 3))).sum())\n"
                                        "except NotImplementedError:\n    print('BACKWARD missing')")
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path / "hw1")}})
    printed = []
    with client.setup_kernel():
        client.execute_cell(nb.cells[1], 1)                           # the imports
        for i in range(2):
            for n, cell in enumerate((check, explore)):
                client.execute_cell(cell, 2 + 2 * i + n)
                printed.append("".join(o.get("text", "") for o in cell.outputs))
            shutil.copyfile(weeks / "hw1-solutions" / PACKAGE / "layers" / "activations.py",
                            tmp_path / "hw1" / PACKAGE / "layers" / "activations.py")
    assert "relu: not written yet" in printed[0] and printed[1].strip() == "BACKWARD missing", printed[:2]
    assert "PASS" in printed[2] and "all passed" in printed[2] and printed[3].strip() == "BACKWARD 6.0", printed[2:]


# ---------------------------------------------------------------------------------------------------- a class


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    make(root / "hw", SMALL)
    make(root / "sol", SMALL, solutions=True)
    return root


def zipped(path, members: dict, links=()) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        for name, target in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16                       # a symbolic link
            z.writestr(info, target)


def gradebook(path) -> dict:
    return {row["student"]: row for row in csv.DictReader(io.StringIO(path.read_text()))}


def test_a_class_is_graded_in_one_command(small, tmp_path, capsys):
    sol, c = small / "sol" / PACKAGE, tmp_path / "class"
    linear, activations = (sol / "layers" / "linear.py").read_bytes(), (sol / "layers" / "activations.py").read_bytes()
    shutil.copytree(small / "sol", c / "alice")                                  # the whole folder
    (c / "bob").mkdir()
    for f in ("linear.py", "activations.py"):                                    # loose files
        shutil.copyfile(sol / "layers" / f, c / "bob" / f)
    zipped(c / "carol.zip", {"hw/transformer/layers/linear.py": linear, "hw/transformer/layers/activations.py":
                             activations, "__MACOSX/hw/transformer/layers/._linear.py": b"junk"})
    (c / "dave").mkdir()
    (c / "dave" / "notes.txt").write_text("forgot")                            # none of the assignment's files
    (c / "eve" / "layers").mkdir(parents=True)                                   # a link to the reference, refused
    os.symlink(sol / "layers" / "linear.py", c / "eve" / "layers" / "linear.py")
    shutil.copyfile(sol / "layers" / "activations.py", c / "eve" / "activations.py")
    zipped(c / "frank.zip", {"../../escaped.py": b"x", "/abs/activations.py": activations,        # a bomb, a link
                             "transformer/layers/linear.py": b"#" * (8 << 20)},
           links=[("transformer/layers/activations.py", str(sol / "layers" / "activations.py"))])
    shutil.copytree(small / "sol", c / "gina")                                  # with a helper module of her own
    (c / "gina" / PACKAGE / "layers" / "myutil.py").write_text("def rows(a):\n    return a.reshape(-1, a.shape[-1])\n")
    (c / "gina" / PACKAGE / "layers" / "linear.py").write_text(linear.decode().replace(
        "x2d = x.reshape(-1, self.in_features)", "x2d = rows(x)").replace("from .. import backend, checks",
                                                                           "from .. import backend, checks\nfrom "
                                                                           ".myutil import rows"))
    (c / "notes.txt").write_text("not a student")
    args = ["classroom", "grade", str(c), "--assignment", str(small / "hw"), "--csv", str(tmp_path / "grades.csv"),
            "--feedback", str(tmp_path / "feedback"), "--seed", "3", "--results", str(tmp_path / "store")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "7 of 7 submissions to grade" in err and "notes.txt is not a student's folder or zip" in err
    assert "dave: NO FILE OF THE ASSIGNMENT FOUND" in err
    book = gradebook(tmp_path / "grades.csv")
    assert [(s, r["total"], r["linear"], r["relu"]) for s, r in book.items()] == [
        ("alice", "20", "10", "10"), ("bob", "20", "10", "10"), ("carol", "20", "10", "10"),
        ("dave", "0", "0", "0"), ("eve", "10", "0", "10"), ("frank", "0", "0", "0"), ("gina", "20", "10", "10")]
    assert book["dave"]["flags"] == "submission: no files found"
    assert "refused layers/linear.py: a link" in book["eve"]["flags"]
    assert "../../escaped.py: a link, an absolute path or '..'" in book["frank"]["flags"]
    assert "transformer/layers/activations.py: a link" in book["frank"]["flags"]
    assert "larger than 1024 KB: not taken" in book["frank"]["flags"]
    assert not list(tmp_path.rglob("escaped.py")) and not list(tmp_path.parent.rglob("escaped.py"))
    eve = (tmp_path / "feedback" / "eve.md").read_text()
    assert "**10 / 20 points**" in eve and "## part 1: linear: 0 / 10" in eve and "not written yet" in eve
    assert "NO FILE OF THE ASSIGNMENT FOUND" in (tmp_path / "feedback" / "dave.md").read_text()
    carol = (tmp_path / "feedback" / "carol.md").read_text()
    assert "`layers/linear.py` (from `carol.zip/hw/transformer/layers/linear.py`)" in carol

    assert main(args) == 0                                                       # resumed: nothing left to grade
    assert "0 of 7 submissions to grade" in capsys.readouterr().err
    (c / "bob" / "linear.py").write_text(linear.decode().replace("self.W.grad += x2d.T @ dout2d",
                                                                 "self.W.grad += dout2d.T @ x2d"))
    assert main(args) == 0                                                       # bob handed in again
    assert "1 of 7 submissions to grade" in capsys.readouterr().err
    assert gradebook(tmp_path / "grades.csv")["bob"]["linear"] == "0"
    assert main([*args, "--only", "alice"]) == 0
    assert "1 of 7 submissions to grade" in capsys.readouterr().err
    assert main([*args, "--only", "zed"]) == 2
    assert "--only must name a submission" in capsys.readouterr().err


def test_a_hostile_submission_costs_that_student_only(small, tmp_path, capsys):
    c = tmp_path / "class"
    for name in ("ann", "ben"):
        shutil.copytree(small / "sol" / PACKAGE, c / name / PACKAGE)
    text = (small / "sol" / PACKAGE / "layers" / "linear.py").read_text()
    (c / "ben" / PACKAGE / "layers" / "linear.py").write_text("import os, signal\nos.kill(os.getppid(), "
                                                               "signal.SIGKILL)\n" + text)
    assert main(["classroom", "grade", str(c), "--assignment", str(small / "hw"), "--csv", str(tmp_path / "g.csv"),
                 "--seed", "1"]) == 0
    book = gradebook(tmp_path / "g.csv")
    assert book["ann"]["total"] == "20" and book["ben"]["linear"] == "0"


def test_one_submission_and_a_transformer_folder_handed_back_alone(small, tmp_path, capsys):
    shutil.copytree(small / "sol" / PACKAGE, tmp_path / PACKAGE)
    assert main(["classroom", "grade", str(tmp_path / PACKAGE), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "score 20/20" in out and "the exercises its files name" in out       # linear and relu, from its hints
    (tmp_path / "up").mkdir()
    zipped(tmp_path / "up" / "upload.zip", {"linear.py": (tmp_path / PACKAGE / "layers" / "linear.py").read_bytes()})
    assert main(["classroom", "grade", str(tmp_path / "up" / "upload.zip"), "--assignment", str(small / "hw")]) == 0
    assert "score 10/20" in capsys.readouterr().out


def test_files_are_found_wherever_they_sit_the_likeliest_first(tmp_path):
    (tmp_path / "a" / "hw1" / PACKAGE / "layers").mkdir(parents=True)
    (tmp_path / "a" / "hw1" / PACKAGE / "layers" / "linear.py").write_text("mine")
    (tmp_path / "a" / "backup").mkdir()
    (tmp_path / "a" / "backup" / "linear.py").write_text("old")
    (tmp_path / "a" / ".hidden.py").write_text("no")
    found, where, notes = batch.collect(tmp_path / "a", ["layers/linear.py", "model.py"])
    assert found == {"layers/linear.py": b"mine"} and where == {"layers/linear.py": "hw1/transformer/layers/linear.py"}
    assert notes == ["2 files named linear.py: graded hw1/transformer/layers/linear.py"]
