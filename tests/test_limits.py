"""Inputs that would exhaust the machine: each refused before the work, or done within bounds, run in a
subprocess under a memory cap (RLIMIT_AS) and a time limit; the memory estimates held against what is
really allocated."""

import gzip
import os
import resource
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import budget, decoding
from minitransformer.kit import limits
from minitransformer.kit.data.batching import largest_batch
from minitransformer.fast.parallel import DataParallel
from minitransformer.kit.cli import main
from minitransformer.kit.data import datasets

ROOT = Path(__file__).resolve().parents[1]
CAP = 1 << 30                         # 1 GiB of address space, interpreter and NumPy included


def capped(code: str, memory: int = CAP, seconds: int = 120, env=None) -> subprocess.CompletedProcess:
    """Run Python code in a fresh interpreter limited to ``memory`` bytes of address space and ``seconds``."""
    prelude = f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))\n"
    env = {**{k: v for k, v in os.environ.items() if k != budget.ENV}, "PYTHONPATH": str(ROOT),
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=seconds, env=env, cwd=ROOT, check=False)


needs_rlimit = pytest.mark.skipif(not hasattr(resource, "RLIMIT_AS"), reason="no RLIMIT_AS on this system")


def config(**changes):
    sizes = {"src_vocab_size": 11, "tgt_vocab_size": 11, "d_model": 8, "num_heads": 2, "num_encoder_layers": 1,
             "num_decoder_layers": 1, "d_ff": 12, "dropout": 0.0, "tie_output": False, "max_len": 64}
    return mt.TransformerConfig(**{**sizes, **changes})


# ----------------------------------------------------------------------------- the cases, under a cap

@needs_rlimit
def test_a_thousand_heads_reading_a_thousand_tokens_is_refused_before_any_work():
    """1,024 heads of size 1 on 1,000 source tokens: a few KB of weights, 4 GB of attention scores per layer."""
    out = capped("""
        import numpy as np, minitransformer as mt
        from minitransformer import decoding
        cfg = mt.TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=2, num_heads=1024, d_k=1,
                                   num_encoder_layers=6, num_decoder_layers=6, d_ff=4, max_len=1024)
        model = mt.Transformer(cfg)
        try:
            decoding.greedy_decode(model, np.full((1, 1000), 5))
        except ValueError as err:
            print(err)
    """)
    assert out.returncode == 0, out.stderr
    message = out.stdout.strip()
    assert "\n" not in message and message.startswith("greedy_decode: decoding 1 x 1000 source tokens")
    assert "attention scores of each head" in message and "memory budget of 4.0 GiB" in message
    assert f"{budget.ENV}=" in message                              # how to raise it


