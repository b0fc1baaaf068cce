"""The classroom as a grader must be: every mistake of the catalogue fails its exercise and is named, the
solutions get full marks on twenty seeds, a blank copy gets zero and a clean report, `make` then `grade`
round-trips, and whatever a student's code does costs that exercise only."""

import ast
import collections
import difflib
import json
import os
import shutil
import subprocess
import sys

import pytest

from minitransformer.kit.classroom.exercises import CATALOGUE, EXERCISES, TRAIN
from minitransformer.kit.classroom.grader import PACKAGE, grade, grade_exercise
from minitransformer.kit.classroom.maker import make
from minitransformer.kit.cli import main


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    root = tmp_path_factory.mktemp("classroom")
    make(root / "blank")
    make(root / "solutions", solutions=True)
    return root


def solutions(copies, tmp_path, name="student"):
    target = tmp_path / name
    shutil.copytree(copies / "solutions", target)
    return target


def by_name(results):
    return {t["name"].split(": ", 1)[1]: t for t in results["tests"]}


def plant(mistake, package_dir) -> None:
    """Make the mistake in a student's copy (package_dir = DIR/transformer), in the code of its method."""
    for file, reference, _, names in EXERCISES[mistake.exercise].methods():
        path = package_dir / file
        lines = path.read_text().splitlines(keepends=True)
        classes = {n.name: n for n in ast.parse("".join(lines)).body if isinstance(n, ast.ClassDef)}
        for fn in classes[reference.__name__].body:
            if isinstance(fn, ast.FunctionDef) and fn.name in names:
                text = "".join(lines[fn.lineno - 1:fn.end_lineno])
                for old, new in mistake.patches:
                    at = text.rfind(old)                         # in code, not in the hint that may quote it
                    while at >= 0 and "#" in text[text.rfind("\n", 0, at) + 1:at]:
                        at = text.rfind(old, 0, at)
                    if at >= 0:
                        lines[fn.lineno - 1:fn.end_lineno] = [text[:at] + new + text[at + len(old):]]
                        path.write_text("".join(lines))
                        return
    raise LookupError(f"mistake {mistake.name!r}: its text is not in {package_dir}")


