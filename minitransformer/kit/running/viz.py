"""Figures for the notebooks and the command line, each a matplotlib ``Figure`` on an Agg canvas (no pyplot state,
no GUI; a notebook shows it inline) drawn from NumPy or backend arrays. Attention uses the fixed scale 0..1, so
panels compare by colour; token labels read as words; log axes carry plain numbers."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping
from pathlib import Path

import matplotlib
import numpy
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter, MaxNLocator

from minitransformer import backend, checks
from minitransformer.kit.data.tokenizers import readable_tokens
from minitransformer.kit.files import atomic_write
from minitransformer.kit.running import viewer

CMAP = "viridis"
MAX_LABELS = 40            # a heatmap shows token labels up to this many positions, then position numbers
MAX_GRID_LABELS = 24       # the same for the small panels of attention_grid
KEY_NAME, QUERY_NAME = "key (attended to)", "query (attending)"
_VIRIDIS = matplotlib.colormaps[CMAP]


class _NotebookFigure(Figure):
    """A Figure that Jupyter shows inline as a PNG even where pyplot's inline backend was never set up."""

    def _repr_png_(self):
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        return buffer.getvalue()


def _figure(width: float, height: float, rows: int = 1, cols: int = 1, **subplots):
    fig = _NotebookFigure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)                       # attaches itself as fig.canvas: savefig and draw need no GUI
    return fig, fig.subplots(rows, cols, **subplots)


def _host(x) -> numpy.ndarray:
    if isinstance(x, (list, tuple)):
        x = [backend.to_numpy(v) for v in x]
    return numpy.asarray(backend.to_numpy(x), dtype=numpy.float64)


def _label_axis(ax, axis: str, labels, n: int, limit: int, name: str, fontsize: float = 9, upright=False) -> str:
    """Token labels on one axis (upright on x when long, many or asked), or position numbers when there are none
    or more than ``limit`` -> the axis title, saying when labels were left out."""
    labels = None if labels is None else readable_tokens(labels)
    if labels is not None and n <= limit:
        upright = axis == "x" and (upright or n > 8 or max(len(label) for label in labels) > 5)
        (ax.set_xticks if axis == "x" else ax.set_yticks)(range(n), labels, fontsize=fontsize, rotation=90 * upright)
        return name
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.tick_params(axis=axis, labelsize=fontsize)
    return name if labels is None else f"{name}; {n} tokens, labels hidden"


class _PlainLogFormatter(LogFormatter):
    """Log-axis tick labels as plain numbers ("0.5", "2", "6"), not "6 x 10^0"."""
    def _num_to_string(self, x, vmin, vmax):
        return f"{x:g}"


def _finish(ax, title, xlabel, ylabel, *, logy: bool = False, legend: bool = True) -> None:
    """A line plot's axis titles, grid, legend and (logy) log scale with plain numbers."""
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_PlainLogFormatter())
        ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=9)


def attention_heatmap(weights, x_labels=None, y_labels=None, title=None, ax=None, *, colorbar: bool = True,
                      annotate: bool | None = None, x_name: str = KEY_NAME, y_name: str = QUERY_NAME) -> Figure:
    """One attention map, weights (Tq, Tk) such as ``mha.attn[b, h]``: row q holds what query q gives each key.
    x_labels, y_labels: key and query tokens; ax: draw there; annotate: each weight in its cell (default: up to
    10 tokens a side); x_name, y_name: the axis titles."""
    w = _host(weights)                                                    # (Tq, Tk)
    if w.ndim != 2:
        raise ValueError(f"attention_heatmap: weights must be 2-D (Tq, Tk), got shape {w.shape}; "
                         "for a (B, H, Tq, Tk) array pass one sentence and head, weights[b, h]")
    Tq, Tk = w.shape
    if ax is None:
        ax = _figure(min(10.0, max(4.0, 2.0 + 0.38 * Tk)), min(9.0, max(3.2, 1.2 + 0.38 * Tq)))[1]
    fontsize = 7 if max(Tq, Tk) > 20 else 9
    im = ax.imshow(w, cmap=CMAP, vmin=0.0, vmax=1.0, aspect="auto" if max(Tq, Tk) > MAX_LABELS else "equal")
    ax.set_xlabel(_label_axis(ax, "x", x_labels, Tk, MAX_LABELS, x_name, fontsize))
    ax.set_ylabel(_label_axis(ax, "y", y_labels, Tq, MAX_LABELS, y_name, fontsize))
    ax.set_title(title if title is not None else "Attention weights")
    if annotate if annotate is not None else max(Tq, Tk) <= 10:
        for (q, k), value in numpy.ndenumerate(w):           # dark text on the light end of viridis, light on dark
            ax.text(k, q, f"{value:.2f}", ha="center", va="center", fontsize=9,
                    color="black" if value > 0.55 else "white")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, label="attention weight", shrink=0.9)
    return ax.figure.figure                                  # the top-level Figure, also when ax is in a SubFigure


