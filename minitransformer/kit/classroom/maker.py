"""Making an assignment: the core in its layout (DIR/transformer/), chosen method bodies replaced by stubs that
keep the def line (shapes) and docstrings (equation), add the hint and raise NotImplementedError; the student's
README, a notebook per part, check.py, cases.py, train_copy.py (with part 3) and assignment.json beside it.

A handout holds only what is due: every exercise of a part neither handed out nor revealed is stubbed too (in the
solutions copy as well), so week 1's zip never carries week 2's answers; `reveal` hands out a part's reference
bodies once its deadline has passed."""

from __future__ import annotations

import ast
import json
import shutil
import textwrap
from pathlib import Path

import minitransformer

from .exercises import EXERCISES, PARTS, TRAIN, choose

PACKAGE = "transformer"            # DIR/transformer/: the student's copy of the core
COMPARISONS = "# COMPARISONS:"     # where layers/__init__.py's imports of the comparison layers begin
INIT = '''"""Your copy of minitransformer's core: the Transformer of "Attention Is All You Need" in NumPy.
Shape letters: B batch, S source length, T target length, D d_model, H heads, Dk head size, F d_ff, V vocabulary."""

from . import backend, decoding, gradcheck, layers, masks, model, optim
from .backend import get_default_dtype, manual_seed, set_backend, set_default_dtype, to_numpy
from .loss import CrossEntropyLoss
from .model import Transformer, TransformerConfig
from .module import Module, ModuleList, Parameter
'''


def core_files() -> dict:
    """{file under the package: text} of exactly the core, as a student receives it: the package's top-level modules
    and layers/, without the layers kept only for the paper's comparisons (layers/__init__.py ends above them); the
    fast tier and the kit live in folders of their own, which stay out."""
    root = Path(minitransformer.__file__).parent
    layers_init = (root / "layers" / "__init__.py").read_text()
    comparisons = layers_init[layers_init.index(COMPARISONS):]
    files = {"__init__.py": INIT, "layers/__init__.py": layers_init[:layers_init.index(COMPARISONS)].rstrip() + "\n"}
    for path in [*root.glob("*.py"), *root.glob("layers/*.py")]:
        file = path.relative_to(root).as_posix()
        if file not in files and file != "__main__.py" and f"from .{path.stem} import" not in comparisons:
            files[file] = path.read_text()
    return dict(sorted(files.items()))


def stub(text: str, file: str, exercises: list, solutions: bool, withheld: tuple = ()) -> str:
    """The file with the body of every method an exercise names replaced (hint kept, body raising; the reference
    body kept with solutions), and every method of a `withheld` exercise (of a part neither handed out nor
    revealed) raising alone."""
    lines, edits = text.splitlines(keepends=True), []
    classes = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)}
    for e in [*exercises, *withheld]:
        for _, cls, method, names in (t for t in e.methods() if t[0] == file):
            for fn in (n for n in classes[cls.__name__].body if isinstance(n, ast.FunctionDef) and n.name in names):
                if ast.get_docstring(fn) is not None:
                    start = fn.body[0].end_lineno                # after the docstring
                else:
                    start = fn.body[0].lineno - 1                # after the def line(s) and before body comments
                    while start > fn.lineno and lines[start - 1].strip().startswith("#"):
                        start -= 1
                indent = " " * (fn.col_offset + 4)
                text = f"{e.sentence} Hint: {e.hint}" if fn.name == method else f"part of it, see {method}'s hint."
                if e in withheld:
                    why = f"part {e.part}'s exercise"
                    text = f"{why} {e.name}, not in this assignment."
                else:
                    text, why = f"EXERCISE {e.name} (part {e.part}): {text}", f"exercise {e.name}, yours to write"
                hint = textwrap.wrap(text, 110 - len(indent), initial_indent=f"{indent}# ",
                                     subsequent_indent=f"{indent}#   ")
                raises = f'raise NotImplementedError("{cls.__name__}.{fn.name}: {why}")'
                body = lines[start:fn.end_lineno] if solutions and e not in withheld else [f"{indent}{raises}\n"]
                edits.append((start, fn.end_lineno, [h + "\n" for h in hint] + body))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = new
    return "".join(lines)


def package(chosen, solutions: bool = False, withheld: tuple = ()) -> dict:
    """{file: text} of the student's copy of the core: the handout of `chosen` (with solutions, the teacher's copy),
    the exercises of `withheld` stubbed as well."""
    return {file: stub(text, file, chosen, solutions, withheld) for file, text in core_files().items()}


def write_package(target: Path, files: dict) -> None:
    for file, text in files.items():
        (target / file).parent.mkdir(parents=True, exist_ok=True)
        (target / file).write_text(text)


