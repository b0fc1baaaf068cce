"""The exercises and the mistake catalogue, from one table (exercises.json): the method bodies a student writes,
in which part, the hint each stub keeps, and the classic errors of hand-written backprop each exercise names.
``linear.forward`` is Linear's forward; ``linear`` its backward: every method of the class whose name holds
"backward" (``self_attn_backward`` too). A mistake is a patch of the reference method's source, compiled in the
reference module, so it follows the core as the core changes (a patch whose text is gone fails the catalogue's
tests, not a student); a student whose gradients equal a mutant's made that mistake."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import textwrap
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


@dataclass(frozen=True)
class Mistake:
    exercise: str
    name: str
    patches: tuple          # ((old, new), ...): the first old text found once in one of the exercise's methods
    says: str               # the diagnosis, addressed to the student
    harmless: str = ""      # for a mistake no gradient check can see: why it does no harm
    fix: str = ""           # how to put it right, shown when the teacher chooses diagnoses="fix"

    @property
    def visible(self) -> bool:
        return not self.harmless


CATALOGUE = [Mistake(row["name"], m["name"], tuple(map(tuple, m["patches"])), m.get("says", ""), m.get("harmless", ""),
                     m.get("fix", ""))
             for row in TABLE["exercises"] for m in row["mistakes"]]


def build(mistake: Mistake) -> dict:
    """{reference class: subclass with the mistaken method}, the mutant the grader compares a student with."""
    for _, cls, _, names in EXERCISES[mistake.exercise].methods():
        for name in names:
            source = textwrap.dedent(inspect.getsource(vars(cls)[name]))
            for old, new in mistake.patches:
                if source.count(old) == 1:
                    namespace = dict(vars(sys.modules[cls.__module__]))
                    code = compile(source.replace(old, new), f"<mistake: {mistake.name}>", "exec")
                    exec(code, namespace)  # noqa: S102 - the mutant is the point
                    return {cls: type(cls.__name__, (cls,), {name: namespace[name]})}
    raise LookupError(f"mistake {mistake.name!r}: none of {[o for o, _ in mistake.patches]} occurs once in "
                      f"the methods of exercise {mistake.exercise!r}")


def catalogue_text() -> str:
    """The catalogue as `minitransformer classroom bugs` prints it."""
    lines = [f"{m.exercise:<14} {m.name}\n{'':<14} " + (m.says and f"{m.says} (the fix: {m.fix})" or m.harmless.replace(
             "harmless:", "invisible to a gradient check, and harmless:")) for m in CATALOGUE]
    return "\n".join(lines) + (f"\n{sum(m.visible for m in CATALOGUE)} mistakes a gradient check names, "
                               f"{sum(not m.visible for m in CATALOGUE)} it cannot see, over "
                               f"{len({m.exercise for m in CATALOGUE})} exercises")
