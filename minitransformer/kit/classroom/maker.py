"""Making an assignment: the core's files in the core's layout, chosen method bodies replaced by stubs.

    DIR/transformer/   the core and what it imports (`import transformer as mt` from DIR)
    DIR/README.md, DIR/partN_*.ipynb   what to write, in which order, how to check it, how it is graded
    DIR/check.py, DIR/cases.py, DIR/train_copy.py   self-check, the graded inputs, part 3's training run
    DIR/assignment.json   the exercises, for the grader
A stub keeps the def line (its shapes), the docstrings (the equation) and adds the hint; its body raises
NotImplementedError. With solutions=True the bodies stay: the two copies differ in the bodies alone.
"""

from __future__ import annotations

import ast
import json
import shutil
import textwrap
from pathlib import Path

import minitransformer

from .exercises import PARTS, TRAIN, choose
from .grader import PACKAGE
from .mistakes import method_names, module_of

CORE = ["module.py", "masks.py", "config.py", "model.py", "loss.py", "optim.py", "decoding.py", "gradcheck.py",
        "gradcheck_cases.py"]
INIT = '''"""Your copy of minitransformer's core: the Transformer of "Attention Is All You Need" in NumPy.
Shape letters: B batch, S source length, T target length, D d_model, H heads, Dk head size, F d_ff, V vocabulary."""

from . import backend, decoding, gradcheck, gradcheck_cases, layers, masks, model, optim
from .backend import get_default_dtype, manual_seed, set_backend, set_default_dtype, to_numpy
from .loss import CrossEntropyLoss
from .model import Transformer, TransformerConfig
from .module import Module, ModuleList, Parameter
'''


def core_files() -> list:
    """The core's files (relative to the package) and every top-level module they import (backend, checks...)."""
    root = Path(minitransformer.__file__).parent
    files = CORE + sorted(f"layers/{p.name}" for p in (root / "layers").glob("*.py"))
    for file in files:
        for node in ast.walk(ast.parse((root / file).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == (2 if "/" in file else 1):
                for name in [node.module] if node.module else [a.name for a in node.names]:
                    top = f"{name.split('.')[0]}.py"
                    if (root / top).is_file() and top not in files:
                        files.append(top)
    return files


def stub(text: str, file: str, exercises: list, solutions: bool) -> str:
    """The file with the body of every method an exercise names replaced (hint kept, body raising)."""
    lines, edits = text.splitlines(keepends=True), []
    classes = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)}
    for e in exercises:
        for target_file, cls_name, method in e.targets:
            if target_file != file:
                continue
            names = method_names(getattr(module_of(file), cls_name), method)
            for fn in (n for n in classes[cls_name].body if isinstance(n, ast.FunctionDef) and n.name in names):
                first = fn.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                    start = first.end_lineno                     # after the docstring
                else:
                    start = first.lineno - 1                     # after the def line(s) and before body comments
                    while start > fn.lineno and lines[start - 1].strip().startswith("#"):
                        start -= 1
                indent = " " * (fn.col_offset + 4)
                text = f"{e.sentence} Hint: {e.hint}" if fn.name == method else f"part of it, see {method}'s hint."
                hint = textwrap.wrap(f"EXERCISE {e.name} (part {e.part}): {text}", 110 - len(indent),
                                     initial_indent=f"{indent}# ", subsequent_indent=f"{indent}#   ")
                body = lines[start:fn.end_lineno] if solutions else [
                    f'{indent}raise NotImplementedError("{cls_name}.{fn.name}: exercise {e.name}, yours to write")\n']
                edits.append((start, fn.end_lineno, [h + "\n" for h in hint] + body))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = new
    return "".join(lines)


def readme(exercises: list) -> str:
    parts = sorted({e.part for e in exercises})
    order = "\n".join(f"{i}. `{e.name}` (part {e.part}, {e.points} points, `transformer/{e.targets[0][0]}`, "
                      f"class `{e.targets[0][1]}`): {e.sentence}" for i, e in enumerate(exercises, 1))
    return f"""# The Transformer, by hand: your assignment

You hold the core of a Transformer ("Attention Is All You Need") written in NumPy: about 2,500 lines in
`transformer/`, every layer with its forward and its backward side by side. Some method bodies are gone: each
raises `NotImplementedError` and keeps, above it, the equation (in the class docstring), the shapes (on the def
line) and a hint. You write them back. Everything else works, so an exercise you finish runs at once.

Parts: {"; ".join(f"part {p}, {PARTS[p]}" for p in parts)}. Work in this order:

{order}
{"" if 3 not in parts else f"{len(exercises) + 1}. `train` (part 3, {TRAIN.points} points): {TRAIN.sentence}"}

Each part has a notebook (`part1_*.ipynb`, ...; `jupyter lab` here). Rules: keep every signature and the names
the cache holds; `backward` ADDS into `.grad` (`+=`, never `=`) and returns the gradient of each float input;
leave `dout` and the inputs as they came (no `*=`); NumPy only.

## Check yourself

    python check.py linear          # one exercise: the gradient-check table of each case, then PASS or FAIL
    python check.py                 # every exercise
    python train_copy.py            # part 3: your whole model learns to copy strings (a few seconds)

`check.py` compares your backward with central differences (float64) on the grader's inputs; a row's "worst
entry" is where your gradient and the numeric one differ most.

## How you are graded

Each exercise is graded alone, with the reference for everything else: your forward against the reference's
output (odd sizes, padding, masks); your backward against central differences and the reference's every gradient,
with `.grad` already holding values (so `=` for `+=` shows). A failing gradient is matched against a catalogue of
classic backprop mistakes, and you are told which one it is. Each exercise runs alone with a time limit: an
exception, a NaN or an infinite loop costs that exercise only. All or nothing per exercise; part 3's `train`
counts when the copy task reaches 90% exact match on new strings.
"""


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
                                                        "name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}


def make(directory, exercises=None, solutions: bool = False) -> list:
    """Write the assignment (or with solutions=True the teacher's copy) into `directory`, which must be new or
    empty: nothing already there is overwritten. Returns the exercises written."""
    directory, chosen = Path(directory), choose(exercises)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise FileExistsError(f"classroom make: {directory} already exists and is not an empty folder; "
                              f"give a new folder (nothing there is overwritten)")
    root, here = Path(minitransformer.__file__).parent, Path(__file__).parent
    for file in core_files():
        target = directory / PACKAGE / file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(stub((root / file).read_text(), file, chosen, solutions))
    (directory / PACKAGE / "__init__.py").write_text(INIT)
    for file in ("cases.py", "check.py", "train_copy.py"):
        shutil.copyfile(here / file, directory / file)
    (directory / "README.md").write_text(readme(chosen))
    for part in sorted({e.part for e in chosen}):
        name = f"part{part}_{PARTS[part].split(',')[0].replace(' ', '_')}.ipynb"
        (directory / name).write_text(json.dumps(notebook(part, [e for e in chosen if e.part == part]), indent=1))
    (directory / "assignment.json").write_text(json.dumps(
        {"package": PACKAGE, "exercises": [e.name for e in chosen],
         "made_by": f"minitransformer {minitransformer.__version__}"}, indent=1) + "\n")
    return chosen
