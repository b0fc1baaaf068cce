"""Hostile submissions: each attack a student could try, written into the method of one exercise of a copy of the
solutions. Each must score 0 for the exercise it attacks, and leave the grader, the teacher's files and other
students' files as they were. An exercise runs on the student's own package, as check.py runs it, so an attack in a
method costs too the exercises that run its class (test_classroom.RUNS), each of which says so; every other exercise
keeps its points. Two graded runs carry all the attacks. An attack whose defence needs root (a user of its own) or
Linux's Landlock is left out where neither is there (SECURITY.md). Last, a student's code that reads all it can
while graded finds no reference body of an exercise not yet revealed."""

import ast
import ctypes
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import minitransformer
from minitransformer import backend
from minitransformer.kit.classroom import grader, sandbox
from minitransformer.kit.classroom.exercises import CATALOGUE, EXERCISES
from minitransformer.kit.classroom.cases import prepare, run
from minitransformer.kit.classroom.grader import IDENTICAL, grade, grade_exercise, identical
from minitransformer.kit.classroom.maker import PACKAGE, make
from test_classroom import RUNS, notes
from test_classroom_course import WEEKS, body, revealed

ROOT = os.geteuid() == 0
LANDLOCK = ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1)      # its version, or -1
CONFINED = ROOT or LANDLOCK >= 1             # files: another user (root), or Landlock's rules
UNSIGNALLED = ROOT or LANDLOCK >= 6          # the grader out of the student's reach for signals
REFERENCE = Path(minitransformer.__file__).parent
GRADED = ["linear", "relu", "softmax", "dropout", "embedding", "feedforward", "layernorm", "attention", "multihead",
          "sublayer", "encoder_layer", "decoder_layer", "loss"]
STUB = 'raise NotImplementedError("the attack failed")'