def notebook(part: int, exercises: list) -> dict:
    def cell(kind, text):
        extra = {"execution_count": None, "outputs": []} if kind == "code" else {}
        return {"cell_type": kind, "metadata": {}, "source": text.strip("\n").splitlines(keepends=True), **extra}

    cells = [cell("markdown", f"# Part {part}: {PARTS[part]}\n\nEach section names the method you write, in which "
                              "file, and checks it on your own code: run the cell after each exercise. A check runs "
                              "`check.py` in a fresh process, on your files as they are now; `mt` in this kernel "
                              "reloads the files you edit (autoreload): no kernel restart after a change."),
             cell("code", "%load_ext autoreload\n%autoreload 2\n\nimport sys\n\nimport numpy as np\n\n"
                          "import transformer as mt\n\n"
                          "mt.set_default_dtype('float64')   # gradient checks need float64")]
    for e in exercises:
        file, cls_name, _ = e.targets[0]
        cells += [cell("markdown", f"## `{e.name}`: {cls_name} in `transformer/{file}`\n\n{e.sentence}\n\n"
                                   f"*Hint:* {e.hint}"), cell("code", f"!{{sys.executable}} check.py {e.name}")]
    if part == 3:
        cells += [cell("markdown", f"## `train`\n\n{TRAIN.sentence} Every step runs your forward, your backward "
                                   "and the optimiser. It shows the pieces work together; it is no gradient check: "
                                   "this task is easy enough that most wrong gradients still learn it."),
                  cell("code", "!{sys.executable} train_copy.py")]
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                        "name": "python3"}}, "nbformat": 4, "nbformat_minor": 4}


def make(directory, exercises=None, solutions: bool = False, reveal=()) -> list:
    """Write the assignment (or with solutions=True the teacher's copy) into `directory`, which must be new or
    empty: nothing already there is overwritten. The exercises of the parts in `reveal` (ints, or "1,2") keep their
    reference bodies; those of any other part not handed out are stubbed. Returns the exercises written."""
    directory, chosen, reveal = Path(directory), choose(exercises), parts_of(reveal)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise FileExistsError(f"classroom make: {directory} already exists and is not an empty folder; "
                              f"give a new folder (nothing there is overwritten)")
    parts, withheld = sorted({e.part for e in chosen}), withheld_of(chosen, reveal)
    later = sorted({str(e.part) for e in withheld})
    here = Path(__file__).parent
    write_package(directory / PACKAGE, package(chosen, solutions, withheld))
    # train_copy.py trains the whole model: offered with part 3, whose README line and notebook run it.
    for file in ("cases.py", "check.py", *["train_copy.py"] * (3 in parts)):
        shutil.copyfile(here / file, directory / file)
    order = [f"{i}. `{e.name}` (part {e.part}, {e.points} points, `{PACKAGE}/{e.targets[0][0]}`, class "
             f"`{e.targets[0][1]}`): {e.sentence}" for i, e in enumerate(chosen, 1)]
    order += [f"{len(chosen) + 1}. `train` (part 3, {TRAIN.points} points): {TRAIN.sentence}"] if 3 in parts else []
    (directory / "README.md").write_text((here / "student_readme.md").read_text(encoding="utf-8").format(
        parts="; ".join(f"part {p}, {PARTS[p]}" for p in parts), order="\n".join(order),
        others=(f" The exercises of part{'s' * (len(later) > 1)} {' and '.join(later)} raise "
                "`NotImplementedError` too: they come with their own assignment." if withheld else "") +
               "".join(f" Part {p}'s methods hold the reference answers." for p in reveal if p not in parts),
        train="    python train_copy.py            # your whole model learns to copy strings (a few seconds)\n"
              if 3 in parts else ""))
    for part in parts:
        name = f"part{part}_{PARTS[part].split(',')[0].replace(' ', '_')}.ipynb"
        (directory / name).write_text(json.dumps(notebook(part, [e for e in chosen if e.part == part]), indent=1))
    (directory / "assignment.json").write_text(json.dumps(
        {"package": PACKAGE, "exercises": [e.name for e in chosen], "reveal": list(reveal),
         "made_by": f"minitransformer {minitransformer.__version__}"}, indent=1) + "\n")
    return chosen


def withheld_of(chosen, reveal=()) -> tuple:
    """The exercises of the parts neither handed out (with one of ``chosen``) nor revealed: their reference bodies
    stay out of the handout, the solutions and the grader's sandbox alike."""
    parts = {e.part for e in chosen}
    return tuple(e for e in EXERCISES.values() if e not in chosen and e.part not in (*parts, *reveal))


def parts_of(reveal) -> tuple:
    """The parts named by `reveal` ("1,2", [1, 2] or None), sorted; a ValueError naming --reveal otherwise."""
    items = reveal.split(",") if isinstance(reveal, str) else list(reveal or ())
    try:
        parts = sorted({int(str(p).strip()) for p in items if str(p).strip()})
    except ValueError:
        parts = None
    if parts is None or any(p not in PARTS for p in parts):
        raise ValueError(f"classroom: --reveal must name parts among {', '.join(map(str, PARTS))} (e.g. 1,2); "
                         f"got {reveal!r}")
    return tuple(parts)
