"""Check your exercises yourself: `python check.py [EXERCISE ...]` (all of them by default). Each exercise's layer,
built from YOUR package on the grader's public inputs (cases.py), goes through the grader's own checks (shapes,
inputs left unchanged, the forward's cache taken back with self.saved(dout), no NaN, no forward inside backward),
then against central differences: a table per case. The grader adds hidden inputs and compares with the reference."""

import json
import sys
from pathlib import Path

EXERCISES = json.loads((Path(__file__).parent / "assignment.json").read_text())["exercises"]


def check(name: str, seed: int = 0) -> bool:
    import transformer as mt
    from cases import prepare, run

    mt.set_default_dtype("float64")
    try:
        built = prepare(mt, name, seed)
    except NotImplementedError as err:
        print(f"{name}: not written yet ({err})")
        return False
    passed = True
    for label, module, inputs, trial in built:
        got = run(mt.backend, module, inputs, {}, trial, str(Path(mt.__file__).parent), calls=[0, 0])
        if "error" in got:
            print(f"{name}: {got['shown']} (case {label}: FAIL)\n")
            passed = False
            continue
        mt.backend.set_rng_state(trial["before"])
        report = mt.gradcheck.check(module, *inputs, seed=seed)
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
