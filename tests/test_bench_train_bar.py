"""benchmarks/bench_train_bar.py: the package it hands train_copy carries the mistake, and only it (the figures
themselves are the benchmark's)."""

import sys
from pathlib import Path

import minitransformer as mt
from minitransformer.kit.classroom import train_copy
from minitransformer.kit.classroom.exercises import CATALOGUE, build
from minitransformer.layers import Softmax

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_train_bar


def test_the_package_builds_each_module_of_the_mistaken_class_as_the_mutant_and_nothing_else():
    mistake = next(m for m in CATALOGUE if m.name == "softmax without the row sum")
    package = bench_train_bar.WithMistake(build(mistake))
    model = package.Transformer(train_copy.config(package))
    changed = [m for m in model.modules() if type(m).__name__ == "Softmax" and type(m) is not Softmax]
    assert changed and package.changed == len(changed) == sum(isinstance(m, Softmax) for m in model.modules())
    assert type(package.CrossEntropyLoss(ignore_index=0)) is mt.CrossEntropyLoss      # not this mistake's class
    assert package.manual_seed is mt.manual_seed                                         # the rest is the package
