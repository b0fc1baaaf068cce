"""Speed of one training step of both tiers, against torch.nn.Transformer on the same CPU, and of cached decoding.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_step.py \
        [--presets tiny,small,base] [--tiers fast,core] [--repeats N] [--threads 2,1] [--json out.json] \
        [--markdown out.md]

The two tiers of the package (``--tiers``, default both):

    fast   mt.fast.Transformer, mt.fast.CrossEntropyLoss, mt.fast.Adam: what the command line trains with
    core   mt.Transformer, mt.CrossEntropyLoss, mt.optim.Adam: the paper in code, the reference

Both compute the same step (tests/test_fast.py proves it), so core/fast is what the fast tier's tricks buy,
and fast/torch is how close it comes to a production library. For each preset and its batch shape:

    tiny   the copy task     vocab 14,    batch 64, src 12, tgt 11   (d 64,  4 heads, 2+2 layers, d_ff 128)
    small  Multi30k size     vocab 8000,  batch 64, src 16, tgt 18   (d 256, 8 heads, 3+3 layers, d_ff 1024)
    base   the paper's base  vocab 16000, batch 32, src 32, tgt 32   (d 512, 8 heads, 6+6 layers, d_ff 2048)

it times a full float32 training step -- forward, label-smoothed cross-entropy (eps 0.1, padding ignored),
backward, Adam step, zero_grad -- with tied output embeddings and the preset's dropout, and reports for
each tier and for torch:

- the median step time and tokens/s (real, non-pad source + target tokens, as ``train.Trainer`` counts them);
- achieved GFLOP/s. Only matrix products are counted, analytically: 2*m*n*k for every (m,k)@(k,n) of the
  forward (Q/K/V/output projections, Q K^T and A V over the full padded T x T / T x S grids, the two
  feed-forward layers, the tied output projection); backward costs two products of the same size per
  forward product (dX and dW, or dQ and dK), so a step is 3x the forward. Softmax, LayerNorm, the loss,
  dropout, embeddings and Adam are not counted (they are memory-bound and a few percent of the FLOPs).
  Each implementation is credited with the products it runs: torch and the core compute every position of
  the padded batch, the fast tier skips the padding (``mt.fast.Packing``: the projections and feed-forward
  layers run on the real tokens' rows), so its count is smaller by the batch's padding share (printed with
  each preset);
- that rate as a fraction of the machine's float32 matmul peak, measured here as the best of several
  large square NumPy sgemms (n = 3072) with the same thread count, at the start and at the end of the run;
- the floor set by the matrix products (fast tier): every product of its step (``step_matmuls``) timed
  alone at its shape and layout with the same threads, summed. It is what a step would take if softmax,
  LayerNorm, dropout, the loss, Adam and Python cost nothing; divided by torch's step time, it is the best
  ratio the fast step could reach on this machine;
- peak memory: each implementation runs in a fresh subprocess of its own (the tiers never import torch).
  After the imports the worker records its resident set (VmRSS) and resets the kernel's high-water mark
  (``echo 5 > /proc/self/clear_refs``); after the timed steps it reads VmHWM. "Step memory" is VmHWM minus
  that baseline: weights, gradients, optimiser state, activations and whatever the libraries allocate
  (BLAS buffers, torch's allocator), all of which tracemalloc would miss. Where clear_refs is not allowed
  the worker falls back to ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (then the import peak is included);
- greedy decoding of 64-token outputs with the key/value cache against the naive re-run of the whole
  prefix at every step (``greedy_decode(..., naive=True)``), asserting the same tokens, on the fast tier
  (the core when it runs alone). The EOS row of the (random) target embedding is zeroed first so that an
  untrained model never stops early: every sentence runs the full 64 tokens.

Where torch is installed, one more worker runs torch.nn.Transformer with the same configuration: the
same embeddings (initialised N(0, d_model^-0.5) as ours, scaled by sqrt(d_model)) plus sinusoidal
positions and dropout, post-LN layers with ReLU, no final encoder/decoder LayerNorm (ours has none in
post-LN: custom_encoder/custom_decoder without norm),
the output projection tied to the target embedding, F.cross_entropy with the same smoothing and
ignore_index, torch.optim.Adam with the same betas and eps, the same batch, and
torch.set_num_threads(the BLAS thread count NumPy uses). The workers run interleaved -- fast, core, torch,
fast, core, torch, ... -- each run timing a few steps, and the ratios fast/torch, core/torch and core/fast
are printed per round of runs and as the median over rounds. On a shared machine absolute times are noisy;
the ratios within a round are the figure. A shared machine's slow periods do not slow every implementation
alike, so a run made in a slow period flatters whichever suffers less: the script therefore also prints the
median ratios over the third of the rounds in which torch ran fastest (the least disturbed ones), and
checks the fast tier's ratio targets on both figures.

``--threads`` defaults to NumPy's BLAS thread count (all cores); ``--threads 2,1`` runs everything at 2 and
then at 1 thread, one table each. On a machine that other processes share, multi-threaded BLAS (and OpenMP
in torch) degrades badly whenever a core is taken (threads wait for each other at every small matmul):
the 1-thread table is then the fair comparison, and the load average printed with each table says how
busy the machine was.

Run it with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (``env -u``, for this command only) so that
OpenBLAS picks its native kernel; the script prints which kernel runs (threadpoolctl, when installed).

On a GPU (``benchmarks/gpu.sh`` runs this):

    python benchmarks/bench_step.py --backend cupy [--cpu-base-ms MS] [--steps 20]

runs the tiers' workers on ``mt.set_backend("cupy")``: the same batches (host ids, as a data loader gives
them), the same FLOP count and the same decoding check. Each timed step ends with a device synchronize
(CuPy queues kernels and returns); the peak is a large float32 cuBLAS product on the device, the floor times
each product on the device, and the step memory is what CuPy's memory pool holds after the steps
(weights, gradients, Adam's state and the activations' blocks, which the pool keeps for reuse). torch is
not run (its comparison is on the CPU). ``--cpu-base-ms``, the fast tier's base step on 2 CPU cores from
the CPU table, adds the GPU target: base at least 30x faster there. ``--backend fakecupy`` runs the same
path on the tests' CPU stand-in for CuPy (tests/fakecupy.py), to check the script without a GPU.

In the JSON, each preset holds the fast tier's figures under "ours", the core's under "core" and torch's
under "torch"; "ratio_median" and "ratio_torch_fastest" are fast/torch, "core_ratio_median" and
"core_ratio_torch_fastest" core/torch, "core_over_fast_median" core/fast.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PAD, BOS, EOS, FIRST_SYMBOL = 0, 1, 2, 4
LABEL_SMOOTHING = 0.1
DECODE_LEN = 64

# Batch shapes, and how many steps one timed run of the fast tier takes on the CPU (about a second).
SHAPES = {
    "tiny": {"vocab": 14, "batch": 64, "src_len": 12, "tgt_len": 11, "steps": 20, "decode_batch": 16},
    "small": {"vocab": 8000, "batch": 64, "src_len": 16, "tgt_len": 18, "steps": 4, "decode_batch": 16},
    "base": {"vocab": 16000, "batch": 32, "src_len": 32, "tgt_len": 32, "steps": 2, "decode_batch": 8},
}


# ================================================================================ shared by all processes

BACKENDS = ("numpy", "cupy", "fakecupy")
TIERS = ("fast", "core")
# Where each implementation's figures go in the JSON, by worker kind: the fast tier's under "ours", the
# figures the targets (and --cpu-base-ms) are about.
RESULT_KEY = {"fast": "ours", "core": "core", "torch": "torch"}
DEVICE_STEPS = 20        # steps per timed run on a device backend, where a base step takes milliseconds


def array_module(backend: str):
    """The array namespace that ``--backend`` names, as ``mt.set_backend`` takes it."""
    if backend == "numpy":
        import numpy

        return numpy
    if backend == "cupy":
        import cupy

        return cupy
    sys.path.insert(0, os.path.join(ROOT, "tests"))         # the tests' CPU stand-in for CuPy
    import fakecupy

    return fakecupy


def synchronize(xp) -> None:
    """Wait until the device has run all the work queued on it: CuPy returns before its kernels finish, so
    a step is timed up to this call. NumPy (and the stand-in) compute before returning: nothing to wait for."""
    if hasattr(xp, "cuda"):
        xp.cuda.Device().synchronize()


def device_name(xp) -> str | None:
    """The GPU's name under CuPy; None on the CPU backends."""
    if not hasattr(xp, "cuda"):
        return None
    name = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else name


