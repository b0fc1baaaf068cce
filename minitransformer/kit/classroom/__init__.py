"""The classroom: assignments made from the core, graded by gradient checks that name the mistake.

    minitransformer classroom make DIR [--exercises NAME,...] [--solutions]    (maker.make)
    minitransformer classroom grade DIR [--json FILE]                          (grader.grade)
    minitransformer classroom list | bugs          (exercises.EXERCISES, mistakes.CATALOGUE)
"""

from .exercises import EXERCISES, PARTS, TRAIN, choose
from .grader import grade
from .maker import make
from .mistakes import CATALOGUE, Mistake, build

__all__ = ["CATALOGUE", "EXERCISES", "PARTS", "TRAIN", "Mistake", "build", "choose", "grade", "make"]