def attention_grid(attn, x_labels=None, y_labels=None, title=None, *, x_name: str = KEY_NAME,
                   y_name: str = QUERY_NAME) -> Figure:
    """A panel per head, one colour bar: attn (H, Tq, Tk), four to a row, or a list over layers of (H, Tq, Tk), a
    row per layer (for a layer's ``.attn`` pass one sentence, ``attn[b]``). Labels on the outer panels."""
    single = not isinstance(attn, (list, tuple))
    maps = _host(attn)[None] if single else _host(attn)                  # (L, H, Tq, Tk)
    if maps.ndim != 4:
        raise ValueError(f"attention_grid: attn must be (H, Tq, Tk) or a list over layers of (H, Tq, Tk), got "
                         f"shape {maps.shape[single:]}; for a layer's .attn (B, H, Tq, Tk) pass one sentence, attn[b]")
    L, H, Tq, Tk = maps.shape
    panels = [(layer, h) for layer in range(L) for h in range(H)]
    n_cols = min(H, 4) if single else H
    n_rows = math.ceil(len(panels) / n_cols)
    side = max(1.4, min(3.2, 0.16 * max(Tq, Tk) + 0.5, 16.0 / n_cols))   # inches: wide grids within ~16 inches
    fig, axes = _figure(n_cols * side + 1.4, n_rows * side + 1.5, n_rows, n_cols, squeeze=False)
    axes = axes.ravel()
    for ax in axes[len(panels):]:
        ax.remove()                                      # the spare cells of a last row that heads do not fill
    for i, ((layer, h), ax) in enumerate(zip(panels, axes)):
        im = ax.imshow(maps[layer, h], cmap=CMAP, vmin=0.0, vmax=1.0, aspect="auto")
        x_title = _label_axis(ax, "x", x_labels, Tk, MAX_GRID_LABELS, x_name, fontsize=7, upright=True)
        y_title = _label_axis(ax, "y", y_labels, Tq, MAX_GRID_LABELS, y_name, fontsize=7)
        ax.tick_params(labelbottom=i + n_cols >= len(panels), labelleft=i % n_cols == 0)   # outer panels only
        ax.set_title(f"head {h}" if single else f"layer {layer}, head {h}", fontsize=9)
    fig.colorbar(im, ax=list(axes[: len(panels)]), label="attention weight", shrink=0.8)
    fig.suptitle(title if title is not None else f"Attention weights per {'head' if single else 'layer and head'}")
    fig.supxlabel(x_title, fontsize=10)
    fig.supylabel(y_title, fontsize=10)
    return fig