def model_config(preset: str) -> dict:
    """The preset's sizes, read from the package (one source of truth for both workers)."""
    sys.path.insert(0, ROOT)
    import minitransformer as mt

    shape = SHAPES[preset]
    cfg = mt.TransformerConfig.preset(preset, src_vocab_size=shape["vocab"], tgt_vocab_size=shape["vocab"],
                                      max_len=max(shape["src_len"], shape["tgt_len"], DECODE_LEN) + 2)
    return cfg.to_dict()


def make_batch(preset: str, seed: int = 0, batch=None):
    """src (B,S), tgt_in (B,T), tgt_out (B,T) int64, padded at the end; lengths drawn in [0.6 L, L]."""
    import numpy

    shape = SHAPES[preset]
    B = shape["batch"] if batch is None else batch
    S, T, V = shape["src_len"], shape["tgt_len"], shape["vocab"]
    rng = numpy.random.default_rng(seed)
    src = numpy.full((B, S), PAD, dtype=numpy.int64)                       # (B,S)
    tgt = numpy.full((B, T + 1), PAD, dtype=numpy.int64)                   # (B,T+1) BOS w_1 .. w_n EOS pad..
    for b in range(B):
        n_src = int(rng.integers(math.ceil(0.6 * S), S + 1))
        src[b, :n_src - 1] = rng.integers(FIRST_SYMBOL, V, size=n_src - 1)
        src[b, n_src - 1] = EOS
        n_tgt = int(rng.integers(math.ceil(0.6 * T), T + 1))               # real tokens of tgt_out
        tgt[b, 0] = BOS
        tgt[b, 1:n_tgt] = rng.integers(FIRST_SYMBOL, V, size=n_tgt - 1)
        tgt[b, n_tgt] = EOS
    return src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


def real_tokens(src, tgt_out) -> int:
    return int((src != PAD).sum() + (tgt_out != PAD).sum())


def packed_rows(src, tgt_in) -> tuple:
    """(Ns, Nt): the rows our model's position-wise layers run on, its real source and target-input tokens."""
    return int((src != PAD).sum()), int((tgt_in != PAD).sum())


def step_matmuls(cfg: dict, B: int, S: int, T: int, Ns: int | None = None, Nt: int | None = None) -> list:
    """Every matrix product of one training step of our model, as the fast tier runs it.

    Ns, Nt: the rows the position-wise products run on, the real (non-pad) source and target tokens, as
    the fast tier packs them (mt.fast.Packing); default B*S and B*T, every position, as the core and torch
    compute. The
    attention products run over the full padded grids either way, and the output projection over all
    B*T target positions (it writes the (B,T,V) logits).

    A list of (count, a_shape, b_shape, layout): `count` products a @ b with a of a_shape and b of b_shape
    (3-D shapes are stacks of B*H products, one per head). layout says which operand is a transposed view
    of a C-contiguous array, as in the layers: "nn" none, "tn" a (x^T dout), "nt" b (dout W^T, K^T).
        Linear (N, i -> o)     forward x W  (N,i)@(i,o) nn;  dW = x^T dout (i,N)@(N,o) tn;  dx = dout W^T (N,o)@(o,i) nt
        stacked Q/K/V or K/V   one forward and one dW product n*D wide; dx one (N,D)@(D,D) nt per projection
        tied output E (V, D)   logits = h E^T (N,D)@(D,V) nt;  dE = dlogits^T h (V,N)@(N,D) tn;  dh = dlogits E nn
        attention (per head)   Q K^T nt, A V nn;  dV = A^T dout tn, dA = dout V^T nt, dQ = dS K nn, dK = dS^T Q tn
    Each backward product has the FLOPs of a forward one, so a step is 3x the forward's FLOPs.
    """
    D, F, V, H = cfg["d_model"], cfg["d_ff"], cfg["tgt_vocab_size"], cfg["num_heads"]
    Le, Ld, Dk = cfg["num_encoder_layers"], cfg["num_decoder_layers"], D // H
    Ns = B * S if Ns is None else Ns                        # source rows of the position-wise products
    Nt = B * T if Nt is None else Nt                        # target rows
    products = []

    def linear(count, N, i, o):
        products.extend([(count, (N, i), (i, o), "nn"), (count, (i, N), (N, o), "tn"), (count, (N, o), (o, i), "nt")])

    def stacked(count, N, n):
        products.extend([(count, (N, D), (D, n * D), "nn"), (count, (D, N), (N, n * D), "tn"),
                         (count * n, (N, D), (D, D), "nt")])

    def attention(count, Tq, Tk):
        BH = B * H
        products.extend([(count, (BH, Tq, Dk), (BH, Dk, Tk), "nt"), (count, (BH, Tq, Tk), (BH, Tk, Dk), "nn"),
                         (count, (BH, Tk, Tq), (BH, Tq, Dk), "tn"), (count, (BH, Tq, Dk), (BH, Dk, Tk), "nt"),
                         (count, (BH, Tq, Tk), (BH, Tk, Dk), "nn"), (count, (BH, Tk, Tq), (BH, Tq, Dk), "tn")])

    stacked(Le, Ns, 3); attention(Le, S, S); linear(Le, Ns, D, D)                 # encoder self-attention
    linear(Le, Ns, D, F); linear(Le, Ns, F, D)                                    # encoder feed-forward
    stacked(Ld, Nt, 3); attention(Ld, T, T); linear(Ld, Nt, D, D)                 # decoder self-attention
    linear(Ld, Nt, D, D); stacked(Ld, Ns, 2); attention(Ld, T, S); linear(Ld, Nt, D, D)  # cross-attention
    linear(Ld, Nt, D, F); linear(Ld, Nt, F, D)                                    # decoder feed-forward
    BT = B * T                                                                    # the projection: every position
    products.extend([(1, (BT, D), (D, V), "nt"), (1, (V, BT), (BT, D), "tn"), (1, (BT, V), (V, D), "nn")])
    return products


