"""Making an assignment: the core in its layout (DIR/transformer/), chosen method bodies replaced by stubs that
keep the def line (shapes) and docstrings (equation), add the hint and raise NotImplementedError; the student's
README, a notebook per part, check.py, cases.py, train_copy.py and assignment.json (for the grader) beside it."""

from __future__ import annotations

import ast
import json
import shutil
import textwrap
from pathlib import Path

import minitransformer

from .exercises import PARTS, TRAIN, choose
from .grader import PACKAGE

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


def stub(text: str, file: str, exercises: list, solutions: bool) -> str:
    """The file with the body of every method an exercise names replaced (hint kept, body raising)."""
    lines, edits = text.splitlines(keepends=True), []
    classes = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)}
    for e in exercises:
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
                hint = textwrap.wrap(f"EXERCISE {e.name} (part {e.part}): {text}", 110 - len(indent),
                                     initial_indent=f"{indent}# ", subsequent_indent=f"{indent}#   ")
                raises = f'raise NotImplementedError("{cls.__name__}.{fn.name}: exercise {e.name}, yours to write")'
                body = lines[start:fn.end_lineno] if solutions else [f"{indent}{raises}\n"]
                edits.append((start, fn.end_lineno, [h + "\n" for h in hint] + body))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = new
    return "".join(lines)


def notebook(part: int, exercises: list) -> dict:
    def cell(kind, text):
        extra = {"execution_count": None, "outputs": []} if kind == "code" else {}
        return {"cell_type": kind, "metadata": {}, "source": text.strip("\n").splitlines(keepends=True), **extra}

    cells = [cell("markdown", f"# Part {part}: {PARTS[part]}\n\nEach section names the method you write, in which "
                              "file, and checks it on your own code: run the cell after each exercise."),
             cell("code", "import numpy as np\n\nimport transformer as mt\nfrom check import check\n\n"
                          "mt.set_default_dtype('float64')   # gradient checks need float64")]
    for e in exercises:
        file, cls_name, _ = e.targets[0]
        cells += [cell("markdown", f"## `{e.name}`: {cls_name} in `transformer/{file}`\n\n{e.sentence}\n\n"
                                   f"*Hint:* {e.hint}"), cell("code", f"check({e.name!r})")]
    if part == 3:
        cells += [cell("markdown", f"## `train`\n\n{TRAIN.sentence} Every step runs your forward, your backward "
                                   "and the optimiser: a wrong gradient shows as a loss that stalls."),
                  cell("code", "from train_copy import train\n\ntrain(mt)")]
    return {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                        "name": "python3"}}, "nbformat": 4, "nbformat_minor": 4}


def make(directory, exercises=None, solutions: bool = False) -> list:
    """Write the assignment (or with solutions=True the teacher's copy) into `directory`, which must be new or
    empty: nothing already there is overwritten. Returns the exercises written."""
    directory, chosen = Path(directory), choose(exercises)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise FileExistsError(f"classroom make: {directory} already exists and is not an empty folder; "
                              f"give a new folder (nothing there is overwritten)")
    root, here = Path(minitransformer.__file__).parent, Path(__file__).parent
    for file, text in core_files().items():
        (directory / PACKAGE / file).parent.mkdir(parents=True, exist_ok=True)
        (directory / PACKAGE / file).write_text(stub(text, file, chosen, solutions))
    for file in ("cases.py", "check.py", "train_copy.py"):
        shutil.copyfile(here / file, directory / file)
    parts = sorted({e.part for e in chosen})
    order = [f"{i}. `{e.name}` (part {e.part}, {e.points} points, `{PACKAGE}/{e.targets[0][0]}`, class "
             f"`{e.targets[0][1]}`): {e.sentence}" for i, e in enumerate(chosen, 1)]
    order += [f"{len(chosen) + 1}. `train` (part 3, {TRAIN.points} points): {TRAIN.sentence}"] if 3 in parts else []
    (directory / "README.md").write_text((here / "student_readme.md").read_text(encoding="utf-8").format(
        parts="; ".join(f"part {p}, {PARTS[p]}" for p in parts), order="\n".join(order)))
    for part in parts:
        name = f"part{part}_{PARTS[part].split(',')[0].replace(' ', '_')}.ipynb"
        (directory / name).write_text(json.dumps(notebook(part, [e for e in chosen if e.part == part]), indent=1))
    (directory / "assignment.json").write_text(json.dumps(
        {"package": PACKAGE, "exercises": [e.name for e in chosen],
         "made_by": f"minitransformer {minitransformer.__version__}"}, indent=1) + "\n")
    return chosen
