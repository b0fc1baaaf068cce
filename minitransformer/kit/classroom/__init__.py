"""The classroom: assignments made from the core (maker.make), graded by gradient checks that name the mistake
(grader.grade); ``classroom list | bugs`` print EXERCISES and CATALOGUE."""

from .exercises import CATALOGUE, EXERCISES, PARTS, TRAIN, Mistake, build, choose
from .grader import grade
from .maker import make

__all__ = ["CATALOGUE", "EXERCISES", "PARTS", "TRAIN", "Mistake", "build", "choose", "grade", "make"]