def step_flops(cfg: dict, src, tgt_in, tgt_out) -> tuple:
    """(FLOPs of a step's matrix products as the fast tier runs them, the padding skipped; over every position,
    as the core and torch run them)."""
    (B, S), T = src.shape, tgt_out.shape[1]
    return (matmul_flops(step_matmuls(cfg, B, S, T, *packed_rows(src, tgt_in))),
            matmul_flops(step_matmuls(cfg, B, S, T)))


def matmul_flops(products: list) -> float:
    """2*m*k*n per (m,k)@(k,n) product, times the batch of a stacked product and the count."""
    return sum(count * 2.0 * math.prod(a) * b[-1] for count, a, b, _ in products)


def proc_status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM), or -1 where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


class DevicePoolProbe:
    """Device memory of a step under CuPy: what its memory pool holds after the steps. The pool keeps every
    block it has allocated for reuse, so that is the most the step had in use at once, plus what rounding
    and fragmentation left unused in the pool's blocks."""

    def __init__(self, xp):
        self.pool = xp.get_default_memory_pool()
        self.pool.free_all_blocks()                         # nothing of ours is allocated yet

    def peak(self) -> dict:
        held = self.pool.total_bytes()
        return {"step_mb": held / 2**20, "method": "CuPy memory pool: bytes held after the steps"}


class MemoryProbe:
    """Peak resident memory of this process from now on (see the module docstring for the method)."""

    def __init__(self):
        self.baseline = proc_status("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")                                # resets VmHWM to the current RSS
            self.method = "VmHWM after clear_refs, minus VmRSS after imports"
        except OSError:
            import resource

            self.method = "ru_maxrss (includes the import peak), minus VmRSS after imports"
            self.baseline = max(0, self.baseline)
            self._ru = resource

    def peak(self) -> dict:
        if hasattr(self, "_ru"):
            peak = self._ru.getrusage(self._ru.RUSAGE_SELF).ru_maxrss * 1024
        else:
            peak = proc_status("VmHWM")
        return {"peak_rss_mb": peak / 2**20, "baseline_rss_mb": self.baseline / 2**20,
                "step_mb": (peak - self.baseline) / 2**20, "method": self.method}


def blas_info() -> list:
    try:
        import threadpoolctl
    except ImportError:
        return [{"note": "threadpoolctl not installed: pip install threadpoolctl to see the BLAS kernel"}]
    return [{k: v for k, v in lib.items() if k in ("internal_api", "version", "architecture", "num_threads",
                                                   "threading_layer", "filepath")}
            for lib in threadpoolctl.threadpool_info()]


# ===================================================================================== worker processes

def _limit_blas_threads(threads: int):
    """Our worker: run NumPy's BLAS on `threads` threads (only when asked for a count other than its own)."""
    info = [lib for lib in blas_info() if lib.get("internal_api") in ("openblas", "mkl", "blis")]
    current = info[0]["num_threads"] if info else None
    if current == threads:
        return None
    try:
        import threadpoolctl
    except ImportError:
        print(f"note: threadpoolctl is not installed, so BLAS keeps its own thread count instead of {threads} "
              "(pip install threadpoolctl)", file=sys.stderr)
        return None
    return threadpoolctl.threadpool_limits(threads, user_api="blas")