class Explanation:
    """What ``explain`` returns: ``.data`` (see ``viewer.build``), shown inline by Jupyter, JupyterLab and VS Code;
    ``.save("page.html")`` the page, ``.save("fig.png")`` (or .svg, .pdf) one layer's heads, ``.figure()`` them."""

    def __init__(self, data: dict):
        self.data = data

    def html(self) -> str:
        return viewer.page(self.data)

    def _repr_html_(self) -> str:      # in an iframe: the page's script and style stay apart from the notebook's
        return (f"<iframe srcdoc=\"{html.escape(self.html())}\" style=\"width:100%;height:760px;border:0\" "
                f"title=\"minitransformer explain\"></iframe>")

    def attention(self, stack: str = "decoder_cross") -> numpy.ndarray:
        """One stack's attention weights, (layers, heads, queries, keys)."""
        checks.one_of("Explanation", "stack", stack, viewer.STACKS)
        packed = self.data["stacks"][stack]["attn"]
        return numpy.frombuffer(base64.b64decode(packed["b64"]), "<f4").reshape(packed["shape"])

    def figure(self, stack: str = "decoder_cross", layer: int = -1) -> Figure:
        attn, d = self.attention(stack), self.data                                                 # (L,H,Tq,Tk)
        checks.int_in("Explanation.figure", "layer", layer, -len(attn), len(attn) - 1)
        rows = d["src"] if stack == "encoder" else d["tgt_out"]               # a decoder query: the token it produces
        return attention_grid(attn[layer], x_labels=d["tgt_in"] if stack == "decoder_self" else d["src"],
                              y_labels=rows, title=f"{stack}, layer {layer}")

    def save(self, path, *, stack: str = "decoder_cross", layer: int = -1) -> Path:
        """Write the page (a path ending in .html) or the figure of one layer's heads (.png, .svg, .pdf)."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix in (".html", ".htm"):
            atomic_write(path, lambda f: f.write(self.html().encode("utf-8")), "page")
        elif suffix in (".png", ".svg", ".pdf"):
            fig = self.figure(stack, layer)
            atomic_write(path, lambda f: fig.savefig(f, format=suffix[1:], dpi=150, bbox_inches="tight"), "figure")
        else:
            raise ValueError(f"Explanation.save: path must end in .html, .png, .svg or .pdf, got {str(path)!r}")
        return path


def explain(model, src, tgt=None, *, tokenizers=None, beam_size: int = 1, alpha: float = 0.6) -> Explanation:
    """One sentence through a model of either tier, on one offline page (see ``viewer``); ``Explanation`` shows and
    saves it. src, tgt: texts (with tokenizers=(src_tok, tgt_tok)) or token ids; tgt None: the model's own output,
    decoded greedily or with beam_size > 1 (length penalty alpha)."""
    return Explanation(viewer.build(model, src, tgt, tokenizers=tokenizers, beam_size=beam_size, alpha=alpha))


def _mask_image(mask, name: str, where: str) -> tuple[numpy.ndarray, str]:
    """(image, row name) of a mask (Tq, Tk) with leading axes of size 1, or padding (B, 1, 1, Tk): a row a sentence."""
    m = _host(mask)
    if m.ndim == 4 and m.shape[1:3] == (1, 1):
        image, rows = m[:, 0, 0], "sentence in batch"                     # (B, Tk): the same for every query
    elif m.ndim >= 2 and m.size == math.prod(m.shape[-2:]):
        image, rows = m.reshape(m.shape[-2:]), "query position"           # (Tq, Tk)
    else:
        image, rows = m, ""
    if image.ndim != 2 or not numpy.isin(image, (0, 1)).all():
        raise ValueError(f"{where}: {name} must be boolean (True = may attend) of shape (Tq, Tk), (1, 1, Tq, Tk) or "
                         f"(B, 1, 1, Tk); for a mask per sentence pass one, {name}[b]; got values "
                         f"{numpy.unique(image)[:4]} of shape {m.shape}")
    return image.astype(bool), rows


def _draw_masks(fig, axes, masks: list, x_labels=None, y_labels=None) -> None:
    for ax, (title, m, row_name) in zip(axes, masks):
        rows, cols = m.shape
        im = ax.imshow(m, cmap=ListedColormap([_VIRIDIS(0.0), _VIRIDIS(0.95)]), vmin=0, vmax=1)
        ax.set_xlabel(_label_axis(ax, "x", x_labels, cols, MAX_LABELS, "key position", 9 if cols <= 20 else 7))
        ax.set_ylabel(_label_axis(ax, "y", y_labels, rows, MAX_LABELS, row_name, 9 if rows <= 20 else 7))
        ax.set_title(title)
        if max(rows, cols) <= MAX_LABELS:                                 # cell borders, to count positions
            ax.set_xticks(numpy.arange(-0.5, cols), minor=True)
            ax.set_yticks(numpy.arange(-0.5, rows), minor=True)
            ax.grid(which="minor", color="grey", linewidth=0.6)
            ax.tick_params(which="minor", length=0)
    bar = fig.colorbar(im, ax=axes, ticks=[0.25, 0.75], shrink=0.8, aspect=12)
    bar.ax.set_yticklabels(["False:\nmasked", "True:\nmay attend"], fontsize=9)


def mask_image(mask, title=None, x_labels=None, y_labels=None) -> Figure:
    """A boolean mask as an image, bright = True = may attend: (Tq, Tk), (1, 1, Tq, Tk) or (B, 1, 1, Tk)."""
    m, row_name = _mask_image(mask, "mask", "mask_image")                # (rows, cols)
    fig, ax = _figure(min(10.0, 2.6 + 0.34 * m.shape[1]), min(9.0, 1.4 + 0.34 * m.shape[0]))
    _draw_masks(fig, [ax], [(title if title is not None else "Attention mask", m, row_name)], x_labels, y_labels)
    return fig


def masks_figure(masks, title=None) -> Figure:
    """Masks side by side, each titled by its name: e.g. {"padding": pad, "subsequent": sub, "both": pad & sub}."""
    if not isinstance(masks, Mapping) or not masks:
        raise ValueError(f"masks_figure: masks must be a non-empty dict name -> mask, got {masks!r:.80}")
    images = [(str(name), *_mask_image(m, f"masks[{name!r}]", "masks_figure")) for name, m in masks.items()]
    fig, axes = _figure(sum(min(5.0, 1.2 + 0.3 * m.shape[1]) for _, m, _ in images) + 1.6,
                        min(6.0, 1.8 + 0.3 * max(m.shape[0] for _, m, _ in images)), 1, len(images), squeeze=False)
    _draw_masks(fig, list(axes[0]), images)
    fig.suptitle(title if title is not None else "Attention masks")
    return fig


def _pe_table(pe, where: str) -> numpy.ndarray:
    table = _host(pe)
    table = table[0] if table.ndim == 3 and table.shape[0] == 1 else table
    checks.float_array(where, "pe (positions T, dimensions D)", table, ndim=2)
    return table                                                          # (T, D)


def positional_encoding_heatmap(pe, title=None) -> Figure:
    """The positional-encoding table pe (T, D) (or (1, T, D)) as an image, a row per position."""
    table = _pe_table(pe, "positional_encoding_heatmap")                 # (T, D)
    T, D = table.shape
    fig, ax = _figure(8.0, 4.5)
    im = ax.imshow(table, cmap=CMAP, vmin=min(-1.0, table.min()), vmax=max(1.0, table.max()), aspect="auto",
                   interpolation="nearest")
    ax.set(xlabel=f"dimension i (d_model = {D})", ylabel="position pos",
           title=title if title is not None else f"Positional encoding, {T} positions x {D} dimensions")
    fig.colorbar(im, ax=ax, label="PE(pos, i)")
    return fig


def positional_encoding_curves(pe, dims=(4, 5, 6, 7), title=None, *, sinusoidal: bool = True) -> Figure:
    """Columns ``dims`` of the positional-encoding table pe (T, D) as curves over the positions; sinusoidal: label
    each sin (even) or cos (odd), the paper's layout."""
    table = _pe_table(pe, "positional_encoding_curves")                  # (T, D)
    dims = [dims] if isinstance(dims, (int, numpy.integer)) else list(dims)
    if not dims or any(isinstance(d, bool) or not isinstance(d, (int, numpy.integer)) or not 0 <= d < table.shape[1]
                       for d in dims):
        raise ValueError(f"positional_encoding_curves: dims must be integers in 0..{table.shape[1] - 1} "
                         f"(pe has D = {table.shape[1]}), got {dims!r}")
    fig, ax = _figure(8.0, 3.8)
    for j, d in enumerate(dims):
        kind = (" (sin)" if d % 2 == 0 else " (cos)") if sinusoidal else ""
        ax.plot(numpy.arange(len(table)), table[:, d], ["-", "--", "-.", ":"][j % 4], label=f"dim {d}{kind}")
    _finish(ax, title if title is not None else "Positional encoding across positions", "position pos",
            "PE(pos, dim)", legend=False)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    return fig


