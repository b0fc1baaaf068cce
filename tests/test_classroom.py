"""The classroom as a grader must be: every mistake of the catalogue fails its exercise and is named, the
solutions get full marks on twenty seeds, a blank copy gets zero and a clean report, `make` then `grade`
round-trips, and whatever a student's code does costs that exercise, and the exercises that run its class (as
check.py runs them, on the student's own package), which say so."""

import ast
import difflib
import json
import os
import re
import shutil
import subprocess
import sys

import numpy
import pytest

import minitransformer as mt
from minitransformer.kit.classroom import grader, train_copy
from minitransformer.kit.classroom.exercises import CATALOGUE, EXERCISES, TRAIN
from minitransformer.kit.classroom.grader import grade, grade_exercise
from minitransformer.kit.classroom.maker import PACKAGE, make
from minitransformer.kit.cli import main


# The exercises whose classes each exercise's cases run besides its own: as check.py runs it, on the student's own
# package, an exercise fails when one of these fails, and says so.
RUNS = {"linear": set(), "relu": set(), "softmax": set(), "dropout": set(), "embedding": set(), "layernorm": set(),
        "loss": set(), "feedforward": {"linear", "relu", "dropout"}, "attention": {"softmax", "dropout"},
        "multihead": {"linear", "softmax", "dropout", "attention"},
        "sublayer": {"linear", "relu", "dropout", "feedforward", "layernorm"},
        "encoder_layer": {"linear", "relu", "softmax", "dropout", "feedforward", "layernorm", "attention", "multihead",
                          "sublayer"}}