class OursWorker:
    """One tier of the package: its Transformer, loss and Adam, on `backend`."""

    def __init__(self, preset: str, threads: int, backend: str = "numpy", tier: str = "fast"):
        import numpy

        sys.path.insert(0, ROOT)
        import minitransformer as mt

        self.np, self.mt = numpy, mt
        self._limits = _limit_blas_threads(threads)
        mt.fast.set_num_threads(threads)                            # the fast tier's own threads (Adam's update)
        self.xp = array_module(backend)
        mt.set_backend(self.xp)                                     # before the model: its weights live there
        self.memory = DevicePoolProbe(self.xp) if hasattr(self.xp, "get_default_memory_pool") else MemoryProbe()
        mt.set_default_dtype("float32")
        mt.manual_seed(0)
        self.cfg = mt.TransformerConfig.from_dict(model_config(preset))
        Model, Loss, Adam = ((mt.fast.Transformer, mt.fast.CrossEntropyLoss, mt.fast.Adam) if tier == "fast"
                             else (mt.Transformer, mt.CrossEntropyLoss, mt.optim.Adam))
        self.model = Model(self.cfg)
        self.loss_fn = Loss(ignore_index=PAD, label_smoothing=LABEL_SMOOTHING)
        self.opt = Adam(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        self.src, self.tgt_in, self.tgt_out = make_batch(preset)
        self.preset = preset
        self.info = {"tier": tier, "blas": blas_info(), "numpy": numpy.__version__, "backend": mt.get_backend(),
                     "device": device_name(self.xp), "parameters": self.model.num_parameters()}
        if backend != "numpy":
            self.info[backend] = self.xp.__version__ if hasattr(self.xp, "__version__") else "stand-in"

    def step(self) -> float:
        logits = self.model(self.src, self.tgt_in)                  # (B,T,V), from the host ids
        loss = self.loss_fn(logits, self.tgt_out)
        self.model.backward(self.loss_fn.backward())
        self.opt.step()
        self.opt.zero_grad()
        synchronize(self.xp)                                        # the step is done when the device is
        return loss

    def decode(self, repeats: int) -> dict:
        mt, np = self.mt, self.np
        model = self.model
        model.tgt_embed.weight.data[EOS] = 0.0                     # its logit h.E[eos] = 0: never the argmax
        src = make_batch(self.preset, seed=1, batch=SHAPES[self.preset]["decode_batch"])[0]
        times = {"cached": [], "naive": []}
        reference = None
        for _ in range(repeats):
            for mode in ("cached", "naive"):
                t0 = time.perf_counter()
                out = mt.decoding.greedy_decode(model, src, max_len=DECODE_LEN, naive=(mode == "naive"))
                synchronize(self.xp)
                times[mode].append(time.perf_counter() - t0)
                reference = out if reference is None else reference
                if out != reference:
                    raise AssertionError("cached and naive greedy decoding emitted different tokens")
        lengths = [len(o) for o in reference]
        n_tokens = int(np.sum(lengths))
        cached, naive = statistics.median(times["cached"]), statistics.median(times["naive"])
        return {"batch": len(lengths), "mean_length": n_tokens / len(lengths), "same_tokens": True,
                "cached_s": cached, "naive_s": naive, "cached_tokens_per_s": n_tokens / cached,
                "naive_tokens_per_s": n_tokens / naive, "speedup": naive / cached,
                "times": times}


class TorchWorker:
    def __init__(self, preset: str, threads: int):
        import numpy
        import torch
        from torch import nn
        from torch.nn import functional as F

        self.torch, self.F = torch, F
        torch.set_num_threads(threads)
        c = model_config(preset)                               # imports minitransformer: before the baseline
        self.memory = MemoryProbe()
        torch.manual_seed(0)
        D = c["d_model"]

        class TorchTransformer(nn.Module):
            """torch.nn.Transformer dressed as ours: scaled embeddings + sinusoids + dropout, post-LN
            layers without a final stack LayerNorm, output projection tied to the target embedding."""

            def __init__(self):
                super().__init__()
                self.src_embed = nn.Embedding(c["src_vocab_size"], D)
                self.tgt_embed = nn.Embedding(c["tgt_vocab_size"], D)
                for embed in (self.src_embed, self.tgt_embed):
                    # As ours: E ~ N(0, D^-0.5). nn.Embedding's default N(0, 1) makes the tied logits
                    # ~sqrt(D) times larger (a loss of ~90 at the start instead of ~10, and exp underflowing
                    # over most of the vocabulary): same values for both, so same arithmetic.
                    nn.init.normal_(embed.weight, 0.0, D ** -0.5)
                pos = torch.arange(c["max_len"], dtype=torch.float64)[:, None]
                angle = pos / torch.pow(10000.0, torch.arange(0, D, 2, dtype=torch.float64) / D)
                pe = torch.zeros(c["max_len"], D, dtype=torch.float64)
                pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
                self.register_buffer("pe", pe.float())
                self.dropout = nn.Dropout(c["dropout"])
                layer_args = {"d_model": D, "nhead": c["num_heads"], "dim_feedforward": c["d_ff"],
                              "dropout": c["dropout"], "batch_first": True}
                encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer_args), c["num_encoder_layers"],
                                                enable_nested_tensor=False)
                decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer_args), c["num_decoder_layers"])
                self.transformer = nn.Transformer(d_model=D, nhead=c["num_heads"], batch_first=True,
                                                  custom_encoder=encoder, custom_decoder=decoder)

            def forward(self, src, tgt_in):
                scale = math.sqrt(D)
                x = self.dropout(self.src_embed(src) * scale + self.pe[:src.shape[1]])
                y = self.dropout(self.tgt_embed(tgt_in) * scale + self.pe[:tgt_in.shape[1]])
                T = tgt_in.shape[1]
                causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)   # True = masked
                h = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=src == PAD,
                                     tgt_key_padding_mask=tgt_in == PAD, memory_key_padding_mask=src == PAD)
                return F.linear(h, self.tgt_embed.weight)                           # tied projection

        self.model = TorchTransformer()
        self.model.train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        src, tgt_in, tgt_out = make_batch(preset)
        self.src, self.tgt_in, self.tgt_out = (torch.from_numpy(a) for a in (src, tgt_in, tgt_out))
        self.V = c["tgt_vocab_size"]
        self.info = {"torch": torch.__version__, "numpy": numpy.__version__, "threads": torch.get_num_threads(),
                     "parameters": sum(p.numel() for p in self.model.parameters())}

    def step(self) -> float:
        logits = self.model(self.src, self.tgt_in)
        loss = self.F.cross_entropy(logits.reshape(-1, self.V), self.tgt_out.reshape(-1), ignore_index=PAD,
                                    label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return float(loss.detach())


def time_matmul(a, b, repeats: int, xp=None) -> list:
    """Seconds taken by each of `repeats` products a @ b, after one warm-up (BLAS buffers, threads, caches;
    on a GPU, cuBLAS's handle and workspace), each timed until the device `xp` has finished it."""
    a @ b
    synchronize(xp)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        synchronize(xp)
        times.append(time.perf_counter() - t0)
    return times


def peak_gflops(threads: int, backend: str = "numpy", repeats: int = 5) -> dict:
    """The machine's float32 matmul peak: the best of `repeats` n x n sgemms, NumPy's (n = 3072) or, on a
    GPU, cuBLAS's (n = 8192: a GPU needs a larger product to reach its peak)."""
    import numpy

    limits = _limit_blas_threads(threads)  # noqa: F841 (kept alive for the measurement)
    xp = array_module(backend)
    n = 8192 if hasattr(xp, "cuda") else 3072
    rng = numpy.random.default_rng(0)
    a = xp.asarray(rng.standard_normal((n, n), dtype=numpy.float32))
    b = xp.asarray(rng.standard_normal((n, n), dtype=numpy.float32))
    times = time_matmul(a, b, repeats, xp)
    flops = 2.0 * n ** 3
    return {"n": n, "best_gflops": flops / min(times) / 1e9, "median_gflops": flops / statistics.median(times) / 1e9}


def matmul_floor(preset: str, threads: int, backend: str = "numpy", repeats: int = 5) -> dict:
    """How long one training step's matrix products take when each runs alone: the step's time if
    everything else (softmax, LayerNorm, dropout, the loss, Adam, Python) cost nothing.

    Every product of ``step_matmuls`` is timed on random float32 operands of its shape and layout with the
    same thread count (the median of `repeats` after a warm-up) and counted as often as a step runs it.
    """
    import numpy

    limits = _limit_blas_threads(threads)  # noqa: F841 (kept alive for the measurement)
    xp = array_module(backend)
    src, tgt_in, _ = make_batch(preset)
    products = step_matmuls(model_config(preset), *src.shape, tgt_in.shape[1], *packed_rows(src, tgt_in))
    rng = numpy.random.default_rng(0)

    def operand(dims, transposed):                       # a C-contiguous array, or the transposed view of one
        if not transposed:
            return xp.asarray(rng.standard_normal(dims, dtype=numpy.float32))
        return xp.asarray(rng.standard_normal(dims[:-2] + dims[-2:][::-1], dtype=numpy.float32)).swapaxes(-1, -2)

    total = 0.0
    for count, a_shape, b_shape, layout in products:
        a, b = operand(a_shape, layout[0] == "t"), operand(b_shape, layout[1] == "t")
        total += count * statistics.median(time_matmul(a, b, repeats, xp))
    return {"floor_ms": 1e3 * total, "products": sum(count for count, *_ in products),
            "gflops": matmul_flops(products) / total / 1e9}


def worker_main(kind: str, preset: str, threads: int, backend: str = "numpy") -> None:
    """A worker: answers one JSON line per command read on stdin. Stray prints go to stderr."""
    out = sys.stdout
    sys.stdout = sys.stderr

    def reply(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    if kind == "peak":
        reply(peak_gflops(threads, backend))
        return
    if kind == "floor":
        reply(matmul_floor(preset, threads, backend))
        return
    worker = OursWorker(preset, threads, backend, tier=kind) if kind in TIERS else TorchWorker(preset, threads)
    reply({"ready": True, **worker.info})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "run":
            times, loss = [], None
            for _ in range(cmd["steps"]):
                t0 = time.perf_counter()
                loss = worker.step()
                times.append(time.perf_counter() - t0)
            reply({"times": times, "loss": float(loss)})
        elif cmd["cmd"] == "memory":
            reply(worker.memory.peak())
        elif cmd["cmd"] == "decode":
            reply(worker.decode(cmd["repeats"]))
        elif cmd["cmd"] == "quit":
            reply({"bye": True})
            return


class Worker:
    """The parent's handle on a worker subprocess."""

    def __init__(self, kind: str, preset: str, threads: int, backend: str = "numpy"):
        # The thread count also in the environment: BLAS starts with it even where threadpoolctl (which
        # the worker otherwise uses to set it) is not installed.
        env = dict(os.environ, **{var: str(threads) for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                                "MKL_NUM_THREADS")})
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", kind,
                                      "--worker-preset", preset, "--threads", str(threads), "--backend", backend],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        self.first = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.proc.args[3]} died (exit code {self.proc.wait()}); see stderr above")
        return json.loads(line)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        try:
            self.ask(cmd="quit")
        finally:
            self.proc.wait(timeout=60)