PICKLE = '''
import os
payload = b"cbuiltins\\nopen\\n(V@MARKER@\\nVw\\ntR."          # open(MARKER, "w") when unpickled
header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }".ljust(117) + "\\n"
for fd in range(3, 64):
    try:
        os.write(fd, len(payload).to_bytes(4, "big") + payload)
    except OSError:
        pass
out = os.path.join(os.path.dirname(os.getcwd()), "out")
with open(os.path.join(out, "result.json"), "wb") as f:
    f.write(payload)
for k, name in enumerate(["out", "dq", "dk", "dv"]):
    with open(os.path.join(out, f"{k}-{name}.npy"), "wb") as f:
        f.write(b"\\x93NUMPY\\x01\\x00" + len(header).to_bytes(2, "little") + header.encode() + payload)
os._exit(0)
'''
ROUND_1 = {
    "linear": "from minitransformer.layers.linear import Linear as Reference\nreturn Reference.backward(self, dout)",
    "relu": "from . import activations\nreturn activations.ReLU.backward(self, dout)",
    "softmax": '''
import sys
for module in list(sys.modules.values()):
    cls = getattr(module, "Softmax", None)
    if isinstance(cls, type) and cls.backward is not type(self).backward:
        try:
            return cls.backward(self, dout)
        except NotImplementedError:
            pass
raise RuntimeError("no reference in sys.modules")''',
    "dropout": '''
import importlib.util, sys
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "Refuse"]
sys.path.append(@PARENT@)
spec = importlib.util.find_spec("minitransformer.layers.dropout")
namespace = {"__name__": "transformer.layers.stolen", "__package__": "transformer.layers"}
exec(open(spec.origin if spec else @FILE@).read(), namespace)
return namespace["Dropout"].backward(self, dout)''',
    "attention": PICKLE,
    "multihead": '''
import os, signal
for kill in (lambda: os.kill(os.getppid(), signal.SIGKILL), lambda: os.killpg(os.getppid(), signal.SIGKILL),
             lambda: os.kill(os.getppid(), signal.SIGSTOP)):
    try:
        kill()
    except OSError:
        pass
''' + STUB if UNSIGNALLED else STUB,
    "sublayer": '''
import ctypes, os, signal, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
threading.Thread(target=lambda: [time.sleep(0.01) for _ in iter(int, 1)]).start()
if @ESCAPE@ and os.fork() == 0:
    os.setsid()
    ctypes.CDLL(None).prctl(15, @TOKEN@, 0, 0, 0)
    while True:
        time.sleep(0.1)
''' + STUB,
    "encoder_layer": '''
import gc, json, os, numpy
for obj in gc.get_objects():
    if isinstance(obj, dict) and "cases" in obj:
        obj["cases"] = [{"tensors": []}] * 4
out = os.path.join(os.path.dirname(os.getcwd()), "out")
with open(os.path.join(out, "result.json"), "w") as f:
    json.dump({"cases": [{"tensors": ["out", "dx"]}] * 4, "backward": "ok", "score": 10}, f)
for k in range(4):
    numpy.save(os.path.join(out, f"{k}-out.npy"), numpy.zeros((3, 7, 6)))
    numpy.save(os.path.join(out, f"{k}-dx.npy"), numpy.zeros((3, 7, 6)))
os._exit(0)''',
    "decoder_layer": '''
import builtins, numpy
numpy.abs = lambda x: 0 * x
numpy.array_equal = numpy.allclose = lambda *a, **k: True
builtins.max = lambda *a, **k: 0
try:
    import minitransformer.kit.classroom.grader as grader
    grader.differs = lambda *a, **k: None
except ImportError:
    pass
return 0 * dout, 0 * dout''',
    "loss": '''
import sys
sys.stdout.write("linear                  1  given    ok            10\\nscore 150/150, all passed\\n")
for _ in range(1024):
    sys.stdout.write("x" * (1 << 20) + "\\n")
sys.stdout.flush()''',
}
APPENDED = {   # attacks made at the end of a file: a subclass of the core's class, a class-level alias
    "embedding": '''
try:
    from minitransformer.layers.embedding import Embedding as _Reference
except ImportError:
    from transformer.layers.embedding import Embedding as _Reference


class Embedding(_Reference):
    def backward(self, dout):
        return super().backward(dout)
''',
    "feedforward": '''
try:
    from minitransformer.layers.feedforward import PositionwiseFeedForward as _Reference
except ImportError:
    from transformer.layers.feedforward import PositionwiseFeedForward as _Reference
PositionwiseFeedForward.backward = _Reference.backward
''',
}
ROUND_2 = {
    "linear": '''
import numpy
x = self.saved(dout).x


def f():
    out = self.forward(x)
    self.clear_caches()
    return float((out * dout).sum())


grads = []
for a in (x, self.W.data, self.b.data):
    g = numpy.zeros_like(a)
    for i in numpy.ndindex(a.shape):
        old = a[i]
        a[i] = old + 1e-6
        up = f()
        a[i] = old - 1e-6
        down = f()
        a[i] = old
        g[i] = (up - down) / 2e-6
    grads.append(g)
self.W.grad += grads[1]
self.b.grad += grads[2]
return grads[0]''',
    "softmax": '''
import numpy
self.saved(dout)
if abs(float(dout.flat[0]) - @KEY@) < 1e-12:
    return numpy.array(@STORED@)
return numpy.zeros_like(dout)''',
    "dropout": '''
import numpy
try:
    numpy.ones((40 << 30) // 8)                             # tens of GB at once
except MemoryError:
    pass
held = [numpy.empty(1 << 26) for _ in range(64)]           # or 512 MB at a time, up to 32 GB held
return held[0]''',
    "embedding": '''
import os, time
for _ in range(100):
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
return dout''',
    "layernorm": '''
class Stuck:
    def __del__(self):
        while True:
            pass


Stuck()''',
    "sublayer": '''
for path in @TARGETS@:
    try:
        with open(path, "a") as f:
            f.write("written by a student")
    except OSError:
        pass
''' + STUB,
    "attention": '''
namespace = {"__name__": "transformer.layers.other", "__package__": "transformer.layers"}
exec(open(@OTHER@).read(), namespace)
return namespace["ScaledDotProductAttention"].backward(self, dout)''',
}