def _series(x, name: str, where: str) -> tuple[numpy.ndarray, numpy.ndarray]:
    """(steps, values) of a list (steps 1..n), a dict step -> value (JSON's string steps too) or a pair."""
    if isinstance(x, Mapping):
        x = tuple(zip(*sorted((float(step), value) for step, value in x.items())))
    if isinstance(x, (list, tuple)) and len(x) == 2 and all(numpy.ndim(backend.to_numpy(p)) == 1 for p in x):
        steps, values = _host(x[0]), _host(x[1])
    else:
        values = _host(x)
        steps = numpy.arange(1.0, len(values) + 1) if values.ndim == 1 else None          # (n,)
    if steps is None or values.ndim != 1 or steps.shape != values.shape or not len(values):
        raise ValueError(f"{where}: {name} must be a list of values, a dict step -> value or a pair (steps, "
                         f"values) of one length, got shape {values.shape} for {'no' if steps is None else len(steps)} "
                         "steps")
    return steps, values


def lr_schedule(lrs, title=None, *, logy: bool = False) -> Figure:
    """The learning rate at every step, the peak (end of warmup) marked. lrs: a list for steps 1..n, a pair
    (steps, lrs) or a dict step -> lr."""
    steps, values = _series(lrs, "lrs", "lr_schedule")                   # (n,), (n,)
    fig, ax = _figure(7.0, 3.8)
    ax.plot(steps, values, color=_VIRIDIS(0.3), linewidth=2)
    peak = int(numpy.argmax(values))
    ax.plot(steps[peak], values[peak], "o", color=_VIRIDIS(0.75), markersize=7,
            label=f"peak {values[peak]:.3g} at step {steps[peak]:g}")
    _finish(ax, title if title is not None else "Learning-rate schedule", "step", "learning rate", logy=logy)
    return fig