def measure(kind: str, threads: int, preset: str = "tiny", backend: str = "numpy") -> dict:
    """A one-shot worker ("peak" or "floor"): it measures in a fresh process, replies once and exits."""
    w = Worker(kind, preset, threads, backend)
    w.proc.wait(timeout=300)
    return w.first


# ========================================================================================== the parent

def bench_preset(preset: str, threads: int, repeats: int, steps: int | None, with_torch: bool,
                 decode_repeats: int, backend: str = "numpy", tiers=TIERS) -> dict:
    """Every implementation's step at one preset: the tiers asked for, then torch, run interleaved."""
    shape = SHAPES[preset]
    cfg = model_config(preset)
    if steps is None:
        steps = shape["steps"] if backend == "numpy" else DEVICE_STEPS
    src, tgt_in, tgt_out = make_batch(preset)
    B, S, T = src.shape[0], src.shape[1], tgt_out.shape[1]
    Ns, Nt = packed_rows(src, tgt_in)
    packed, every_position = step_flops(cfg, src, tgt_in, tgt_out)
    flops = {"fast": packed, "core": every_position, "torch": every_position}
    tokens = real_tokens(src, tgt_out)
    print(f"\n== {preset}: vocab {shape['vocab']}, batch {B}, src {S}, tgt {T} ({100 * (1 - Ns / (B * S)):.0f}% "
          f"and {100 * (1 - Nt / (B * T)):.0f}% padding); d {cfg['d_model']}, "
          f"{cfg['num_heads']} heads, {cfg['num_encoder_layers']}+{cfg['num_decoder_layers']} layers, "
          f"d_ff {cfg['d_ff']}, dropout {cfg['dropout']}; GFLOP of matmul per step: {every_position / 1e9:.2f} "
          f"over every position (core, torch), {flops['fast'] / 1e9:.2f} as the fast tier runs it (padding "
          f"skipped); {steps} steps per run" + ("" if backend == "numpy" else f"; backend {backend}"), flush=True)

    impls = {tier: Worker(tier, preset, threads, backend) for tier in tiers}
    if with_torch:
        impls["torch"] = Worker("torch", preset, threads)
    first_steps = {}
    for name, w in impls.items():
        # warm-up: first-touch allocations, thread pools (on a GPU: compiling the kernels, filling the pool)
        first_steps[name] = w.ask(cmd="run", steps=2)["times"]
    times = {name: [] for name in impls}
    losses = {}
    pairs = []
    for i in range(repeats):
        run_median = {}
        for name, w in impls.items():                          # fast, core, torch, fast, core, torch, ...
            r = w.ask(cmd="run", steps=steps)
            times[name] += r["times"]
            losses[name] = r["loss"]
            run_median[name] = statistics.median(r["times"])
        print(f"  round {i + 1}: " + "   ".join(f"{name} {1e3 * t:8.1f} ms" for name, t in run_median.items())
              + "".join(f"   {a}/{b} {ratio:.3f}" for a, b, ratio in ratios(run_median)), flush=True)
        if with_torch or len(tiers) > 1:
            pairs.append(round_record(run_median))

    result = {"shape": {"vocab": shape["vocab"], "batch": B, "src_len": S, "tgt_len": T}, "config": cfg,
              "tiers": list(tiers), "steps_per_run": steps,
              "matmul_gflop_per_step": {RESULT_KEY[k]: f / 1e9 for k, f in flops.items() if k in impls},
              "padding": {"src": 1 - Ns / (B * S), "tgt_in": 1 - Nt / (B * T)}, "tokens_per_step": tokens,
              "pairs": pairs}
    for name, w in impls.items():
        med = statistics.median(times[name])
        result[RESULT_KEY[name]] = {"median_ms": 1e3 * med, "min_ms": 1e3 * min(times[name]),
                                    "tokens_per_s": tokens / med, "gflops": flops[name] / med / 1e9,
                                    "loss": losses[name], "memory": w.ask(cmd="memory"),
                                    "warmup_steps_s": first_steps[name],
                                    **{k: v for k, v in w.first.items() if k != "ready"}}
    summarize_ratios(result)
    if "fast" in impls:
        # The fast step's matrix products alone, in a process of their own while the workers wait (see matmul_floor).
        floor = result["matmul_floor"] = measure("floor", threads, preset, backend)
        line = (f"  fast tier's matrix products alone, each timed at its shape: {floor['floor_ms']:.1f} ms "
                f"({floor['gflops']:.0f} GFLOP/s), "
                f"{100 * floor['floor_ms'] / result['ours']['median_ms']:.0f}% of its step")
        if with_torch:
            fastest = fastest_third(pairs)
            floor["torch_ratio"] = floor["floor_ms"] / result["torch"]["median_ms"]
            floor["torch_fastest_ratio"] = floor["floor_ms"] / statistics.median(p["torch_ms"] for p in fastest)
            line += (f"; {floor['torch_ratio']:.2f}x torch's median step ({floor['torch_fastest_ratio']:.2f}x in the "
                     f"rounds where torch ran fastest), the best ratio a step running these products can reach")
        print(line, flush=True)
    if decode_repeats > 0:
        tier = "fast" if "fast" in impls else "core"
        d = impls[tier].ask(cmd="decode", repeats=decode_repeats)
        result["decode"] = {"tier": tier, **d}
        print(f"  greedy decode ({tier} tier) {d['batch']} x {d['mean_length']:.0f} tokens: cached "
              f"{d['cached_s']:.2f} s, naive {d['naive_s']:.2f} s, speedup {d['speedup']:.1f}x (same tokens)",
              flush=True)
    for w in impls.values():
        w.close()
    return result


