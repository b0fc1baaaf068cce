"""What a piece of work will take in memory, estimated from the sizes alone before it starts, and refused past a
budget (MEMORY_BUDGET, $MINITRANSFORMER_MEMORY_BUDGET such as "16G", or ``budget=``) in one line naming its
biggest part: a 15 KB checkpoint with 1,024 heads that reads 1,000 tokens asks for gigabytes of attention scores.
The estimates (weights and gradients, each layer's kept activations, the decoder's key/value cache, beam search's
float64 scores) hold within a small factor of what is allocated; the tests hold them to it."""

import os
import re

import numpy

from . import backend

ENV = "MINITRANSFORMER_MEMORY_BUDGET"
# Fixed, so that a piece of work is accepted or refused alike on every machine.
MEMORY_BUDGET = 4 << 30


class BudgetError(ValueError):
    """A piece of work whose estimated memory passes the budget; raised before anything is allocated."""


def memory_budget(budget=None) -> int:
    """The budget in bytes: ``budget`` if given, else $MINITRANSFORMER_MEMORY_BUDGET, else MEMORY_BUDGET."""
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, (int, numpy.integer)) or budget <= 0:
            raise ValueError(f"memory budget must be a positive number of bytes, got {budget!r}")
        return int(budget)
    text = os.environ.get(ENV, "").strip()
    if not text:
        return MEMORY_BUDGET
    match = re.fullmatch(r"(\d{1,15}(?:\.\d{1,6})?)\s*([KMGT]?)(?:i?B)?", text, flags=re.IGNORECASE)
    if not match or float(match[1]) <= 0:
        raise ValueError(f"{ENV} must be a positive size such as 8G, 512M or 4294967296, got {text!r}")
    return int(float(match[1]) * 1024 ** " KMGT".index(match[2].upper()))        # "" -> 1, K -> 1024, ...


def size(n: int) -> str:
    """Bytes as people read them: 4.0 GiB, 512.0 MiB, 256.0 KiB."""
    shift, unit = (30, "GiB") if n >= 1 << 30 else (20, "MiB") if n >= 1 << 20 else (10, "KiB")
    return f"{n / (1 << shift):.1f} {unit}"


def check(owner: str, parts: dict, what: str, budget=None) -> int:
    """Refuse (BudgetError) when the parts (name -> bytes) add up to more than the budget; -> the sum."""
    need, allowed = sum(parts.values()), memory_budget(budget)
    if need > allowed:
        name, biggest = max(parts.items(), key=lambda item: item[1])
        raise BudgetError(f"{owner}: {what} would take about {size(need)} ({name}: {size(biggest)}), more than the "
                          f"memory budget of {size(allowed)}; ask for less, or raise the budget with the "
                          f"environment variable {ENV} (e.g. {ENV}={-(-need >> 30)}G)")
    return need


def _sizes(config):
    """(D, H, H*Dk, H*Dv, F) of a config: the width of the queries (and keys), of the values."""
    dk = config.d_k or config.d_model // config.num_heads
    return config.d_model, config.num_heads, config.num_heads * dk, config.num_heads * (config.d_v or dk), config.d_ff


def parameter_count(config) -> int:
    """How many numbers the weights of ``Transformer(config)`` hold, computed without building it."""
    d, _, qk, v, f = _sizes(config)

    def linear(n_in, n_out):
        return n_in * n_out + n_out

    attention = 2 * linear(d, qk) + linear(d, v) + linear(v, d)
    ffn, norm = linear(d, f) + linear(f, d), 2 * d
    total = config.num_encoder_layers * (attention + ffn + 2 * norm)
    total += config.num_decoder_layers * (2 * attention + ffn + 3 * norm)
    total += 2 * norm if config.norm_first else 0                             # each stack's final LayerNorm
    total += config.src_vocab_size * d + (0 if config.share_embeddings else config.tgt_vocab_size * d)
    total += 2 * config.max_len * d if config.positional == "learned" else 0
    total += 0 if config.tie_output else linear(d, config.tgt_vocab_size)
    return total


def _layer_activations(config, rows: int, tq: int, tk_self: int, tk_cross: int | None) -> int:
    """Numbers one layer keeps for rows sequences of tq positions attending to tk_self (and tk_cross) keys: per
    attention the projections, heads and four (rows,H,tq,tk) arrays; (rows,tq,F) twice; (rows,tq,D) ten times."""
    d, h, qk, v, f = _sizes(config)
    total = rows * tq * (4 * h * tk_self + 4 * (qk + v) + 2 * f + 10 * d)
    if tk_cross is not None:
        total += rows * tq * (4 * h * tk_cross + 4 * (qk + v) + 4 * d)
    return total


def decoding_parts(config, batch: int, src_len: int, out_len: int, beam: int = 1, naive: bool = False,
                   itemsize: int = 4) -> dict:
    """Bytes of encoding batch sources of src_len tokens and decoding out_len tokens for each of beam hypotheses:
    the encoder's activations, the decoder's per step (cached: one position over a key/value cache held twice
    while it grows; naive: the whole prefix again), and the float64 next-token scores."""
    _, _, qk, v, _ = _sizes(config)
    rows, vocab = batch * beam, config.tgt_vocab_size
    encoder = config.num_encoder_layers * _layer_activations(config, batch, src_len, src_len, None)
    if naive:
        decoder = config.num_decoder_layers * _layer_activations(config, rows, out_len, out_len, src_len)
    else:
        cache = 2 * rows * (qk + v) * (out_len + src_len)                           # keys and values, doubled
        decoder = config.num_decoder_layers * (cache + _layer_activations(config, rows, 1, out_len, src_len))
    scores = rows * vocab * (8 * 8 + itemsize) + rows * out_len * 8 * 3            # (B*K,V) float64 copies
    return {"the encoder's activations (attention scores of each head)": encoder * itemsize,
            "the decoder's key/value cache and activations": decoder * itemsize,
            "the next-token scores (beam x vocabulary)": scores}


def check_model(config, owner: str = "Transformer", dtype=None, budget=None) -> int:
    """Refuse a config whose model (weights, their gradients, two position tables (max_len, D)) passes the budget,
    before it is built."""
    itemsize = numpy.dtype(dtype if dtype is not None else backend.get_default_dtype()).itemsize
    weights = parameter_count(config) * itemsize
    parts = {"weights": weights, "their gradients": weights, "position tables": 2 * config.max_len * config.d_model
             * itemsize}
    return check(owner, parts, "building this model", budget)


def check_decoding(owner: str, model, batch: int, src_len: int, out_len: int, beam: int = 1, naive: bool = False,
                   budget=None) -> int:
    """Refuse decoding whose memory, the model's weights included, passes the budget, before it starts."""
    itemsize = model.parameters()[0].data.dtype.itemsize
    parts = decoding_parts(model.config, batch, src_len, out_len, beam, naive, itemsize)
    what = f"decoding {batch} x {src_len} source tokens into {out_len} tokens" + (f" x beam {beam}" if beam > 1 else "")
    return check(owner, {"the model's weights": 2 * parameter_count(model.config) * itemsize, **parts}, what, budget)