@needs_rlimit
def test_a_deep_model_that_never_ends_a_sentence_stops_at_the_source_length_plus_50():
    """128 + 128 layers whose output never picks end-of-sentence, asked for a billion tokens: each sentence
    stops at its source length + 50, greedy and beam alike."""
    out = capped("""
        import numpy as np, minitransformer as mt
        from minitransformer import decoding
        cfg = mt.TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=2, num_heads=1, d_ff=2,
                                   num_encoder_layers=128, num_decoder_layers=128, dropout=0.0,
                                   tie_output=False, max_len=8192)
        model = mt.Transformer(cfg)
        model.projection.b.data[cfg.eos_id] -= 1e3
        src = np.array([[5] * 10, [6] * 4 + [0] * 6])
        print([len(o) for o in decoding.greedy_decode(model, src, max_len=10**9)],
              [len(o) for o in decoding.beam_search(model, src[1:, :4], beam_size=2)])
    """, seconds=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[60, 54] [54]"


@needs_rlimit
@pytest.mark.parametrize("call, refusal", [
    ("decoding.beam_search(model, src, beam_size=10**7)", "beam_search: beam_size must be at most 100, got 10000000"),
    ("decoding.beam_search(model, src, beam_size=100_000)", "beam_search: beam_size must be at most 100, got 100000"),
    ("DataParallel(model, mt.CrossEntropyLoss(), workers=10**6)", ("DataParallel: workers must be at most 1,024, "
                                                                  "got 1000000"))])
def test_huge_beams_and_worker_counts_are_refused_at_once(call, refusal):
    out = capped(f"""
        import numpy as np, minitransformer as mt
        from minitransformer import decoding
        from minitransformer.fast.parallel import DataParallel
        model = mt.Transformer(mt.TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=8, num_heads=2,
                                                    num_encoder_layers=1, num_decoder_layers=1, d_ff=8))
        src = np.full((2, 5), 5)
        try:
            {call}
        except ValueError as err:
            print(err)
    """, seconds=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == refusal


def _bomb(path: Path, line: bytes) -> Path:
    """A gzip of 2 MB or so that expands to 2 GiB: one 16 MiB member of ``line`` repeated, written 128 times
    (gzip readers go on to the next member)."""
    member = gzip.compress(line * ((16 << 20) // len(line)), compresslevel=9)
    with open(path, "wb") as f:
        f.writelines(member for _ in range(128))
    return path


@needs_rlimit
@pytest.mark.parametrize("line, limit", [pytest.param(b"a" * 99 + b"\n", "CHARS", id="long lines"),
                                         pytest.param(b"ab\n", "LINES", id="short lines"),
                                         pytest.param(b"\n", "LINES", id="empty lines"),
                                         pytest.param(b"a" * 100, "LINE", id="one endless line")])
def test_a_gzip_bomb_is_refused_at_the_limit_with_memory_near_it(tmp_path, line, limit):
    """2 GiB of text from a 2 MB file, as long lines, short lines, empty lines or one endless line: refused
    when the characters, lines or one line's characters read pass the limit, inside 1 GiB of address space."""
    path = _bomb(tmp_path / "train.de.gz", line)
    assert path.stat().st_size < 8 << 20
    out = capped(f"""
        from pathlib import Path
        from minitransformer.kit.data import datasets
        try:
            datasets._read_lines(Path({str(path)!r}))
        except ValueError as err:
            print(err)
    """)
    assert out.returncode == 0, out.stderr
    if limit == "LINE":
        assert out.stdout.strip() == (f"{path}, line 1: more than {limits.MAX_LINE_CHARS:,} characters, the most a "
                                      f"line of a corpus may hold (minitransformer.kit.limits.MAX_LINE_CHARS): refused")
        return
    what = {"CHARS": "characters", "LINES": "lines"}[limit]
    assert out.stdout.strip() == (f"{path}: more than {getattr(limits, 'MAX_CORPUS_' + limit):,} {what} once "
                                  f"decompressed, the most a corpus file may hold "
                                  f"(minitransformer.kit.limits.MAX_CORPUS_{limit}): refused")


@pytest.mark.parametrize("error, shown", [
    pytest.param(MemoryError(), "out of memory (in exhausted, test_limits.py line ", id="Python's, empty"),
    pytest.param(MemoryError("Unable to allocate 5.6 GiB for an array"), "out of memory (Unable to allocate 5.6 GiB",
                 id="NumPy's")])
def test_running_out_of_memory_says_what_ran_out_or_where(tmp_path, monkeypatch, capsys, error, shown):
    def exhausted(*args, **kwargs):
        raise error

    monkeypatch.setattr(datasets, "load_toy", exhausted)
    assert main(["train", "--task", "toy", "--out", str(tmp_path / "run"), "--no-progress"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"minitransformer train: error: {shown}")


# ----------------------------------------------------------------------------- the budget itself

def test_the_budget_is_4_gib_unless_the_environment_or_the_argument_says_otherwise(monkeypatch):
    monkeypatch.delenv(budget.ENV, raising=False)
    assert budget.memory_budget() == budget.MEMORY_BUDGET == 4 << 30
    for text, expected in (("16G", 16 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("123", 123),
                           ("2t", 2 << 40), (" 64 KB ", 64 << 10)):
        monkeypatch.setenv(budget.ENV, text)
        assert budget.memory_budget() == expected, text
    assert budget.memory_budget(1000) == 1000
    for text in ("lots", "-1G", "0", "1e9", "4 GB please"):
        monkeypatch.setenv(budget.ENV, text)
        with pytest.raises(ValueError, match=f"{budget.ENV} must be a positive size such as 8G"):
            budget.memory_budget()
    for value in (0, -5, 1.5, True, "4G"):
        with pytest.raises(ValueError, match="memory budget must be a positive number of bytes"):
            budget.memory_budget(value)


def test_a_refusal_names_the_work_its_biggest_part_the_budget_and_how_to_raise_it():
    with pytest.raises(budget.BudgetError) as err:
        budget.check("owner", {"small": 1 << 20, "big": 5 << 30}, "doing this", budget=4 << 30)
    assert str(err.value) == (f"owner: doing this would take about 5.0 GiB (big: 5.0 GiB), more than the memory "
                              f"budget of 4.0 GiB; ask for less, or raise the budget with the environment variable "
                              f"{budget.ENV} (e.g. {budget.ENV}=6G)")
    assert budget.check("owner", {"a": 3 << 30, "b": 1 << 30}, "doing this", budget=4 << 30) == 4 << 30   # at the edge


def test_the_budget_raised_through_the_environment_lets_the_work_through(monkeypatch):
    model = mt.Transformer(config(max_len=200))
    src = np.full((1, 150), 5)
    monkeypatch.setenv(budget.ENV, "256K")
    with pytest.raises(budget.BudgetError, match="greedy_decode: .* more than the memory budget of 256.0 KiB"):
        decoding.greedy_decode(model, src, max_len=2)
    with pytest.raises(budget.BudgetError, match="beam_search: .* x beam 3"):
        decoding.beam_search(model, src, beam_size=3, max_len=2)
    monkeypatch.setenv(budget.ENV, "1G")
    assert len(decoding.greedy_decode(model, src, max_len=2)) == 1


@pytest.mark.parametrize("changes", [{}, {"share_embeddings": True}, {"tie_output": True},
                                     {"norm_first": True, "positional": "learned"}, {"d_k": 3, "num_heads": 5},
                                     {"num_encoder_layers": 3, "num_decoder_layers": 2, "tgt_vocab_size": 17},
                                     {"positional": "learned"}, {"d_k": 3, "num_heads": 3},
                                     {"d_k": 3, "d_v": 7, "num_heads": 3}, {"d_v": 1}])
def test_parameter_count_is_that_of_the_model(changes):
    cfg = config(**changes)
    assert budget.parameter_count(cfg) == mt.Transformer(cfg).num_parameters()


def test_check_model_refuses_a_config_too_big_to_build_before_building_it():
    cfg = mt.TransformerConfig(src_vocab_size=1_000_000, tgt_vocab_size=1_000_000, d_model=8192, num_heads=8)
    with pytest.raises(budget.BudgetError, match=r"Transformer: building this model would take about 1\d\d\.\d GiB "
                                                 r"\(weights: "):
        budget.check_model(cfg)
    assert budget.check_model(config()) == 2 * 4 * mt.Transformer(config()).num_parameters() + 2 * 64 * 8 * 4
    assert budget.check_model(config(), dtype="float64") == 2 * budget.check_model(config())


@needs_rlimit
def test_the_core_refuses_a_model_too_big_to_build_before_allocating():
    """The core API's own guard: mt.Transformer with every size at its cap is refused in one line, under a 1 GiB
    address-space cap, before a weight exists."""
    out = capped("""
        import minitransformer as mt
        cfg = mt.TransformerConfig(src_vocab_size=1_000_000, tgt_vocab_size=1_000_000, d_model=8192, num_heads=8)
        try:
            mt.Transformer(cfg)
        except ValueError as err:
            print(type(err).__name__, err)
    """, seconds=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("BudgetError Transformer: building this model would take about")
    assert out.stdout.count("\n") == 1 and budget.ENV in out.stdout


def test_data_parallel_refuses_replicas_whose_gradients_pass_the_budget(monkeypatch):
    model = mt.fast.Transformer(config())
    grads = sum(p.data.nbytes for p in model.parameters())
    monkeypatch.setenv(budget.ENV, str(3 * grads))
    assert DataParallel(model, mt.CrossEntropyLoss(), workers=4).workers == 4
    with pytest.raises(budget.BudgetError, match="DataParallel: 5 model replicas would take about"):
        DataParallel(model, mt.CrossEntropyLoss(), workers=5)


# ----------------------------------------------------------------------------- the estimates against the truth

def _peak(fn) -> int:
    """The most bytes allocated at once while fn runs, above what was allocated before (NumPy reports its
    arrays to tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("sizes, B, S, beam, naive", [
    ({"d_model": 16, "num_heads": 16, "d_k": 2, "d_ff": 32, "max_len": 400}, 2, 300, 1, False),   # many heads
    ({"d_model": 32, "num_heads": 4, "d_ff": 64, "tgt_vocab_size": 3000, "max_len": 100}, 4, 12, 8, False),  # beam
    ({"d_model": 32, "num_heads": 4, "d_ff": 64, "num_decoder_layers": 3, "max_len": 200}, 3, 60, 4, False),
    ({"d_model": 16, "num_heads": 8, "d_k": 2, "d_ff": 32, "num_decoder_layers": 2, "max_len": 200}, 2, 40, 2, True),
])
def test_the_decoding_estimate_covers_what_decoding_allocates_within_a_factor_of_two(sizes, B, S, beam, naive):
    cfg = config(**sizes)
    model = mt.Transformer(cfg)
    model.projection.b.data[cfg.eos_id] -= 1e3                          # every sentence runs to its limit
    src = np.random.default_rng(0).integers(4, cfg.src_vocab_size, size=(B, S))
    run = (lambda: decoding.beam_search(model, src, beam_size=beam, naive=naive)) if beam > 1 else \
        (lambda: decoding.greedy_decode(model, src, naive=naive))
    peak = _peak(run)
    estimate = sum(budget.decoding_parts(cfg, B, S, S + 50, beam, naive, itemsize=4).values())
    assert peak <= estimate <= 2 * peak, (peak, estimate)


def test_int_in_names_the_bound_that_was_passed():
    from minitransformer import checks

    assert checks.int_in("f", "n", 100, 1, 100) == 100 and checks.int_in("f", "n", np.int64(-3), -3, 5) == -3
    for value, message in ((101, "f: n must be at most 100, got 101"), (0, "f: n must be a positive int, got 0"),
                           (2.0, "f: n must be a positive int, got 2.0"), (True, "f: n must be a positive int, got True")):
        with pytest.raises(ValueError) as err:
            checks.int_in("f", "n", value, 1, 100)
        assert str(err.value) == message
    with pytest.raises(ValueError, match=r"^f: n must be an int >= -3, got -4$"):
        checks.int_in("f", "n", -4, -3, 5)


def test_largest_batch_is_the_edge_of_what_check_decoding_lets_through():
    model = mt.Transformer(config(max_len=300))
    for src_len, out_len, beam, allowed in ((200, 250, 1, 50 << 20), (20, 70, 4, 3 << 20), (250, 300, 8, 1 << 20)):
        b = largest_batch(model, src_len, out_len, beam, budget=allowed)
        if b:
            budget.check_decoding("f", model, b, src_len, out_len, beam, budget=allowed)
        with pytest.raises(budget.BudgetError):
            budget.check_decoding("f", model, b + 1, src_len, out_len, beam, budget=allowed)
    assert largest_batch(model, 250, 300, 8, budget=1 << 20) == 0
    assert largest_batch(model, 20, 70, 4, budget=3 << 20) > 1


def test_train_refuses_a_model_past_the_budget_in_one_line_before_building_it(tmp_path):
    """Every size within the option table, together far past the budget: refused before a weight exists."""
    out = tmp_path / "big"
    proc = capped(f"""
        import sys
        from minitransformer.kit.cli import main
        sys.exit(main(["train", "--task", "copy", "--d-model", "8192", "--d-ff", "65536", "--layers", "128",
                       "--heads", "8", "--steps", "1", "--no-progress", "--out", {str(out)!r}]))
    """, seconds=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "building this model would take about" in lines[0]
    assert "MINITRANSFORMER_MEMORY_BUDGET" in lines[0]
    assert not any(name.endswith(".safetensors") for name in os.listdir(out))


def test_translating_many_long_lines_batches_them_within_the_budget(monkeypatch):
    """translate_ids sizes its batches so that each decoding call passes the budget that the longest source sets:
    with a budget that fits the weights and five sources, twelve sources go in batches of at most five."""
    from minitransformer.kit.data.batching import translate_ids

    model = mt.Transformer(config()).eval()
    itemsize = model.parameters()[0].data.dtype.itemsize
    weights = 2 * budget.parameter_count(model.config) * itemsize
    per_source = sum(budget.decoding_parts(model.config, 1, 40, 90, 1, False, itemsize).values())
    monkeypatch.setenv("MINITRANSFORMER_MEMORY_BUDGET", str(weights + 5 * per_source))
    calls = []
    real = decoding.greedy_decode
    monkeypatch.setattr(decoding, "greedy_decode", lambda m, src, max_len=None: calls.append(len(src)) or
                        real(m, src, max_len=max_len))
    out = translate_ids(model, [[5] * 40 for _ in range(12)], batch_size=100)
    assert len(out) == 12 and sum(calls) == 12 and max(calls) == 5