def ratios(ms: dict) -> list:
    """(a, b, a/b) for fast/torch, core/torch and core/fast, where both of a pair ran."""
    return [(a, b, ms[a] / ms[b]) for a, b in (("fast", "torch"), ("core", "torch"), ("core", "fast"))
            if a in ms and b in ms]


def round_record(run_median: dict) -> dict:
    """One round's median step times and ratios, under the JSON's names."""
    names = {("fast", "torch"): "ratio", ("core", "torch"): "core_ratio", ("core", "fast"): "core_over_fast"}
    record = {f"{RESULT_KEY[name]}_ms": 1e3 * t for name, t in run_median.items()}
    record.update({names[a, b]: ratio for a, b, ratio in ratios(run_median)})
    return record


def fastest_third(pairs: list) -> list:
    """The rounds least disturbed by the machine's slow periods: the third where torch ran fastest."""
    return sorted(pairs, key=lambda p: p["torch_ms"])[:math.ceil(len(pairs) / 3)]


def summarize_ratios(result: dict) -> None:
    """The median ratios over the rounds (and over the third where torch ran fastest), into result; printed."""
    pairs = result["pairs"]
    for key, label, of in (("ratio", "fast/torch", "ours"), ("core_ratio", "core/torch", "core")):
        if pairs and key in pairs[0]:
            prefix = "" if key == "ratio" else "core_"
            result[f"{prefix}ratio_median"] = statistics.median(p[key] for p in pairs)
            fastest = fastest_third(pairs)
            result[f"{prefix}ratio_torch_fastest"] = statistics.median(p[key] for p in fastest)
            result["torch_fastest_ms"] = [fastest[0]["torch_ms"], fastest[-1]["torch_ms"]]
            print(f"  median ratio {label} {result[f'{prefix}ratio_median']:.3f} ({label.split('/')[0]} "
                  f"{result[of]['median_ms']:.1f} ms, torch {result['torch']['median_ms']:.1f} ms); in the "
                  f"{len(fastest)} round(s) where torch ran fastest ({fastest[0]['torch_ms']:.1f}-"
                  f"{fastest[-1]['torch_ms']:.1f} ms): {result[f'{prefix}ratio_torch_fastest']:.3f}", flush=True)
    if pairs and "core_over_fast" in pairs[0]:
        result["core_over_fast_median"] = statistics.median(p["core_over_fast"] for p in pairs)
        print(f"  median ratio core/fast {result['core_over_fast_median']:.2f} (core {result['core']['median_ms']:.1f}"
              f" ms, fast {result['ours']['median_ms']:.1f} ms)", flush=True)


GPU_SPEEDUP_TARGET = 30.0     # the fast tier's base step on a GPU at least 30x faster than on 2 CPU cores