def loss_curves(train, valid=None, xlabel="step", title=None, *, logy: bool = False, metric=None,
                metric_name: str = "validation metric") -> Figure:
    """The training loss (with a running mean from 100 points on), the valid loss, and beside them a valid score
    (metric, e.g. BLEU). Each: a list (steps 1..n), a dict step -> value or a pair (steps, values)."""
    steps, values = _series(train, "train", "loss_curves")               # (n,), (n,)
    fig, axes = _figure(7.0 if metric is None else 11.0, 3.8, 1, 1 if metric is None else 2, squeeze=False, sharex=True)
    ax, n = axes[0, 0], len(values)
    if n >= 100:
        window = max(2, n // 25)
        mean = numpy.convolve(values, numpy.ones(window) / window, mode="valid")     # (n - window + 1,)
        ax.plot(steps, values, color=_VIRIDIS(0.3), alpha=0.3, linewidth=1, label="train (raw)")
        ax.plot(steps[window - 1:], mean, color=_VIRIDIS(0.3), linewidth=2, label=f"train (mean of {window})")
    else:
        ax.plot(steps, values, color=_VIRIDIS(0.3), linewidth=2, marker="." if n <= 30 else None, label="train")
    if valid is not None:
        ax.plot(*_series(valid, "valid", "loss_curves"), "o-", color=_VIRIDIS(0.75), linewidth=2, label="valid")
    _finish(ax, title if title is not None else "Loss", xlabel, "loss", logy=logy)
    if metric is not None:
        at, scores = _series(metric, "metric", "loss_curves")            # (m,), (m,)
        score_ax = axes[0, 1]
        score_ax.plot(at, scores, "o-", color=_VIRIDIS(0.55), linewidth=2)
        score_ax.annotate(f"{scores[-1]:.4g}", (at[-1], scores[-1]), textcoords="offset points", xytext=(0, 6),
                          ha="center", fontsize=9)                       # the last value, where the run ended
        score_ax.margins(y=0.15)                                         # room above the last value's label
        _finish(score_ax, f"{metric_name} at each evaluation", xlabel, metric_name, legend=False)
    return fig


def bar_errors(report_rows, bound: float = 1e-6, title=None) -> Figure:
    """Relative gradient errors per tensor ((name, error) pairs or a dict) on a log axis, bound drawn, red bars
    failing."""
    bound = checks.positive_number("bar_errors", "bound", bound)
    names, errors = zip(*(report_rows.items() if isinstance(report_rows, Mapping) else report_rows))
    errors = _host([float(backend.to_numpy(e)) for e in errors])         # (n,)
    left = 10.0 ** (math.floor(math.log10(min(errors[errors > 0].min(initial=bound), bound))) - 1)
    fig, ax = _figure(7.5, 1.3 + 0.32 * len(errors))
    colors = [_VIRIDIS(0.55) if e <= bound else "#d62728" for e in errors]
    ax.barh(range(len(errors)), numpy.maximum(errors, left) - left, left=left, color=colors, height=0.6)
    for i, e in enumerate(errors):
        ax.text(max(e, left) * 1.3, i, f"{e:.1e}" if e > 0 else "0", va="center", fontsize=8)
    ax.axvline(bound, color="black", linestyle="--", linewidth=1.2, label=f"bound {bound:g}: bars past it fail")
    ax.set_yticks(range(len(errors)), [str(name) for name in names], fontsize=9)
    ax.invert_yaxis()                                                    # first row on top, as in the report
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set(xscale="log", xlim=(left, max(errors.max(), bound) * 50), xlabel="max relative error (log scale)",
           ylabel="tensor", title=title if title is not None else "Gradient check: analytic vs numeric")
    return fig


def _histogram_into(ax, values, bins, show_mean: bool = True) -> numpy.ndarray:
    v = _host(values).ravel()                                            # (n,)
    ax.hist(v, bins=bins, color=_VIRIDIS(0.35), edgecolor="white", linewidth=0.3)
    ax.text(0.97, 0.95, (f"mean {v.mean():.3g}\n" if show_mean else "") + f"var {v.var():.3g}", fontsize=8, ha="right",
            va="top", transform=ax.transAxes, bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8})
    return v


