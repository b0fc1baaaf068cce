"""How long the viewer's page takes to build and how large it is: one sentence through the small preset (the fast
tier, as `minitransformer explain` loads a run; the core beside it), at several source lengths. The model is
untrained, so greedy decoding runs to the length cap (49 output tokens): the slowest case for a given source.

    PYTHONPATH=. python benchmarks/bench_explain.py    # 10, 20, 40 and 80 tokens (80 is cut to 50), 5 repeats
    PYTHONPATH=. python benchmarks/bench_explain.py --lengths 40 --repeats 10

    PYTHONPATH=. python benchmarks/bench_explain.py --browser   # also: each view's drawing time in Chromium

Prints, per length: the tokens shown (source, target), the median wall and CPU seconds of ``viz.explain``
(decoding, a forward and a backward pass, each head's part of the gradient taken back to the embeddings, packing;
with one BLAS thread the CPU time is what an idle core would take, on a busy machine too), the seconds of writing
the HTML, and the page's size in MB. --browser opens the
fast tier's page of each length in headless Chromium (Debian's chromium and chromium-driver, through Selenium) and
prints the milliseconds from navigation to the first view drawn, and those of drawing each view (a tab's click).
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


def _source(model, length: int) -> list:
    return [int(i) for i in numpy.random.default_rng(length).integers(4, model.config.src_vocab_size, length)]


def measure(model, length: int, repeats: int) -> dict:
    src = _source(model, length)
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
            "build": statistics.median(build), "cpu": statistics.median(cpu), "write": statistics.median(write),
            "mb": size / 1e6}


def browser_times(pages: dict) -> None:
    """Milliseconds to open each page and to draw each of its views, in headless Chromium."""
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as profile:
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                     f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=webdriver.ChromeService("/usr/bin/chromedriver"), options=options)
        views = ("heads", "model", "qk", "gradient", "decoding", "masks")
        print(f"{'source':>6} {'open ms':>8} " + " ".join(f"{v + ' ms':>11}" for v in views))
        for length, path in pages.items():
            driver.get(path.as_uri())
            opened = driver.execute_script("const t = performance.getEntriesByType('navigation')[0];"
                                           "return t.loadEventEnd - t.startTime")
            drawn = [driver.execute_script("const t = performance.now(); document.getElementById(arguments[0])"
                                           ".click(); return performance.now() - t", f"tab-{v}") for v in views]
            print(f"{length:>6} {opened:>8.0f} " + " ".join(f"{ms:>11.0f}" for ms in drawn))
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 40, 80])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--browser", action="store_true", help="also time each view's drawing in headless Chromium")
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
    folder, pages = tempfile.TemporaryDirectory(), {}
    for name, model in (("fast", fast), ("core", core)):
        viz.explain(model, [5, 6, 7])                     # first call: imports and caches warm
        for length in args.lengths:
            r = measure(model, length, args.repeats)
            if args.browser and name == "fast":
                pages[length] = Path(folder.name) / f"page-{length}.html"
                viz.explain(model, _source(model, length)).save(pages[length])
            print(f"{name:<5} {length:>6} {str(r['shown']):>13} {r['build']:>8.3f} {r['cpu']:>6.3f} "
                  f"{r['write']:>8.3f} {r['mb']:>8.2f}")
    if pages:
        browser_times(pages)
    folder.cleanup()


if __name__ == "__main__":
    main()