def targets(results: dict, peak: float, backend: str = "numpy", cpu_base_ms: float | None = None) -> list:
    """The fast tier's targets for the backend that ran, each as (name, figure, met): decoding on every
    backend; on the CPU also the ratios to torch, the fraction of the peak and memory; on a GPU, given the
    CPU's base step time, the speed-up over it. The core has none: it is the reference, not a contender."""
    out = []
    on_cpu = backend == "numpy"
    for preset, limit in (("small", 1.0), ("base", 0.8)):
        r = results.get(preset)
        if on_cpu and r and "ratio_median" in r:
            out.append((f"{preset} step <= {limit}x torch", f"{r['ratio_median']:.2f}x", r["ratio_median"] <= limit))
            out.append((f"{preset} step <= {limit}x torch, rounds where torch ran fastest",
                        f"{r['ratio_torch_fastest']:.2f}x", r["ratio_torch_fastest"] <= limit))
    if on_cpu and "ours" in results.get("base", {}):
        frac = results["base"]["ours"]["gflops"] / peak
        out.append(("base step >= 50% of matmul peak", f"{100 * frac:.0f}%", frac >= 0.5))
    for preset, r in results.items():
        if "decode" in r:
            out.append((f"{preset} cached greedy >= 3x naive (64 tokens)", f"{r['decode']['speedup']:.1f}x",
                        r["decode"]["speedup"] >= 3))
    for preset, r in results.items():
        if "torch" in r and "ours" in r:
            ours, ref = r["ours"]["memory"]["step_mb"], r["torch"]["memory"]["step_mb"]
            out.append((f"{preset} step memory <= torch's", f"{ours:.0f} MB vs {ref:.0f} MB", ours <= ref))
    if not on_cpu and cpu_base_ms and "ours" in results.get("base", {}):
        gpu_ms = results["base"]["ours"]["median_ms"]
        speedup = cpu_base_ms / gpu_ms
        out.append((f"base step >= {GPU_SPEEDUP_TARGET:.0f}x faster than on 2 CPU cores",
                    f"{speedup:.1f}x ({cpu_base_ms:.0f} ms there, {gpu_ms:.1f} ms here)", speedup >= GPU_SPEEDUP_TARGET))
    return out


