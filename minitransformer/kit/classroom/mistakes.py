"""The mistake catalogue: the classic errors of hand-written backprop, each a patch of the reference method's
source (exercises.json), compiled in the reference module, so it follows the core as the core changes (a patch
whose text is gone fails the catalogue's tests, not a student). A student whose gradients equal a mutant's made
that mistake. Mistakes no gradient check can see carry why they do no harm."""

from __future__ import annotations

import inspect
import sys
import textwrap
from dataclasses import dataclass

from .exercises import EXERCISES, TABLE


@dataclass(frozen=True)
class Mistake:
    exercise: str
    name: str
    patches: tuple          # ((old, new), ...): the first old text found once in one of the exercise's methods
    says: str               # the diagnosis, addressed to the student
    harmless: str = ""      # for a mistake no gradient check can see: why it does no harm

    @property
    def visible(self) -> bool:
        return not self.harmless


CATALOGUE = [Mistake(row["name"], m["name"], tuple(map(tuple, m["patches"])), m.get("says", ""), m.get("harmless", ""))
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
    lines = [f"{m.exercise:<14} {m.name}\n{'':<14} " + (m.says or m.harmless.replace(
             "harmless:", "invisible to a gradient check, and harmless:")) for m in CATALOGUE]
    return "\n".join(lines) + (f"\n{sum(m.visible for m in CATALOGUE)} mistakes a gradient check names, "
                               f"{sum(not m.visible for m in CATALOGUE)} it cannot see, over "
                               f"{len({m.exercise for m in CATALOGUE})} exercises")