def histogram(values, bins=50, title=None, xlabel=None) -> Figure:
    """A histogram of any array (flattened), its mean and variance in the corner."""
    fig, ax = _figure(6.0, 3.6)
    v = _histogram_into(ax, values, bins)
    ax.set(xlabel=xlabel if xlabel is not None else "value", ylabel="count",
           title=title if title is not None else f"Histogram of {v.size} values")
    return fig


def score_variance_figure(d_k_values=(4, 16, 64, 256), rng=None, n_samples: int = 5000) -> Figure:
    """Why the paper divides by sqrt(d_k): for q, k of independent N(0, 1) components var(q.k) = d_k, so the top
    row spreads as d_k grows; q.k / sqrt(d_k) (bottom) keeps variance 1. rng: a Generator or seed (default 0)."""
    d_ks = [d_k_values] if isinstance(d_k_values, (int, numpy.integer)) else list(d_k_values)
    if not d_ks or any(isinstance(d, bool) or not isinstance(d, (int, numpy.integer)) or d < 1 for d in d_ks):
        raise ValueError(f"score_variance_figure: d_k_values must be positive integers, got {d_k_values!r}")
    rng = numpy.random.default_rng(0 if rng is None else rng)
    raw = [(rng.standard_normal((n_samples, d)) * rng.standard_normal((n_samples, d))).sum(axis=1) for d in d_ks]
    fig, axes = _figure(2.6 * len(d_ks) + 0.8, 5.2, 2, len(d_ks), squeeze=False, sharex="row")
    for row, samples in enumerate([raw, [s / math.sqrt(d) for s, d in zip(raw, d_ks)]]):
        edges = numpy.linspace(min(s.min() for s in samples), max(s.max() for s in samples), 61)    # (61,)
        for ax, d_k, values in zip(axes[row], d_ks, samples):
            _histogram_into(ax, values, edges, show_mean=False)
            ax.set_title(f"d_k = {d_k}, {'scaled' if row else 'unscaled'}", fontsize=10)
            ax.set(xlabel="q·k / √d_k" if row else "q·k", ylabel="count")
            ax.tick_params(labelsize=8)
    fig.suptitle("Variance of q·k grows with d_k; dividing by √d_k keeps it at 1")
    return fig
