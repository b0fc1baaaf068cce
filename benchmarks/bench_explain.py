"""How long the viewer's page takes to build and how large it is: one sentence through the small preset (the fast
tier, as `minitransformer explain` loads a run; the core beside it), at several source lengths. The model is
untrained, so greedy decoding runs to the length cap (49 output tokens): the slowest case for a given source.

    PYTHONPATH=. python benchmarks/bench_explain.py    # 10, 20, 40 and 80 tokens (80 is cut to 50), 5 repeats
    PYTHONPATH=. python benchmarks/bench_explain.py --lengths 40 --repeats 10

Prints, per length: the tokens shown (source, target), the median wall and CPU seconds of ``viz.explain``
(decoding, two forward passes, one backward, packing; with one BLAS thread the CPU time is what an idle core would
take, on a busy machine too), the seconds of writing the HTML, and the page's size in MB.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy

import minitransformer as mt
from minitransformer.kit.running import viz
from minitransformer.kit.running.runs import choose_blas_threads


def measure(model, length: int, repeats: int) -> dict:
    src = [int(i) for i in numpy.random.default_rng(length).integers(4, model.config.src_vocab_size, length)]
    build, cpu, write = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "page.html"
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            explanation = viz.explain(model, src)
            build.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            start = time.perf_counter()
            explanation.save(path)
            write.append(time.perf_counter() - start)
        size = path.stat().st_size
    return {"shown": (len(explanation.data["src"]), len(explanation.data["tgt_in"])),
            "build": statistics.median(build), "cpu": statistics.median(cpu), "write": statistics.median(write), "mb": size / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 40, 80])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    mt.manual_seed(0)
    config = mt.TransformerConfig.preset("small", src_vocab_size=8000, tgt_vocab_size=8000)
    core = mt.Transformer(config)
    fast = mt.fast.Transformer(config)
    fast.load_state_dict(core.state_dict())
    threads = choose_blas_threads(config)                 # as `minitransformer explain` does
    print(f"small preset: d_model {config.d_model}, {config.num_heads} heads, {config.num_encoder_layers}+"
          f"{config.num_decoder_layers} layers, vocabularies of 8000; median of {args.repeats}; BLAS threads {threads}")
    print(f"{'tier':<5} {'source':>6} {'shown (S, T)':>13} {'build s':>8} {'CPU s':>6} {'write s':>8} {'page MB':>8}")
    for name, model in (("fast", fast), ("core", core)):
        viz.explain(model, [5, 6, 7])                     # first call: imports and caches warm
        for length in args.lengths:
            r = measure(model, length, args.repeats)
            print(f"{name:<5} {length:>6} {str(r['shown']):>13} {r['build']:>8.3f} {r['cpu']:>6.3f} {r['write']:>8.3f} {r['mb']:>8.2f}")


if __name__ == "__main__":
    main()