def markdown(report: dict) -> str:
    peak, n = report["peak_gflops"], report["peak_runs"][0]["n"]
    if report["backend"] == "numpy":
        heading = (f"**{report['threads']} thread(s).** Measured {report['date']} on {report['machine']['model']} "
                   f"({report['machine']['cpus']} CPUs), {report['threads']} threads; NumPy {report['numpy']} with "
                   f"{report['blas_kernel']}" + (f", torch {report['torch']}" if report.get("torch") else "")
                   + f". float32 matmul peak (n={n} sgemm, same threads): {peak:.0f} GFLOP/s. "
                   f"Load average at the end: {report.get('load_average_end', 'unknown')}.")
    else:
        heading = (f"**{report.get('device') or 'no GPU'}, backend {report['backend']}.** Measured {report['date']} "
                   f"(host {report['machine']['model']}, {report['machine']['cpus']} CPUs); NumPy {report['numpy']}, "
                   f"{report['backend']} {report.get('backend_version')}. float32 matmul peak (n={n} on the device): "
                   f"{peak:.0f} GFLOP/s. Each step ends with a device synchronize; step memory is what the "
                   "memory pool holds after the steps (the process's peak RSS where there is no pool).")

    def cell(r, key, fmt):                                     # a figure, or "-" where it was not measured
        return fmt(r) if key in r else "-"

    lines = [heading,
             "",
             ("| preset | batch (B, S, T, V; padding src / tgt) | fast ms | core ms | torch ms "
              "| fast/torch (median of rounds) | fast/torch (third of rounds where torch ran fastest) "
              "| core/torch (median) | core/fast (median) | fast GFLOP/s (% peak) | core GFLOP/s | torch GFLOP/s "
              "| fast tok/s | step memory fast / core / torch | greedy 64 tok: cached vs naive |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for preset, r in report["presets"].items():
        s = r["shape"]
        memory = " / ".join(f"{r[k]['memory']['step_mb']:.0f}" if k in r else "-" for k in ("ours", "core", "torch"))
        lines.append(" | ".join([
            f"| {preset}",
            (f"{s['batch']}, {s['src_len']}, {s['tgt_len']}, {s['vocab']}; "
             f"{100 * r['padding']['src']:.0f}% / {100 * r['padding']['tgt_in']:.0f}%"),
            *(cell(r, k, lambda r, k=k: f"{r[k]['median_ms']:.1f}") for k in ("ours", "core", "torch")),
            cell(r, "ratio_median", lambda r: f"{r['ratio_median']:.2f}x"),
            cell(r, "ratio_torch_fastest", lambda r: f"{r['ratio_torch_fastest']:.2f}x"),
            cell(r, "core_ratio_median", lambda r: f"{r['core_ratio_median']:.2f}x"),
            cell(r, "core_over_fast_median", lambda r: f"{r['core_over_fast_median']:.2f}x"),
            cell(r, "ours", lambda r: f"{r['ours']['gflops']:.0f} ({100 * r['ours']['gflops'] / peak:.0f}%)"),
            cell(r, "core", lambda r: f"{r['core']['gflops']:.0f}"),
            cell(r, "torch", lambda r: f"{r['torch']['gflops']:.0f}"),
            cell(r, "ours", lambda r: f"{r['ours']['tokens_per_s']:,.0f}"),
            f"{memory} MB",
            cell(r, "decode", lambda r: f"{r['decode']['speedup']:.1f}x ({r['decode']['cached_tokens_per_s']:,.0f} vs "
                                        f"{r['decode']['naive_tokens_per_s']:,.0f} tok/s, {r['decode']['tier']})"),
        ]) + " |")
    floors = []
    for preset, r in report["presets"].items():
        f = r.get("matmul_floor")
        if f:
            floors.append(f"{preset} {f['floor_ms']:.1f} ms" + (f" = {f['torch_ratio']:.2f}x torch's step "
                          f"({f['torch_fastest_ratio']:.2f}x where torch ran fastest)" if "torch_ratio" in f else ""))
    lines += ["", ("GFLOP/s count the matrix products each implementation runs: torch's and the core's over every "
                   "position, the fast tier's over the real tokens (its stacks skip the padding).")]
    if floors:
        lines += ["", ("The fast step's matrix products alone, each timed at its own shape and layout with the same "
                       "threads (the best a step running them can do): " + "; ".join(floors) + ".")]
    where = "CPU" if report["backend"] == "numpy" else "GPU"
    lines += ["", f"| target (fast tier, {where}) | measured | met |", "|---|---|---|"]
    lines += [f"| {name} | {fig} | {'yes' if ok else 'no'} |" for name, fig, ok in report["targets"]]
    return "\n".join(lines) + "\n"


def machine() -> dict:
    info = {"model": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    try:
        lscpu = subprocess.run(["lscpu"], check=False, capture_output=True, text=True, timeout=10).stdout
        info["lscpu_head"] = "\n".join(lscpu.splitlines()[:10])
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                info["model"] = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def run(presets, threads: int, args, with_torch: bool, blas: list, kernel: str, env: dict) -> dict:
    """Every preset at one thread count: the report that the table and the JSON are made from."""
    import numpy

    backend = args.backend
    print(f"\n#### {threads} thread(s): NumPy {numpy.__version__}, {kernel}; load average {load_average()}"
          + ("" if backend == "numpy" else f"; backend {backend}"), flush=True)
    peak_start = measure("peak", threads, backend=backend)
    print(f"float32 matmul peak (n={peak_start['n']}): {peak_start['best_gflops']:.0f} GFLOP/s best, "
          f"{peak_start['median_gflops']:.0f} median", flush=True)
    results = {}
    for preset in presets:
        results[preset] = bench_preset(preset, threads, args.repeats, args.steps, with_torch, args.decode_repeats,
                                       backend, args.tiers)
    peak_end = measure("peak", threads, backend=backend)
    peak = max(peak_start["best_gflops"], peak_end["best_gflops"])
    print(f"float32 matmul peak again: {peak_end['best_gflops']:.0f} GFLOP/s; using the best, {peak:.0f}")
    torch_version = None
    for r in results.values():
        torch_version = r.get("torch", {}).get("torch", torch_version)
    report = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "machine": machine(),
              "python": platform.python_version(), "numpy": numpy.__version__, "torch": torch_version,
              "blas": blas, "blas_kernel": kernel, "env": env, "threads": threads, "peak_gflops": peak,
              "peak_runs": [peak_start, peak_end], "load_average_end": load_average(), "backend": backend,
              "tiers": list(args.tiers), "presets": results}
    if backend != "numpy":
        first = next(iter(results.values()))[RESULT_KEY[args.tiers[0]]]
        report.update(device=first.get("device"), backend_version=first.get(backend),
                      cpu_base_ms=args.cpu_base_ms)
    report["targets"] = targets(results, peak, backend, args.cpu_base_ms)
    return report


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="tiny,small,base", help="comma-separated, from tiny,small,base")
    p.add_argument("--tiers", default="fast,core",
                   help="comma-separated, from fast,core: the package's tiers to time (default both; the ratios "
                        "core/fast and each to torch are printed)")
    p.add_argument("--repeats", type=int, default=5,
                   help="interleaved rounds of runs per preset (fast, core, torch in each)")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default: per preset)")
    p.add_argument("--threads", default=None,
                   help="BLAS / torch thread count, or several comma-separated (e.g. 2,1) for one table each "
                        "(default: NumPy's BLAS thread count)")
    p.add_argument("--decode-repeats", type=int, default=2, help="cached/naive decoding pairs (0 skips decoding)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch.nn.Transformer comparison")
    p.add_argument("--backend", default="numpy", choices=BACKENDS,
                   help="array backend of the tiers: numpy (the CPU, default), cupy (a GPU; torch is not run), "
                        "fakecupy (the tests' CPU stand-in for CuPy: checks the GPU path without a GPU)")
    p.add_argument("--cpu-base-ms", type=float, default=None,
                   help="with a GPU backend: the fast tier's base step time on 2 CPU cores (the CPU table's "
                        "'fast ms'), for the GPU speed-up target")
    p.add_argument("--json", default=None, help="write the full results as JSON to this file")
    p.add_argument("--markdown", default=None, help="write the table(s) as Markdown to this file")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-preset", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        worker_main(args.worker, args.worker_preset, int(args.threads), args.backend)
        return 0

    presets = [s.strip() for s in args.presets.split(",") if s.strip()]
    unknown = [s for s in presets if s not in SHAPES]
    if unknown:
        p.error(f"--presets: unknown preset(s) {unknown}; choose from {sorted(SHAPES)}")
    if not presets:
        p.error(f"--presets: give at least one of {sorted(SHAPES)}, got {args.presets!r}")
    args.tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    if not args.tiers or any(t not in TIERS for t in args.tiers) or len(set(args.tiers)) < len(args.tiers):
        p.error(f"--tiers: give one or both of {','.join(TIERS)}, each once, got {','.join(args.tiers) or 'none'}")
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if args.decode_repeats < 0:
        p.error(f"--decode-repeats must be >= 0, got {args.decode_repeats}")
    for option, path in (("--json", args.json), ("--markdown", args.markdown)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            p.error(f"{option}: the folder of {path} does not exist")         # checked before the long run
    if args.backend == "cupy":                                # before any worker starts: CuPy and a GPU are there
        sys.path.insert(0, ROOT)
        import minitransformer as mt

        try:
            mt.set_backend("cupy")
        except (ImportError, RuntimeError) as err:
            p.error(f"--backend cupy: {err}")
        mt.set_backend("numpy")
    import numpy  # noqa: F401  (loads NumPy's BLAS, so that threadpoolctl can see it)

    blas = blas_info()
    openblas = [lib for lib in blas if lib.get("internal_api") in ("openblas", "mkl", "blis")]
    if args.threads:
        try:
            thread_counts = [int(t) for t in args.threads.split(",")]
        except ValueError:
            p.error(f"--threads must be a positive int or comma-separated ints, got {args.threads!r}")
        if any(t < 1 for t in thread_counts):
            p.error(f"--threads must be positive, got {args.threads!r}")
    else:
        thread_counts = [openblas[0]["num_threads"] if openblas else os.cpu_count()]
    kernel = (f"{openblas[0]['internal_api']} {openblas[0].get('version')} kernel "
              f"{openblas[0].get('architecture')}" if openblas else "BLAS kernel unknown (no threadpoolctl)")
    try:
        import importlib.util

        with_torch = not args.no_torch and importlib.util.find_spec("torch") is not None
    except ValueError:
        with_torch = False
    if with_torch and args.backend != "numpy":
        print(f"backend {args.backend}: torch.nn.Transformer is not run (the comparison with torch is on the CPU)")
        with_torch = False
    env = {k: os.environ.get(k, "<unset>") for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                                                     "OMP_NUM_THREADS")}
    print(f"BLAS: {kernel}; environment {env}")
    if env["OPENBLAS_CORETYPE"] != "<unset>" or env["OPENBLAS_L2_SIZE"] != "<unset>":
        print("note: OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set; for the native kernel run "
              "`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_step.py`")

    reports = [run(presets, threads, args, with_torch, blas, kernel, env) for threads in thread_counts]
    tables = "\n".join(markdown(report) for report in reports)
    print("\n" + tables)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports[0] if len(reports) == 1 else {"runs": reports}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