RUNS["decoder_layer"] = RUNS["encoder_layer"]
RUNS["transformer"] = RUNS["encoder_layer"] | {"embedding", "encoder_layer", "decoder_layer"}
LEAVES = {name for name, runs in RUNS.items() if not runs}


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
    # a fixed seed: the hidden inputs and the training run are the same on every run of the test
    assert main(["classroom", "grade", str(folder), "--json", str(results), "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "score 150/150" in out
    data = json.loads(results.read_text())                    # Gradescope's results.json
    assert data["score"] == 150 and len(data["tests"]) == len(EXERCISES) - 10 + 1
    for t in data["tests"]:
        assert set(t) >= {"name", "score", "max_score", "output"} and t["score"] == t["max_score"], t
    assert "learned: exact match" in by_name(data)["train"]["output"]


def test_the_training_bar_fails_weights_that_did_not_learn_and_passes_ones_that_did(tmp_path, float64):
    def judged(model) -> dict:
        (tmp_path / "out").mkdir(exist_ok=True)
        for name, array in model.state_dict().items():
            numpy.save(tmp_path / "out" / f"{name}.npy", array)
        return grader.judge_training({"folder": tmp_path, "seeds": [0, 3]}, {"figures": {}})

    mt.manual_seed(3)
    untrained = judged(mt.Transformer(train_copy.config(mt)))
    assert untrained["backward"] == "FAIL" and untrained["output"].startswith("did not learn: exact match ")
    assert f"(needs {train_copy.LEARNS:.0%})" in untrained["output"]
    trained = judged(train_copy.train(mt, seed=3, log=lambda line: None)["model"])
    assert trained["backward"] == "ok" and trained["output"].startswith("learned: exact match "), trained


def notes(output: str) -> set:
    """The exercises an output's first line blames ("runs your X, which fails 'x': fix that first"), or none."""
    first = output.split("\n", 1)[0]
    return set(re.findall(r"'([\w.]+)'", first)) if first.startswith("runs your ") and "first" in first else set()


def test_a_blank_copy_gets_zero_and_a_clean_report(copies):
    results = grade(copies / "blank")
    assert results["score"] == 0
    for name, test in by_name(results).items():
        *note, last = test["output"].split("\n")
        assert "Traceback" not in test["output"] and "not written yet" in last, (name, test["output"])
        roots = (RUNS[name] if name != "train" else set(RUNS)) & LEAVES     # train runs the whole model
        assert len(note) == bool(roots) and notes(test["output"]) == roots, (name, test["output"])


def test_the_solutions_get_full_marks_on_twenty_seeds(copies):
    for e in EXERCISES.values():
        if "." not in e.name:
            result = grade_exercise(e, copies / "solutions" / PACKAGE, seeds=range(20))
            assert result["backward"] == "ok", (e.name, result["output"])
            public = int(result["output"].split("(")[1].split()[0])
            assert f"({public} public, {19 * public} hidden)" in result["output"], result["output"]


def test_every_mistake_fails_its_exercise_and_is_named(copies, tmp_path):
    """Each mistake planted alone into a copy of the solutions, its exercise graded."""
    mistakes = [m for m in CATALOGUE if "." not in m.exercise]
    assert sum(m.visible for m in mistakes) >= 15 and len({m.exercise for m in mistakes}) >= 8
    for k, m in enumerate(mistakes):
        shutil.copytree(copies / "solutions" / PACKAGE, tmp_path / str(k))
        plant(m, tmp_path / str(k))
        result = grade_exercise(EXERCISES[m.exercise], tmp_path / str(k), seeds=[0, 1])
        if m.visible:
            assert result["backward"] == "FAIL" and f"this looks like: {m.says}" in result["output"], (m.name, result)
        else:                                                 # invisible to a gradient check: full marks
            assert result["backward"] == "ok", (m.name, result["output"])


def test_an_exercise_that_runs_a_failing_class_says_so(copies, tmp_path):
    """Linear's mistake costs the exercises that run the student's Linear, each saying why; the others keep theirs."""
    folder = solutions(copies, tmp_path)
    (mistake,) = [m for m in CATALOGUE if m.name == "dW transposed"]
    plant(mistake, folder / PACKAGE)
    graded = ["linear", "relu", "feedforward", "layernorm", "sublayer", "loss"]
    manifest = json.loads((folder / "assignment.json").read_text())
    (folder / "assignment.json").write_text(json.dumps({**manifest, "exercises": graded}))
    tests = by_name(grade(folder))
    assert f"this looks like: {mistake.says}" in tests["linear"]["output"]
    for name in graded:
        assert tests[name]["score"] == (0 if name == "linear" or "linear" in RUNS[name] else 10), name
        assert notes(tests[name]["output"]) == ({"linear"} if "linear" in RUNS[name] else set()), tests[name]
    assert tests["feedforward"]["output"].startswith("runs your Linear, which fails 'linear': fix that first\n")


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
    assert tests["linear.forward"]["score"] == 0 and "forward fails: out[" in tests["linear.forward"]["output"]
    assert tests["linear"]["score"] == 0                                   # it runs the student's forward
    assert tests["linear"]["output"].startswith("runs your Linear, which fails 'linear.forward': fix that first")


PATHOLOGIES = {   # exercise: (text in its file, what replaces it, what the grader must say)
    "loss": ("N, V = p.shape", "N, V = p.shape\n        while True:\n            pass", "stopped after 8 s"),
    "relu": ("return dout * self.saved(dout).positive", "print('debugging'); return dout * self.saved(dout).positive",
             "your code printed"),
    "softmax": ("return p * (dout -", "return 0 * numpy.nan * p * (dout -", "NaN or inf in dx"),
    "dropout": ("return dout if scaled_mask is None else dout * scaled_mask",
                "return (dout if scaled_mask is None else dout * scaled_mask)[:, 1:]",
                "for dx, expected an array of shape (3, 5, 6)"),
    "embedding": ("ids = self.saved(dout).ids ", "ids = self.saved(dout).ids\n        dout *= 2\n       ",
                  "backward changed dout in place"),
    "feedforward": ("self.saved(dout)\n        dh", "import os; os._exit(3)\n        dh", "ended without a result"),
    "multihead": ("self.saved(dout)\n        # 3. Back", "# 3. Back", "left the forward's cache of the module unused"),
}
FAILING = {"loss", "softmax", "dropout", "embedding", "feedforward", "multihead"}      # printing costs nothing


def pathological(copies, tmp_path, pathologies: dict, graded: list):
    """A copy of the solutions with the pathologies written in, graded on `graded`."""
    folder = solutions(copies, tmp_path)
    for exercise, (old, new, _) in pathologies.items():
        path = folder / PACKAGE / EXERCISES[exercise].targets[0][0]
        text = path.read_text()
        if exercise == "softmax":
            text = text.replace("from .. import backend, checks", "import numpy\n\nfrom .. import backend, checks")
        body = text.rindex(old)                               # in the code, after the hint
        path.write_text(text[:body] + new + text[body + len(old):])
    manifest = json.loads((folder / "assignment.json").read_text())
    (folder / "assignment.json").write_text(json.dumps({**manifest, "exercises": graded}))
    return by_name(grade(folder, time_limit=8))


def test_what_a_students_code_does_costs_that_exercise_and_those_that_run_it(copies, tmp_path):
    graded = [*PATHOLOGIES, "linear", "layernorm", "attention", "sublayer"]   # the model's exercises: slow here
    tests = pathological(copies, tmp_path, PATHOLOGIES, graded)
    # Those whose cases use a failing class say so, naming the failures their run reached: feedforward's own os._exit
    # ends its process before its backward reaches the failing dropout, and the same os._exit ends sublayer's
    # (whose FFN is the student's) there; multihead's own mistake comes after the softmax and dropout it runs.
    blamed = {"attention": {"softmax", "dropout"}, "multihead": {"softmax", "dropout"}, "sublayer": {"feedforward"}}
    for exercise, (_, _, says) in PATHOLOGIES.items():
        assert (says in tests[exercise]["output"]) == (exercise not in blamed), (exercise, tests[exercise]["output"])
    for name in graded:
        assert tests[name]["score"] == (0 if name in FAILING or RUNS[name] & FAILING else 10), (name, tests[name])
        assert notes(tests[name]["output"]) == blamed.get(name, set()), (name, tests[name]["output"])


def test_a_package_that_does_not_load_fails_every_exercise_as_check_py_does(copies, tmp_path):
    tests = pathological(copies, tmp_path, {"layernorm": ("g = dout * self.gamma.data ", "g = dout * self.gamma."
                                                          "data +\n", "")}, ["relu", "layernorm"])
    for name in ("relu", "layernorm"):
        assert tests[name]["score"] == 0 and not notes(tests[name]["output"])
        assert tests[name]["output"].startswith("your transformer package does not load, so no exercise runs (nor "
                                                "check.py): SyntaxError"), tests[name]["output"]
        assert "layernorm.py" in tests[name]["output"]


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
