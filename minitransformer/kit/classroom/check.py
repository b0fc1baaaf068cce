"""Check your exercises yourself: `python check.py [EXERCISE ...]` (all of them by default). Each exercise's layer,
built from YOUR package on the grader's inputs (cases.py), against central differences: a table per case."""

import json
import sys
from pathlib import Path

import numpy

EXERCISES = json.loads((Path(__file__).parent / "assignment.json").read_text())["exercises"]


def check(name: str, seed: int = 0) -> bool:
    import transformer as mt
    from cases import cases

    mt.set_default_dtype("float64")
    mt.manual_seed(seed)
    passed = True
    for label, module, inputs in cases(mt, name, numpy.random.default_rng(seed)):
        try:
            report = mt.gradcheck.check(module, *inputs, seed=seed)
        except NotImplementedError as err:
            print(f"{name}: not written yet ({err})")
            return False
        print(f"{name}, {label}:\n{report}\n")
        passed = passed and report.ok
    return passed


if __name__ == "__main__":
    names = sys.argv[1:] or EXERCISES
    unknown = [n for n in names if n not in EXERCISES]
    if unknown:
        sys.exit(f"check.py: unknown exercise {unknown[0]!r}; choose among {', '.join(EXERCISES)}")
    failed = [n for n in names if not check(n)]
    print("all passed" if not failed else f"not yet: {', '.join(failed)}")
