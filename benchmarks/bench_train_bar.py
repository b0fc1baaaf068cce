"""Where the classroom's training exercise puts its bar, measured: the reference solution's exact match on the copy
task over many seeds (a correct student must clear the bar on whatever seed the grader draws), and each mistake of
the catalogue trained the same way (which of them a loss that stalls would show). Prints figures; asserts nothing.

    python benchmarks/bench_train_bar.py --seeds 200 --first 1000
    python benchmarks/bench_train_bar.py --seeds 0 --mistakes
"""

from __future__ import annotations

import argparse
import time

import numpy

import minitransformer as mt
from minitransformer.kit.classroom import train_copy
from minitransformer.kit.classroom.exercises import CATALOGUE, build


class WithMistake:
    """The package as ``train_copy.train`` sees it, but every module it builds of a class the mistake changes has the
    mutant's class instead (a subclass overriding one method)."""

    def __init__(self, swap: dict):
        self.swap, self.changed = swap, 0

    def __getattr__(self, name):
        return getattr(mt, name)

    def _mutate(self, built):
        for m in built.modules() if hasattr(built, "modules") else [built]:
            if type(m) in self.swap:
                m.__class__, self.changed = self.swap[type(m)], self.changed + 1
        return built

    def Transformer(self, config):                      # noqa: N802 - the package's names
        return self._mutate(mt.Transformer(config))

    def CrossEntropyLoss(self, **kwargs):               # noqa: N802
        return self._mutate(mt.CrossEntropyLoss(**kwargs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=50, help="seeds the reference trains on")
    parser.add_argument("--first", type=int, default=0, help="the first of them")
    parser.add_argument("--mistakes", action="store_true", help="also train each visible mistake, on seed 0")
    args = parser.parse_args()
    mt.set_default_dtype("float64")                 # as the grader runs it
    scores, start = [], time.perf_counter()
    for seed in range(args.first, args.first + args.seeds):
        scores.append(train_copy.train(mt, seed=seed, log=lambda line: None)["exact_match"])
    if scores:
        s = numpy.array(scores)
        print(f"reference, seeds {args.first}..{args.first + args.seeds - 1}: exact match min {s.min():.2f}, "
              f"1st percentile {numpy.percentile(s, 1):.2f}, median {numpy.median(s):.2f}, mean {s.mean():.3f}; "
              f"{(s < train_copy.LEARNS).sum()} below the bar {train_copy.LEARNS:.0%}; "
              f"{(time.perf_counter() - start) / len(s):.1f} s a run")
    if not args.mistakes:
        return
    for mistake in [m for m in CATALOGUE if m.visible]:
        package = WithMistake(build(mistake))
        try:
            trained = train_copy.train(package, seed=0, log=lambda line: None)["model"]
            model = mt.Transformer(train_copy.config(mt))            # scored as the grader scores: its own model
            model.load_state_dict(trained.state_dict())
            exact = train_copy.exact_match(mt, model, 0)
        except (ArithmeticError, ValueError, RuntimeError) as err:     # what the student would see fail
            print(f"{mistake.exercise:<14} {mistake.name:<48} fails: {type(err).__name__}")
            continue
        print(f"{mistake.exercise:<14} {mistake.name:<48} {package.changed:2d} modules  exact match {exact:.2f}  "
              f"{'clears the bar' if exact >= train_copy.LEARNS else 'stopped by the bar'}")


if __name__ == "__main__":
    main()