def test_the_assignment_holds_the_core_in_its_layout_and_imports_alone(copies):
    blank = copies / "blank"
    for file in ["module.py", "layers/linear.py", "layers/attention.py", "masks.py", "config.py", "model.py", "loss.py",
                 "optim.py", "gradcheck.py", "backend.py", "checks.py", "__init__.py"]:
        assert (blank / PACKAGE / file).is_file(), file
    for file in ["README.md", "check.py", "cases.py", "train_copy.py", "assignment.json", "part1_layers.ipynb",
                 "part2_attention_and_normalisation.ipynb", "part3_the_model.ipynb"]:
        assert (blank / file).is_file(), file
    assert not (blank / PACKAGE / "fast").exists() and not (blank / PACKAGE / "kit").exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import sys, transformer as mt; m = mt.Transformer(mt.TransformerConfig(9, 9, d_model=8, num_heads=2, "
            "num_encoder_layers=1, num_decoder_layers=1, d_ff=8)); print(m.num_parameters(), "
            "[k for k in sys.modules if k.startswith('minitransformer')])")
    out = subprocess.run([sys.executable, "-c", code], cwd=blank, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split(" ", 1)[1].strip() == "[]"        # the installed package was never imported


def test_stubs_keep_the_docstring_shapes_and_a_hint(copies):
    text = (copies / "blank" / PACKAGE / "layers" / "linear.py").read_text()
    assert '"""out = x W + b, applied to the last axis.' in text                       # the class docstring
    assert "def backward(self, dout):                                   # dout (..., out) -> dx (..., in)" in text
    assert "# EXERCISE linear (part 1)" in text and "dA = dC B^T" in text
    assert 'raise NotImplementedError("Linear.backward: exercise linear, yours to write")' in text
    assert "self.W.grad +=" not in text                                               # the body is gone
    assert "out = x @ self.W.data" in text                                            # the forward is not


def test_solutions_differ_from_the_assignment_in_the_bodies_alone(copies):
    stubbed = 0
    for path in sorted((copies / "blank").rglob("*")):
        if path.is_dir():
            continue
        mine = path.read_text().splitlines()
        theirs = (copies / "solutions" / path.relative_to(copies / "blank")).read_text().splitlines()
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, mine, theirs, autojunk=False).get_opcodes():
            if tag != "equal":
                assert tag == "replace" and i2 - i1 == 1, (path, mine[i1:i2])
                assert "raise NotImplementedError(" in mine[i1], (path, mine[i1:i2])
                stubbed += 1
    helpers = 1 + 1 + 1      # DecoderLayer's and EncoderLayer's self_attn_backward, DecoderLayer's cross-attention
    assert stubbed >= len([e for e in EXERCISES.values() if "." not in e.name]) + 3 + helpers - 3


def test_make_then_grade_round_trips_through_the_command_line(tmp_path, capsys):
    folder, results = tmp_path / "teacher", tmp_path / "results.json"
    assert main(["classroom", "make", str(folder), "--solutions"]) == 0
    assert main(["classroom", "grade", str(folder), "--json", str(results)]) == 0
    out = capsys.readouterr().out
    assert "score 150/150" in out
    data = json.loads(results.read_text())                    # Gradescope's results.json
    assert data["score"] == 150 and len(data["tests"]) == len(EXERCISES) - 10 + 1
    for t in data["tests"]:
        assert set(t) >= {"name", "score", "max_score", "output"} and t["score"] == t["max_score"], t
    assert "learned: exact match" in by_name(data)["train"]["output"]


def test_a_blank_copy_gets_zero_and_a_clean_report(copies):
    results = grade(copies / "blank")
    assert results["score"] == 0
    for name, test in by_name(results).items():
        assert test["output"].count("\n") == 0 and "Traceback" not in test["output"], test["output"]
        assert "not written yet" in test["output"], (name, test["output"])


def test_the_solutions_get_full_marks_on_twenty_seeds(copies):
    for seed in range(20):
        for e in EXERCISES.values():
            if "." not in e.name:
                result = grade_exercise(e, copies / "solutions" / PACKAGE, seed, entries=3)
                assert result["backward"] == "ok", (seed, e.name, result["output"])


def test_every_mistake_fails_its_exercise_and_is_named(copies, tmp_path):
    """Round k plants the k-th mistake of each exercise into a copy of the solutions and grades it."""
    per_exercise = collections.defaultdict(list)
    for m in CATALOGUE:
        if "." not in m.exercise:
            per_exercise[m.exercise].append(m)
    assert sum(m.visible for m in CATALOGUE) >= 15 and len(per_exercise) >= 8
    for k in range(max(len(v) for v in per_exercise.values())):
        folder = solutions(copies, tmp_path, f"round{k}")
        planted = {e: ms[k] for e, ms in per_exercise.items() if k < len(ms)}
        for m in planted.values():
            plant(m, folder / PACKAGE)
        tests = by_name(grade(folder))
        for exercise, m in planted.items():
            test = tests[exercise]
            if m.visible:
                assert test["score"] == 0 and f"this looks like: {m.says}" in test["output"], (m.name, test["output"])
            else:                                             # invisible to a gradient check: full marks
                assert test["score"] == test["max_score"], (m.name, test["output"])


def test_a_forward_exercise_and_its_invisible_mistake(tmp_path):
    folder = tmp_path / "forward"
    make(folder, "relu.forward,linear.forward,linear", solutions=True)
    text = (folder / PACKAGE / "layers" / "linear.py").read_text()
    assert text.count("# EXERCISE linear") == 2
    (relu_mistake,) = [m for m in CATALOGUE if m.exercise == "relu.forward"]
    plant(relu_mistake, folder / PACKAGE)
    linear = folder / PACKAGE / "layers" / "linear.py"
    linear.write_text(linear.read_text().replace("out = out + self.b.data ", "out = out - self.b.data "))
    tests = by_name(grade(folder))
    assert set(tests) == {"linear", "linear.forward", "relu.forward"}     # no part 3: no training run
    assert tests["relu.forward"]["score"] == 10                            # x == 0 never happens
    assert tests["linear"]["score"] == 10                                  # graded with the reference forward
    assert tests["linear.forward"]["score"] == 0 and "forward fails: out[" in tests["linear.forward"]["output"]


PATHOLOGIES = {   # exercise: (text in its file, what replaces it, what the grader must say)
    "linear": ("x = self.saved(dout).x ", "x = self.saved(dout).x\n        while True:\n            pass\n       ",
               "stopped after 8 s"),
    "relu": ("return dout * self.saved(dout).positive", "print('debugging'); return dout * self.saved(dout).positive",
             "your code printed"),
    "softmax": ("return p * (dout -", "return 0 * numpy.nan * p * (dout -", "NaN or inf in dx"),
    "dropout": ("return dout if scaled_mask is None else dout * scaled_mask",
                "return (dout if scaled_mask is None else dout * scaled_mask)[:, 1:]",
                "for dx, expected an array of shape (3, 5, 6)"),
    "embedding": ("ids = self.saved(dout).ids ", "ids = self.saved(dout).ids\n        dout *= 2\n       ",
                  "backward changed dout in place"),
    "feedforward": ("self.saved(dout)\n        dh", "import os; os._exit(3)\n        dh", "ended without a result"),
    "layernorm": ("g = dout * self.gamma.data ", "g = dout * self.gamma.data +\n", "does not load: SyntaxError"),
    "loss": ("N, V = p.shape", "N, V = p.shape)", "does not load"),
    "multihead": ("self.saved(dout)\n        # 3. Back", "# 3. Back", "left the forward's cache of the module unused"),
}


def test_what_a_students_code_does_costs_that_exercise_only(copies, tmp_path):
    folder = solutions(copies, tmp_path)
    for exercise, (old, new, _) in PATHOLOGIES.items():
        path = folder / PACKAGE / EXERCISES[exercise].targets[0][0]
        text = path.read_text()
        if exercise == "softmax":
            text = text.replace("from .. import backend, checks", "import numpy\n\nfrom .. import backend, checks")
        body = text.rindex(old)                               # in the code, after the hint
        path.write_text(text[:body] + new + text[body + len(old):])
    graded = [*PATHOLOGIES, "attention", "sublayer"]           # the model's exercises are slow on a busy machine
    manifest = json.loads((folder / "assignment.json").read_text())
    (folder / "assignment.json").write_text(json.dumps({**manifest, "exercises": graded}))
    tests = by_name(grade(folder, timeout=8))
    for exercise, (_, _, says) in PATHOLOGIES.items():
        assert says in tests[exercise]["output"], (exercise, tests[exercise]["output"])
        assert tests[exercise]["score"] == (10 if exercise == "relu" else 0), exercise
    for name in ("attention", "sublayer"):                    # they use the reference's Softmax, LayerNorm...
        assert tests[name]["score"] == 10, tests[name]["output"]


def test_check_py_and_train_copy_run_in_the_students_folder(copies):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "check.py", "linear", "attention"], cwd=copies / "solutions", env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "all passed" in done.stdout and "PASS" in done.stdout, done.stdout + done.stderr
    todo = subprocess.run([sys.executable, "check.py", "linear"], cwd=copies / "blank", env=env, capture_output=True,
                          text=True, check=False)
    assert "linear: not written yet" in todo.stdout and "not yet: linear" in todo.stdout


