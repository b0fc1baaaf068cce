"""The classroom: assignments made from the core (maker.make), graded by gradient checks that name the mistake
(grader.grade); ``classroom list | bugs`` print EXERCISES and CATALOGUE."""

from .exercises import EXERCISES, PARTS, TRAIN, choose
from .grader import grade
from .maker import make
from .mistakes import CATALOGUE, Mistake, build

__all__ = ["CATALOGUE", "EXERCISES", "PARTS", "TRAIN", "Mistake", "build", "choose", "grade", "make"]