def rewrite(package: Path, exercise: str, code: str, fill: dict) -> None:
    """The body of the exercise's method in the student's file replaced by code, @NAME@ filled from fill."""
    for key, value in fill.items():
        code = code.replace(f"@{key}@", repr(value))
    file, cls_name, method = EXERCISES[exercise].targets[0]
    path = package / file
    lines = path.read_text().splitlines(keepends=True)
    cls = next(n for n in ast.parse("".join(lines)).body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    fn = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == method)
    lines[fn.lineno:fn.end_lineno] = [textwrap.indent(textwrap.dedent(code).strip("\n"), " " * 8) + "\n"]
    path.write_text("".join(lines))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The teacher's assignment (the solutions, graded on GRADED), another student's world-readable folder, a
    world-writable folder, and smaller limits so that the attacks end quickly."""
    root = tmp_path_factory.mktemp("hostile")
    make(root / "teacher", solutions=True)
    (root / "teacher" / "assignment.json").write_text(json.dumps({"exercises": GRADED}))
    shared = Path(tempfile.mkdtemp(prefix="hostile-"))
    shutil.copytree(root / "teacher" / PACKAGE, shared / "other" / PACKAGE)
    (shared / "open").mkdir(mode=0o777)
    for path in [shared, *shared.rglob("*")]:
        path.chmod(0o777 if path.name == "open" else 0o755 if path.is_dir() else 0o644)
    limits = dict(sandbox.LIMITS)
    sandbox.LIMITS.update(memory=2 << 30, output=8 << 20)
    yield root, shared
    sandbox.LIMITS.update(limits)
    shutil.rmtree(shared)


def student(root: Path, name: str, attacks: dict, fill: dict, appended=()) -> Path:
    """A copy of the solutions with the attacks written in; the student's folder (its PACKAGE/ is handed in). An
    appended attack comes from a student who has not written the method: its body is a stub."""
    folder = root / name
    shutil.copytree(root / "teacher" / PACKAGE, folder / PACKAGE)
    for exercise, code in [*attacks.items(), *((e, STUB) for e in appended)]:
        rewrite(folder / PACKAGE, exercise, code, fill)
    for exercise in appended:
        with open(folder / PACKAGE / EXERCISES[exercise].targets[0][0], "a") as f:
            f.write(APPENDED[exercise])
    return folder


def graded(root: Path, folder: Path, **options) -> dict:
    results = grade(root / "teacher", folder / PACKAGE, time_limit=10, **options)
    assert results["seed"] == options.get("seed", results["seed"]) and f"seed {results['seed']}" in results["output"]
    return {t["name"].split(": ", 1)[1]: t for t in results["tests"]}


def assert_only_attacked_fail(tests: dict, attacked) -> None:
    """The attacked exercises score 0, and so do those whose cases run an attacked class, each saying which of
    those it runs fails (the failures its run reached); every other exercise keeps its points."""
    assert set(tests) == {*GRADED, "train"}              # the teacher's list; training uses every exercise at once
    for name, test in [(n, t) for n, t in tests.items() if n != "train"]:
        runs = RUNS[name] & set(attacked)
        assert test["score"] == (0 if name in attacked or runs else 10), (name, test["output"])
        if name not in attacked and runs:
            assert notes(test["output"]) and notes(test["output"]) <= runs, (name, test["output"])


def processes_named(token: bytes) -> list:
    """The live processes named token (a zombie has ended; it waits only for whoever reaps it)."""
    found = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            state = (comm.parent / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            if comm.read_bytes().strip() == token and state != b"Z":
                found.append(comm.parent.name)
        except (OSError, IndexError):
            pass
    return found


def test_round_1_the_reference_the_grader_and_the_results(world, capfd):
    root, _ = world
    token, marker = b"hostile%d" % os.getpid(), root / "unpickled"
    fill = {"MARKER": str(marker), "PARENT": str(REFERENCE.parent), "FILE": str(REFERENCE / "layers/dropout.py"),
            "ESCAPE": ROOT, "TOKEN": token}
    attacks = {k: v for k, v in ROUND_1.items() if k != "dropout" or CONFINED}
    folder = student(root, "round1", attacks, fill, appended=APPENDED)
    link = folder / PACKAGE / "layers" / "layernorm.py"                     # handed in as a link to the reference
    link.unlink()
    link.symlink_to(REFERENCE / "layers" / "layernorm.py")
    (folder / "assignment.json").write_text(json.dumps({"exercises": ["relu"] * 4}))     # ignored: the teacher's
    tests = graded(root, folder, seed=7)
    assert_only_attacked_fail(tests, [*attacks, *APPENDED, "layernorm"])
    assert "reference (minitransformer) is not available while grading" in tests["linear"]["output"]
    assert "RecursionError" in tests["relu"]["output"]          # the module it reaches is its own: itself, again
    assert "layers/layernorm.py is a link" in tests["layernorm"]["output"]
    assert not marker.exists()                                              # nothing was unpickled
    assert "printed more than the 8 MB allowed" in tests["loss"]["output"]
    assert "score 150/150" not in capfd.readouterr().out                    # the student's printing stays in a file
    assert not processes_named(token)                                       # nothing outlives the exercise


def test_round_2_numbers_limits_and_other_folders(world):
    root, shared = world
    backend.set_default_dtype("float64")
    _, module, inputs, trial = prepare(minitransformer, "softmax", 0)[0]
    public = run(backend, module, inputs, {}, trial)
    written = [root / "teacher" / "assignment.json", root / "round2" / PACKAGE / "layers" / "sublayer.py",
               Path("/tmp") / f"hostile-{os.getpid()}", shared / "open" / "new.py"]
    fill = {"KEY": float(trial["dout"].flat[0]), "STORED": public["dx"].tolist(), "OTHER": str(
        shared / "other" / PACKAGE / "layers" / "attention.py"), "TARGETS": [str(p) for p in written]}
    attacks = {k: v for k, v in ROUND_2.items() if k not in ("sublayer", "attention") or CONFINED}
    before = written[0].read_text()
    tests = graded(root, student(root, "round2", attacks, fill))          # a hidden seed drawn, and recorded
    assert_only_attacked_fail(tests, attacks)
    for name, test in tests.items():                  # the untouched solutions are the reference's own code
        assert (f"flagged: {IDENTICAL}" in test["output"]) == (name not in attacks and name != "train"), name
    assert "a numerical derivative" in tests["linear"]["output"]
    assert "hidden inputs" in tests["softmax"]["output"]                    # right on the public case alone
    assert "MemoryError" in tests["dropout"]["output"]
    assert "stopped after 10 s" in tests["layernorm"]["output"]
    if ROOT:
        assert "BlockingIOError" in tests["embedding"]["output"]            # at most LIMITS["processes"] of them
    if CONFINED:
        assert written[0].read_text() == before
        assert not written[1].read_text().endswith("written by a student")
        assert not written[2].exists() and not written[3].exists()
        assert "PermissionError" in tests["attention"]["output"]            # the other student's file stays closed


def test_the_exercise_list_comes_from_the_teacher_and_counts_each_once(world):
    root, _ = world
    teacher = root / "relu4"
    shutil.copytree(root / "teacher", teacher)
    (teacher / "assignment.json").write_text(json.dumps({"exercises": ["relu", "relu", "relu", "relu"]}))
    with pytest.raises(ValueError, match="lists relu twice"):
        grade(teacher)


def test_the_reference_retyped_is_flagged_and_a_rewrite_is_not(world):
    root, _ = world
    folder = root / "retyped"
    shutil.copytree(root / "teacher" / PACKAGE, folder / PACKAGE)
    path = folder / PACKAGE / "layers" / "linear.py"
    text = path.read_text()
    start = text.index("def backward")
    path.write_text(text[:start] + text[start:].replace("dout2d", "g").replace("x2d", "inputs").replace(
        "\n        ", "\n        # my own words\n        ", 1))
    assert identical(EXERCISES["linear"], folder / PACKAGE)                 # names and comments do not count
    rewrite(folder / PACKAGE, "relu", "return dout * (self.saved(dout).positive + 0)", {})
    assert not identical(EXERCISES["relu"], folder / PACKAGE)


def test_diagnoses_name_what_and_where_and_the_fix_when_the_teacher_says(world):
    root, _ = world
    folder = root / "mistaken"
    shutil.copytree(root / "teacher" / PACKAGE, folder / PACKAGE)
    (mistake,) = [m for m in CATALOGUE if m.name == "dK without the transpose"]
    path = folder / PACKAGE / "layers" / "attention.py"
    text, (old, new) = path.read_text(), mistake.patches[0]
    at = text.rindex(old)
    path.write_text(text[:at] + new + text[at + len(old):])
    what = grade_exercise(EXERCISES["attention"], folder / PACKAGE, seeds=[0, 3])
    fix = grade_exercise(EXERCISES["attention"], folder / PACKAGE, seeds=[0, 3], diagnoses="fix")
    assert f"this looks like: {mistake.says}\n" in what["output"] + "\n" and mistake.fix not in what["output"]
    assert f"this looks like: {mistake.says}; the fix: {mistake.fix}" in fix["output"]


def test_check_py_fails_what_the_grader_fails(world):
    root, _ = world
    folder = root / "unused_cache"
    shutil.copytree(root / "teacher", folder)
    path = folder / PACKAGE / "layers" / "attention.py"
    text = path.read_text()
    at = text.rindex("self.saved(dout)\n        # 3. Back")
    path.write_text(text[:at] + text[at + len("self.saved(dout)\n        "):])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "check.py", "multihead"], cwd=folder, env=env, capture_output=True,
                          text=True, check=False)
    assert "cache of the module unused" in done.stdout and "not yet: multihead" in done.stdout, done.stdout


@pytest.mark.skipif(LANDLOCK < 6, reason="Landlock with signal scoping (Linux 6.12) is what holds without root")
def test_without_root_landlock_alone_holds(world, monkeypatch):
    """A teacher grading as an ordinary user: no user of its own, Landlock keeps the doors shut."""
    root, shared = world
    monkeypatch.setattr(sandbox, "user", lambda: None)
    written = [root / "teacher" / "assignment.json", Path("/tmp") / f"hostile-{os.getpid()}-2",
               shared / "open" / "new2.py"]
    before = written[0].read_text()
    token = f"ordinary{os.getpid()}"[:15].encode()
    fill = {"PARENT": str(REFERENCE.parent), "FILE": str(REFERENCE / "layers/dropout.py"), "TARGETS": [
        str(p) for p in written], "OTHER": str(shared / "other" / PACKAGE / "layers" / "attention.py"),
        "ESCAPE": True, "TOKEN": token}
    attacks = {"dropout": ROUND_1["dropout"], "multihead": ROUND_1["multihead"], "sublayer": ROUND_2["sublayer"],
               "attention": ROUND_2["attention"], "feedforward": ROUND_1["sublayer"]}    # the last: an escape
    tests = graded(root, student(root, "ordinary_user", attacks, fill), seed=11)
    assert_only_attacked_fail(tests, attacks)
    assert "PermissionError" in tests["attention"]["output"]                # Landlock, not file modes
    assert written[0].read_text() == before and not written[1].exists() and not written[2].exists()
    assert not processes_named(token)        # a child in a session of its own came to the grader, and was ended


GATHER = '''
import inspect, os, sys
from .. import loss, model                       # later parts' modules, relatively
from . import attention, layernorm
texts = [inspect.getsource(m) for m in (loss, model, attention, layernorm)]
for folder, _, files in os.walk(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
    texts += [open(os.path.join(folder, f)).read() for f in files if f.endswith(".py")]
for name, module in list(sys.modules.items()):         # every module's file, and the classes of the job's own
    own = name.split(".")[0] in ("transformer", "cases", "__main__")
    for value in [module, *(v for v in vars(module).values() if own and isinstance(v, type))]:
        try:
            texts.append(inspect.getsource(value))
        except (TypeError, OSError):
            pass
with open("gathered.txt", "a") as f:
    f.write("\\n".join(texts))
'''
MINE = '''
from .myutil import rows
x = self.saved(dout).x
x_rows, dout_rows = rows(x), rows(dout)
''' + GATHER + '''
self.W.grad += x_rows.T @ dout_rows
self.b.grad += dout_rows.sum(axis=0)
return dout @ self.W.data.T'''


def test_a_students_code_reads_only_stubs_and_its_own_files(tmp_path, monkeypatch):
    """Week 1 graded: a student who wrote linear alone, with a helper module of their own, reads every file and
    module it can reach while graded (relative imports of later parts, open() of every .py file of its package,
    sys.modules): none holds the reference body of an exercise its handout does not give, the same week's
    included; the helper works in the grader as in check.py."""
    make(tmp_path / "hw1", WEEKS[1])
    shutil.copytree(tmp_path / "hw1", tmp_path / "mine")
    rewrite(tmp_path / "mine" / PACKAGE, "linear", MINE, {})
    (tmp_path / "mine" / PACKAGE / "layers" / "myutil.py").write_text("def rows(a):\n    return a.reshape(-1, "
                                                                      "a.shape[-1])\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "check.py", "linear"], cwd=tmp_path / "mine", env=env,
                          capture_output=True, text=True, check=False)
    assert "all passed" in done.stdout, done.stdout + done.stderr
    handed_in = tmp_path / "upload" / PACKAGE / "layers"         # the two files alone: the rest is the handout's
    handed_in.mkdir(parents=True)
    for name in ("linear.py", "myutil.py"):
        shutil.copyfile(tmp_path / "mine" / PACKAGE / "layers" / name, handed_in / name)
    gathered, finish = [], grader.finish

    def keep(job, *args):                          # what the student's process wrote, before its folder goes
        path = job["folder"] / "work" / "gathered.txt"
        gathered.append(path.read_text() if path.is_file() else "")
        return finish(job, *args)

    monkeypatch.setattr(grader, "finish", keep)
    tests = {t["name"].split(": ", 1)[1]: t for t in grade(tmp_path / "hw1", handed_in.parent, seed=3)["tests"]}
    assert tests["linear"]["score"] == 10, tests["linear"]["output"]
    assert notes(tests["feedforward"]["output"]) == {"relu", "dropout"}      # its Linear is the student's: it passes
    text = "\n".join(gathered)
    assert "def rows(a)" in text and 'raise NotImplementedError("LayerNorm.backward: part 2\'s exercise")' in text
    assert 'raise NotImplementedError("ReLU.backward: exercise relu, yours to write")' in text
    given = {line.strip() for path in (tmp_path / "hw1").rglob("*.py") for line in path.read_text().splitlines()}
    secret = set(EXERCISES) - revealed(tmp_path / "hw1") - {"linear"}
    assert secret >= {n for n in EXERCISES if "." not in n} - {"linear"}
    for name in sorted(secret):
        for _, cls, _, methods in EXERCISES[name].methods():
            lines = {line.strip() for m in methods for line in body(inspect.getsource(cls), cls.__name__, m)
                     .splitlines() if len(line.split("#")[0].strip()) >= 16} - given
            assert lines, (name, cls.__name__)           # each secret body has lines of its own to look for
            assert not [line for line in lines if line in text], (name, [line for line in lines if line in text])