def test_list_and_bugs(capsys):
    assert main(["classroom", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in [*EXERCISES, TRAIN.name])
    assert main(["classroom", "bugs"]) == 0
    out = capsys.readouterr().out
    assert all(m.name in out for m in CATALOGUE)
    assert "invisible to a gradient check, and harmless" in out
    layers = {m.exercise for m in CATALOGUE if m.visible}
    assert len(layers) >= 8 and sum(m.visible for m in CATALOGUE) >= 15


def test_bad_input_gets_a_one_line_error(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "homework.py").write_text("# a student's work, never overwritten\n")
    assert main(["classroom", "make", str(tmp_path / "taken")]) == 2
    assert "already exists and is not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "taken" / "homework.py").read_text().startswith("# a student's work")
    assert main(["classroom", "grade", str(tmp_path / "taken")]) == 2
    assert "holds no assignment" in capsys.readouterr().err
    assert main(["classroom", "make", str(tmp_path / "new"), "--exercises", "linear,lstm"]) == 2
    assert "--exercises must name exercises among" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_the_part_notebooks_run_on_the_solutions(copies):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    for path in sorted((copies / "solutions").glob("part*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                resources={"metadata": {"path": str(copies / "solutions")}}).execute()
        printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
        assert "FAIL" not in printed and "PASS" in printed, (path.name, printed[-500:])
