"""``minitransformer gradcheck``: the table of every layer's largest relative gradient error, for class."""

import numpy

from minitransformer import backend, gradcheck
from minitransformer.gradcheck_cases import gradcheck_cases


def cmd_gradcheck(args) -> int:
    previous = backend.get_default_dtype()
    backend.set_default_dtype("float64")                  # finite differences in float32 are noise
    backend.manual_seed(args.seed)
    try:
        rows = []
        for label, module, inputs in gradcheck_cases(numpy.random.default_rng(args.seed)):
            report = gradcheck.check(module, *inputs, max_entries=args.max_entries, seed=args.seed)
            rows.append((label, len(report.rows), report.max_error, report.ok))
            if args.verbose:
                print(report.table(), end="\n\n")
    finally:
        backend.set_default_dtype(previous)
    width = max(len(r[0]) for r in rows)
    print(f"{'layer':<{width}}  {'tensors':>7}  {'max rel. error':>14}  result")
    print("-" * (width + 35))
    for label, n, err, ok in rows:
        print(f"{label:<{width}}  {n:>7}  {err:>14.2e}  {'ok' if ok else 'FAIL'}")
    failed = [r[0] for r in rows if not r[3]]
    print(f"float64, central differences on up to {args.max_entries} entries per tensor, "
          f"bound {gradcheck.DEFAULT_TOLERANCE:.0e}: "
          + ("all passed" if not failed else f"FAILED: {', '.join(failed)}"))
    return 0 if not failed else 1
