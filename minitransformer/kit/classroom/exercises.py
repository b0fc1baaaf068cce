"""The exercises, from one table (exercises.json) that also holds each one's mistakes (mistakes.py): the method
bodies a student writes, in which part, and the hint each stub keeps. ``linear.forward`` is Linear's forward;
``linear`` its backward: every method of the class whose name holds "backward" (``self_attn_backward`` too)."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

TABLE = json.loads(Path(__file__).with_name("exercises.json").read_text(encoding="utf-8"))
PARTS = {int(part): title for part, title in TABLE["parts"].items()}


@dataclass(frozen=True)
class Exercise:
    name: str
    part: int
    targets: tuple          # ((file under the package, class, "backward" or "forward"), ...)
    sentence: str           # what the student writes, in one sentence
    hint: str               # kept in the stub, with the class docstring (equation, shapes) and the def line
    points: int = 10

    def methods(self):
        """(file, reference class, target method, [every method of the class it covers]) per target."""
        for file, cls_name, method in self.targets:
            cls = getattr(importlib.import_module(f"minitransformer.{file[:-3].replace('/', '.')}"), cls_name)
            yield file, cls, method, [n for n, v in vars(cls).items()
                                      if callable(v) and (n == method or method == "backward" and "backward" in n)]


def _exercise(row: dict) -> Exercise:
    method = "forward" if row["name"].endswith(".forward") else "backward"
    targets = tuple((*target.split(":"), method) for target in row["targets"])   # "file:Class": (file, Class, method)
    return Exercise(row["name"], row["part"], targets, row["sentence"], row["hint"])


# Part by part, each forward before its backward: the order a student works in.
EXERCISES = {row["name"]: _exercise(row) for row in TABLE["exercises"]}
TRAIN = Exercise("train", 3, (), TABLE["train"], "")


def choose(names) -> list:
    """The exercises named (a list or a comma-separated string), in the table's order; all backward ones if None."""
    if names is None:
        return [e for e in EXERCISES.values() if "." not in e.name]
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    unknown = [n for n in wanted if n not in EXERCISES]
    if unknown or not wanted:
        raise ValueError(f"classroom: --exercises must name exercises among {', '.join(EXERCISES)}; "
                         f"got {', '.join(unknown) or 'none'}")
    return [e for e in EXERCISES.values() if e.name in wanted]
