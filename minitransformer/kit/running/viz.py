"""Figures for the notebooks and the command line: attention maps, masks, positional encoding,
learning-rate schedules, loss curves, gradient-check errors and the sqrt(d_k) histograms.

Every function returns a matplotlib ``Figure`` and never calls ``plt.show()``. Figures are built with
the object-oriented API (``matplotlib.figure.Figure`` on an Agg canvas), so nothing here touches
pyplot's global state and no GUI is needed:

    fig = viz.attention_grid(attn, x_labels=src_tokens, y_labels=tgt_tokens)
    fig.savefig("attention.png")        # works on a server, in CI, anywhere
    fig                                 # last expression of a Jupyter cell: shown inline as a PNG

Inputs are NumPy arrays, Python lists, or arrays of the active backend (CuPy arrays are copied to the
host with ``backend.to_numpy``). Images use viridis, a perceptually uniform colour map; attention
weights always use the fixed scale 0..1 so panels can be compared by colour. Token labels are shown as
words: BPE symbols lose the tokeniser's internal ``</w>`` and a piece inside a word reads "orange@@"
(``tokenizers.readable_tokens``). Log axes carry plain numbers (0.5, 2, 6), never "6 x 10^0".
Shape letters: Tq query positions, Tk key positions, H heads, L layers, T positions, D d_model.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping

import matplotlib
import numpy
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import LogFormatter, MaxNLocator

from minitransformer import backend
from minitransformer.kit.data.tokenizers import readable_tokens

CMAP = "viridis"
MAX_LABELS = 40            # a heatmap shows token labels up to this many positions, then plain indices
MAX_GRID_LABELS = 24       # the same for the small panels of attention_grid
PANEL_FONT = 7             # tick labels inside grids of small panels


# ----------------------------------------------------------------------------- figure and inputs

class _NotebookFigure(Figure):
    """A Figure that shows itself as a PNG in Jupyter.

    IPython only knows how to draw a plain Figure once pyplot's inline backend is set up
    (``%matplotlib inline`` or a pyplot call). ``_repr_png_`` makes a returned figure display
    inline without that; where the inline backend is active its own formatter is used instead.
    """

    def _repr_png_(self):
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        return buffer.getvalue()


def _new_figure(width: float, height: float) -> Figure:
    """An empty figure of width x height inches with an Agg canvas and constrained layout."""
    fig = _NotebookFigure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: savefig and canvas.draw() need no GUI
    return fig


def _root_figure(ax) -> Figure:
    """The top-level Figure that holds ``ax`` (also when ax sits in a SubFigure)."""
    fig = ax.figure
    while not isinstance(fig, Figure):
        fig = fig.figure
    return fig


def _array(x, name: str, where: str) -> numpy.ndarray:
    """``x`` as a float NumPy array on the host; TypeError naming the argument if it is not numeric."""
    if isinstance(x, (list, tuple)):
        x = [backend.to_numpy(v) if hasattr(v, "get") else v for v in x]  # lists of CuPy arrays
    try:
        arr = numpy.asarray(backend.to_numpy(x))
    except (TypeError, ValueError) as err:
        raise TypeError(f"{where}: {name} must be an array or a list of numbers, "
                        f"got {type(x).__name__} ({err})") from err
    if arr.dtype == object or not (numpy.issubdtype(arr.dtype, numpy.number) or arr.dtype == bool):
        raise TypeError(f"{where}: {name} must hold numbers, got an array of dtype {arr.dtype}")
    if arr.size == 0:
        raise ValueError(f"{where}: {name} is empty (shape {arr.shape})")
    return arr.astype(numpy.float64) if arr.dtype != bool else arr


def _labels(labels, n: int, name: str, where: str, positions: str):
    """Check token labels: None, or one string per position."""
    if labels is None:
        return None
    if isinstance(labels, str):
        raise TypeError(f"{where}: {name} must be a sequence of strings, one per {positions}, got the single "
                        f"string {labels!r}; split it first, e.g. {labels!r}.split()")
    labels = readable_tokens(labels)
    if len(labels) != n:
        raise ValueError(f"{where}: {name} must have one label per {positions} ({n}), got {len(labels)}")
    return labels


def _set_ticks(ax, axis: str, labels, n: int, max_labels: int, fontsize: float, show: bool = True,
               roomy: bool = True) -> bool:
    """Token labels on one axis of an image, or integer positions when there are none or too many.

    Returns True when the token labels were drawn. ``show=False`` hides the tick labels (inner panels);
    ``roomy=False`` (small panels) always turns x labels upright.
    """
    which = ax.xaxis if axis == "x" else ax.yaxis
    drawn = labels is not None and n <= max_labels
    if drawn:
        # short words side by side stay horizontal; longer or many labels on x are turned upright
        upright = axis == "x" and (not roomy or n > 8 or max(len(label) for label in labels) > 5)
        which.set_ticks(range(n))
        which.set_ticklabels(labels, fontsize=fontsize, rotation=90 if upright else 0)
    else:
        which.set_major_locator(MaxNLocator(nbins=6, integer=True))
        ax.tick_params(axis=axis, labelsize=fontsize)
    if not show:
        ax.tick_params(axis=axis, **({"labelbottom": False} if axis == "x" else {"labelleft": False}))
    return drawn


def _axis_name(base: str, labels, n: int, max_labels: int) -> str:
    """An axis label that says when the token labels were dropped for lack of room."""
    if labels is not None and n > max_labels:
        return f"{base}; {n} tokens, labels hidden"
    return base


class _PlainLogFormatter(LogFormatter):
    """Log-axis tick labels as plain numbers ("0.5", "2", "6"), chosen as matplotlib chooses them (decades,
    and minor ticks where the axis spans little), instead of its default mathtext "6 x 10^0"."""

    def _num_to_string(self, x, vmin, vmax):
        return f"{x:g}"


def _plain_log_ticks(axis) -> None:
    axis.set_major_formatter(_PlainLogFormatter())
    axis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def _cell_grid(ax, n_rows: int, n_cols: int, color: str = "white") -> None:
    """Thin lines between the cells of an image, so positions can be counted (small images only)."""
    if max(n_rows, n_cols) > MAX_LABELS:
        return
    ax.set_xticks(numpy.arange(-0.5, n_cols, 1.0), minor=True)
    ax.set_yticks(numpy.arange(-0.5, n_rows, 1.0), minor=True)
    ax.grid(which="minor", color=color, linewidth=0.6)
    ax.tick_params(which="minor", length=0)


# ----------------------------------------------------------------------------- attention

KEY_NAME, QUERY_NAME = "key (attended to)", "query (attending)"


def attention_heatmap(weights, x_labels=None, y_labels=None, title=None, ax=None, *,
                      colorbar: bool = True, annotate: bool | None = None, x_name: str = KEY_NAME,
                      y_name: str = QUERY_NAME) -> Figure:
    """One attention map: row q holds the weights query q gives to every key.

    weights   (Tq, Tk) attention weights in [0, 1] (each row sums to 1), e.g. ``mha.attn[b, h]``.
    x_labels  Tk key tokens (columns), y_labels Tq query tokens (rows); hidden beyond 40 tokens.
    ax        draw into this Axes (of any figure) instead of a new figure.
    annotate  write each weight in its cell; default: when both sides have at most 10 tokens.
    x_name, y_name  the axis titles: say what a row is, e.g. "query: the decoder's input at that position"
              (a decoder row t reads token t and produces token t + 1: label it by one and say which).
    Returns the Figure that holds the map.
    """
    where = "attention_heatmap"
    w = _array(weights, "weights", where)
    if w.ndim != 2:
        raise ValueError(f"{where}: weights must be 2-D (Tq, Tk), got shape {w.shape}; "
                         "for a (B, H, Tq, Tk) array pass one sentence and head, weights[b, h]")
    Tq, Tk = w.shape                                                      # (Tq, Tk)
    x_labels = _labels(x_labels, Tk, "x_labels", where, "key position")
    y_labels = _labels(y_labels, Tq, "y_labels", where, "query position")
    if ax is None:
        fig = _new_figure(min(10.0, max(4.0, 2.0 + 0.38 * Tk)), min(9.0, max(3.2, 1.2 + 0.38 * Tq)))
        ax = fig.add_subplot()
    else:
        fig = _root_figure(ax)
    crowded = (x_labels is not None and 20 < Tk <= MAX_LABELS) or (y_labels is not None and 20 < Tq <= MAX_LABELS)
    fontsize = 7 if crowded else 9
    im = ax.imshow(w, cmap=CMAP, vmin=0.0, vmax=1.0, aspect="auto" if max(Tq, Tk) > MAX_LABELS else "equal")
    _set_ticks(ax, "x", x_labels, Tk, MAX_LABELS, fontsize)
    _set_ticks(ax, "y", y_labels, Tq, MAX_LABELS, fontsize)
    ax.set_xlabel(_axis_name(x_name, x_labels, Tk, MAX_LABELS))
    ax.set_ylabel(_axis_name(y_name, y_labels, Tq, MAX_LABELS))
    ax.set_title(title if title is not None else "Attention weights")
    if annotate is None:
        annotate = max(Tq, Tk) <= 10
    if annotate:
        for q in range(Tq):
            for k in range(Tk):
                # dark text on the light (high) end of viridis, light text on the dark end
                ax.text(k, q, f"{w[q, k]:.2f}", ha="center", va="center", fontsize=9,
                        color="black" if w[q, k] > 0.55 else "white")
    if colorbar:
        fig.colorbar(im, ax=ax, label="attention weight", shrink=0.9)
    return fig


def _attention_layers(attn, where: str) -> tuple[list[numpy.ndarray], bool]:
    """attn as a list of (H, Tq, Tk) host arrays, one per layer, and whether a single layer was given."""
    if isinstance(attn, (list, tuple)):
        if len(attn) == 0:
            raise ValueError(f"{where}: attn is an empty list; give one (H, Tq, Tk) array per layer")
        layers = [_array(a, f"attn[{i}]", where) for i, a in enumerate(attn)]
        for i, a in enumerate(layers):
            if a.ndim != 3:
                raise ValueError(f"{where}: attn[{i}] must be 3-D (H, Tq, Tk), got shape {a.shape}"
                                 + ("; pass one sentence, attn[i][b]" if a.ndim == 4 else ""))
            if a.shape != layers[0].shape:
                raise ValueError(f"{where}: every layer must have the same shape (H, Tq, Tk); "
                                 f"attn[0] has {layers[0].shape}, attn[{i}] has {a.shape}")
        return layers, False
    a = _array(attn, "attn", where)
    if a.ndim == 3:
        return [a], True
    hint = ("; for a layer's .attn (B, H, Tq, Tk) pass one sentence, attn[b], and for several layers "
            "a list of (H, Tq, Tk) arrays" if a.ndim == 4 else "")
    raise ValueError(f"{where}: attn must be (H, Tq, Tk) or a list over layers of (H, Tq, Tk), "
                     f"got an array of shape {a.shape}{hint}")


def attention_grid(attn, x_labels=None, y_labels=None, title=None, *, x_name: str = KEY_NAME,
                   y_name: str = QUERY_NAME) -> Figure:
    """Attention maps of every head, and of every layer when given several: one panel each.

    attn      (H, Tq, Tk) for one layer: one panel per head, four panels to a row;
              or a list over layers of (H, Tq, Tk): rows = layers, columns = heads.
              For a layer's ``.attn`` of shape (B, H, Tq, Tk), pass one sentence: ``attn[b]``.
    x_labels  Tk key tokens, y_labels Tq query tokens; drawn on the outer panels only, and
              replaced by position numbers beyond 24 tokens.
    x_name, y_name  the axis titles (see ``attention_heatmap``).
    Layers and heads are numbered from 0, as the array indices. One colour bar, fixed scale 0..1.
    """
    where = "attention_grid"
    layers, single = _attention_layers(attn, where)
    H, Tq, Tk = layers[0].shape                                           # (H, Tq, Tk)
    x_labels = _labels(x_labels, Tk, "x_labels", where, "key position")
    y_labels = _labels(y_labels, Tq, "y_labels", where, "query position")
    if single:
        n_cols = min(H, 4)
        n_rows = math.ceil(H / n_cols)
        panels = [(None, h) for h in range(H)]
    else:
        n_rows, n_cols = len(layers), H
        panels = [(layer, h) for layer in range(len(layers)) for h in range(H)]
    # room for token labels: about a sixth of an inch per token, within sensible bounds
    label_room = 0.6 if x_labels is not None and Tk <= MAX_GRID_LABELS else 0.2
    panel_w = min(3.2, max(1.8, 0.16 * Tk + 0.5))
    panel_h = min(3.2, max(1.8, 0.16 * Tq + 0.5))
    shrink = min(1.0, 16.0 / (n_cols * panel_w))       # keep wide grids within about 16 inches
    panel_w, panel_h = max(1.4, panel_w * shrink), max(1.4, panel_h * shrink)
    fig = _new_figure(n_cols * panel_w + 1.4, n_rows * panel_h + 0.9 + label_room)
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.remove()                                    # a single layer whose heads do not fill the last row
    im = None
    for i, (layer, h) in enumerate(panels):
        ax = axes.flat[i]
        w = layers[0 if layer is None else layer][h]                      # (Tq, Tk)
        im = ax.imshow(w, cmap=CMAP, vmin=0.0, vmax=1.0, aspect="auto")
        left_column = i % n_cols == 0
        nothing_below = i + n_cols >= len(panels)
        _set_ticks(ax, "x", x_labels, Tk, MAX_GRID_LABELS, PANEL_FONT, show=nothing_below, roomy=False)
        _set_ticks(ax, "y", y_labels, Tq, MAX_GRID_LABELS, PANEL_FONT, show=left_column)
        ax.set_title(f"head {h}" if layer is None else f"layer {layer}, head {h}", fontsize=9)
    fig.colorbar(im, ax=list(axes.flat[: len(panels)]), label="attention weight", shrink=0.8)
    if title is None:
        title = "Attention weights per head" if single else "Attention weights per layer and head"
    fig.suptitle(title)
    fig.supxlabel(_axis_name(x_name, x_labels, Tk, MAX_GRID_LABELS), fontsize=10)
    fig.supylabel(_axis_name(y_name, y_labels, Tq, MAX_GRID_LABELS), fontsize=10)
    return fig


# ----------------------------------------------------------------------------- masks

_MASK_CMAP = ListedColormap([matplotlib.colormaps[CMAP](0.0), matplotlib.colormaps[CMAP](0.95)])
_MASK_NORM = BoundaryNorm([-0.5, 0.5, 1.5], 2)


def _mask_2d(mask, name: str, where: str) -> tuple[numpy.ndarray, str, str]:
    """A mask as a 2-D boolean image, with the names of its row and column axes."""
    m = _array(mask, name, where)
    if m.dtype != bool:
        if not numpy.isin(m, (0.0, 1.0)).all():
            raise ValueError(f"{where}: {name} must be boolean (True = may attend), got values other than 0 and 1")
        m = m.astype(bool)
    shapes = "(Tq, Tk), (1, Tq, Tk), (1, 1, Tq, Tk) or (B, 1, 1, Tk)"
    if m.ndim == 2:
        return m, "query position", "key position"                        # (Tq, Tk)
    if m.ndim == 3 and m.shape[0] == 1:
        return m[0], "query position", "key position"                     # (Tq, Tk)
    if m.ndim == 4 and m.shape[1] == 1:
        B, _, Tq, _ = m.shape
        if Tq == 1:                                    # padding mask: one row per sentence, same for every query
            return m[:, 0, 0, :], "sentence in batch", "key position"     # (B, Tk)
        if B == 1:
            return m[0, 0], "query position", "key position"              # (Tq, Tk)
        raise ValueError(f"{where}: {name} has shape {m.shape}, a mask per sentence; "
                         f"pass one sentence, {name}[b], or a mask of shape {shapes}")
    raise ValueError(f"{where}: {name} must have shape {shapes}, got {m.shape}")


def _draw_mask(ax, m, row_name, col_name, x_labels, y_labels, title, where):
    rows, cols = m.shape
    x_labels = _labels(x_labels, cols, "x_labels", where, "column")
    y_labels = _labels(y_labels, rows, "y_labels", where, "row")
    im = ax.imshow(m.astype(int), cmap=_MASK_CMAP, norm=_MASK_NORM, aspect="equal")
    fontsize = 9 if max(rows, cols) <= 20 else 7
    _set_ticks(ax, "x", x_labels, cols, MAX_LABELS, fontsize)
    _set_ticks(ax, "y", y_labels, rows, MAX_LABELS, fontsize)
    _cell_grid(ax, rows, cols, color="grey")
    ax.set_xlabel(_axis_name(col_name, x_labels, cols, MAX_LABELS))
    ax.set_ylabel(_axis_name(row_name, y_labels, rows, MAX_LABELS))
    ax.set_title(title)
    return im


def _mask_colorbar(fig, im, axes):
    cbar = fig.colorbar(im, ax=axes, ticks=[0, 1], shrink=0.8, aspect=12)
    cbar.ax.set_yticklabels(["False:\nmasked", "True:\nmay attend"], fontsize=9)
    return cbar


def mask_image(mask, title=None, x_labels=None, y_labels=None) -> Figure:
    """A boolean attention mask drawn as an image: bright = True = may attend, dark = masked.

    mask  (Tq, Tk) or (1, 1, Tq, Tk) as from ``subsequent_mask``: rows are queries, columns keys;
          (B, 1, 1, Tk) as from ``padding_mask``: one row per sentence (it holds for every query).
    x_labels one label per column, y_labels one per row.
    """
    where = "mask_image"
    m, row_name, col_name = _mask_2d(mask, "mask", where)                 # (rows, cols)
    rows, cols = m.shape
    fig = _new_figure(min(10.0, 2.6 + 0.34 * cols), min(9.0, 1.4 + 0.34 * rows))
    ax = fig.add_subplot()
    im = _draw_mask(ax, m, row_name, col_name, x_labels, y_labels,
                    title if title is not None else "Attention mask", where)
    _mask_colorbar(fig, im, ax)
    return fig


def masks_figure(masks, title=None) -> Figure:
    """Several masks side by side, e.g. {"padding": pad, "subsequent": sub, "combined": pad & sub}.

    masks  dict name -> mask, each of a shape ``mask_image`` accepts; the name titles its panel.
    """
    where = "masks_figure"
    if not isinstance(masks, Mapping) or len(masks) == 0:
        raise ValueError(f"masks_figure: masks must be a non-empty dict name -> mask, got {masks!r:.80}")
    images = [(str(name), *_mask_2d(mask, f"masks[{name!r}]", where)) for name, mask in masks.items()]
    width = sum(min(5.0, 1.2 + 0.3 * m.shape[1]) for _, m, _, _ in images) + 1.6
    height = min(6.0, 1.8 + 0.3 * max(m.shape[0] for _, m, _, _ in images))
    fig = _new_figure(width, height)
    axes = fig.subplots(1, len(images), squeeze=False)[0]
    im = None
    for ax, (name, m, row_name, col_name) in zip(axes, images):
        im = _draw_mask(ax, m, row_name, col_name, None, None, name, where)
    _mask_colorbar(fig, im, axes.tolist())
    fig.suptitle(title if title is not None else "Attention masks")
    return fig


# ----------------------------------------------------------------------------- positional encoding

def _pe_table(pe, where: str) -> numpy.ndarray:
    table = _array(pe, "pe", where)
    if table.ndim == 3 and table.shape[0] == 1:
        table = table[0]
    if table.ndim != 2:
        raise ValueError(f"{where}: pe must be 2-D (T, D), positions by dimensions, got shape {table.shape}")
    return table                                                          # (T, D)


def positional_encoding_heatmap(pe, title=None) -> Figure:
    """The positional-encoding table as an image: one row per position, one column per dimension.

    pe  (T, D), e.g. ``PositionalEncoding(D).pe[:T]`` or ``layers.positional.sinusoidal_table(T, D)``;
        (1, T, D) is accepted too. Colour scale -1..1 (the range of sin and cos).
    """
    where = "positional_encoding_heatmap"
    table = _pe_table(pe, where)                                          # (T, D)
    T, D = table.shape
    fig = _new_figure(8.0, 4.5)
    ax = fig.add_subplot()
    low, high = min(-1.0, table.min()), max(1.0, table.max())
    im = ax.imshow(table, cmap=CMAP, vmin=low, vmax=high, aspect="auto", interpolation="nearest")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
    ax.set_xlabel(f"dimension i (d_model = {D})")
    ax.set_ylabel("position pos")
    ax.set_title(title if title is not None else f"Positional encoding, {T} positions x {D} dimensions")
    fig.colorbar(im, ax=ax, label="PE(pos, i)")
    return fig


def positional_encoding_curves(pe, dims=(4, 5, 6, 7), title=None, *, sinusoidal: bool = True) -> Figure:
    """Chosen columns of the positional-encoding table as curves over the positions.

    pe    (T, D) (or (1, T, D)).
    dims  the dimensions to draw, each in 0..D-1.
    sinusoidal  name each curve sin (even dimension) or cos (odd), the paper's layout;
                set False for a learned table.
    """
    where = "positional_encoding_curves"
    table = _pe_table(pe, where)                                          # (T, D)
    T, D = table.shape
    if isinstance(dims, (int, numpy.integer)):
        dims = (dims,)
    dims = list(dims)
    if not dims:
        raise ValueError(f"{where}: dims must name at least one dimension")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, numpy.integer)) or not 0 <= d < D:
            raise ValueError(f"{where}: dims must be integers in 0..{D - 1} (pe has D = {D}), got {d!r}")
    fig = _new_figure(8.0, 3.8)
    ax = fig.add_subplot()
    positions = numpy.arange(T)                                           # (T,)
    styles = ["-", "--", "-.", ":"]
    for j, d in enumerate(dims):
        name = f"dim {d}" + ((" (sin)" if d % 2 == 0 else " (cos)") if sinusoidal else "")
        ax.plot(positions, table[:, d], styles[j % len(styles)], linewidth=1.8, label=name)
    ax.set_xlabel("position pos")
    ax.set_ylabel("PE(pos, dim)")
    ax.set_title(title if title is not None else "Positional encoding across positions")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    return fig


# ----------------------------------------------------------------------------- training curves

def _series(x, name: str, where: str) -> tuple[numpy.ndarray, numpy.ndarray]:
    """(steps, values) from a list of values (steps 1..n), a dict {step: value} or a pair (steps, values)."""
    if isinstance(x, Mapping):
        if not x:
            raise ValueError(f"{where}: {name} is an empty dict")
        try:
            items = sorted((float(k), v) for k, v in x.items())  # JSON turns step keys into strings
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {name} as a dict must map steps (numbers) to values, got keys "
                             f"{list(x)[:5]}") from None
        steps, values = [k for k, _ in items], [v for _, v in items]
    elif (isinstance(x, (list, tuple)) and len(x) == 2
          and all(numpy.ndim(backend.to_numpy(part)) == 1 for part in x)):
        steps, values = x
    else:
        values = x
        steps = None
    values = _array(values, name, where)
    if values.ndim != 1:
        raise ValueError(f"{where}: {name} must be 1-D (one value per step), or a pair (steps, values), "
                         f"got shape {values.shape}")
    if steps is None:
        steps = numpy.arange(1, len(values) + 1, dtype=numpy.float64)    # (n,)
    steps = _array(steps, f"{name} steps", where)
    if steps.shape != values.shape:
        raise ValueError(f"{where}: {name} has {steps.size} steps for {values.size} values; "
                         "give a pair (steps, values) of equal length")
    return steps, values


def lr_schedule(lrs, title=None, *, logy: bool = False) -> Figure:
    """The learning rate at every step, with the peak marked (the end of warmup for NoamSchedule).

    lrs  a list of learning rates, for steps 1..n (NoamSchedule counts its first step as 1),
         or a pair (steps, lrs).
    logy  logarithmic learning-rate axis.
    """
    where = "lr_schedule"
    steps, values = _series(lrs, "lrs", where)                            # (n,), (n,)
    if logy and (values <= 0).any():
        raise ValueError(f"{where}: logy=True needs positive learning rates, lrs has min {values.min():g}")
    fig = _new_figure(7.0, 3.8)
    ax = fig.add_subplot()
    ax.plot(steps, values, color=matplotlib.colormaps[CMAP](0.3), linewidth=2)
    peak = int(numpy.argmax(values))
    ax.plot(steps[peak], values[peak], "o", color=matplotlib.colormaps[CMAP](0.75), markersize=7,
            label=f"peak {values[peak]:.3g} at step {steps[peak]:g}")
    if logy:
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(title if title is not None else "Learning-rate schedule")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    return fig


def loss_curves(train, valid=None, xlabel="step", title=None, *, logy: bool = False, metric=None,
                metric_name: str = "validation metric") -> Figure:
    """Training loss per step, and the validation loss at its evaluation points; optionally, in a second
    panel beside it on the same steps, a validation score such as BLEU.

    train  list of losses (steps 1..n), dict {step: loss}, or a pair (steps, losses).
           With 100 points or more, a running mean is drawn over the noisy raw curve.
    valid  optional: a pair (steps, losses) or dict {step: loss} at the evaluation points
           (a plain list counts as steps 1..n, e.g. one value per epoch with xlabel="epoch").
    logy   logarithmic loss axis, with plain tick labels.
    metric optional: the score at the evaluation points, in the same forms as valid; metric_name is its
           axis title (e.g. "valid BLEU", "valid exact match (%)").
    """
    where = "loss_curves"
    steps, values = _series(train, "train", where)                        # (n,), (n,)
    curves = [("train", steps, values)]
    if valid is not None:
        curves.append(("valid", *_series(valid, "valid", where)))
    scores = None if metric is None else _series(metric, "metric", where)  # (m,), (m,)
    if logy:
        for name, _, v in curves:
            if (v <= 0).any():
                raise ValueError(f"{where}: logy=True needs positive losses, {name} has min {v.min():g}")
    fig = _new_figure(7.0 if scores is None else 11.0, 3.8)
    ax = fig.add_subplot(1, 1 if scores is None else 2, 1)
    color_train, color_valid = matplotlib.colormaps[CMAP](0.3), matplotlib.colormaps[CMAP](0.75)
    n = len(values)
    if n >= 100:
        window = max(2, n // 25)
        mean = numpy.convolve(values, numpy.ones(window) / window, mode="valid")  # (n-window+1,)
        ax.plot(steps, values, color=color_train, alpha=0.3, linewidth=1, label="train (raw)")
        ax.plot(steps[window - 1:], mean, color=color_train, linewidth=2, label=f"train (mean of {window})")
    else:
        ax.plot(steps, values, color=color_train, linewidth=2, marker="." if n <= 30 else None, label="train")
    if valid is not None:
        _, valid_steps, valid_values = curves[1]
        ax.plot(valid_steps, valid_values, "o-", color=color_valid, linewidth=2, markersize=5, label="valid")
    if logy:
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("loss")
    ax.set_title(title if title is not None else "Loss")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    if scores is not None:
        score_ax = fig.add_subplot(1, 2, 2, sharex=ax)
        score_ax.plot(*scores, "o-", color=matplotlib.colormaps[CMAP](0.55), linewidth=2, markersize=5)
        score_ax.annotate(f"{scores[1][-1]:.4g}", (scores[0][-1], scores[1][-1]), textcoords="offset points",
                          xytext=(0, 6), ha="center", fontsize=9)            # the last value, where the run ended
        score_ax.set_xlabel(xlabel)
        score_ax.set_ylabel(metric_name)
        score_ax.set_title(f"{metric_name} at each evaluation")
        score_ax.margins(y=0.15)                       # room above the last value's label
        score_ax.grid(alpha=0.3)
    return fig


# ----------------------------------------------------------------------------- gradient checks

def bar_errors(report_rows, bound: float = 1e-6, title=None) -> Figure:
    """Relative gradient errors per tensor on a log axis, with the pass bound drawn.

    report_rows  list of (name, relative error), or a dict name -> relative error.
    bound        the largest error that passes (1e-6 in float64).
    An error of exactly 0 is drawn at the left edge of the axis.
    """
    where = "bar_errors"
    if isinstance(bound, bool) or not isinstance(bound, (int, float, numpy.floating)) or not 0 < bound < math.inf:
        raise ValueError(f"{where}: bound must be a positive number (the largest error that passes), got {bound!r}")
    rows = list(report_rows.items()) if isinstance(report_rows, Mapping) else list(report_rows)
    if not rows:
        raise ValueError(f"{where}: report_rows is empty; give a list of (name, relative error)")
    for i, row in enumerate(rows):
        if not (isinstance(row, (list, tuple)) and len(row) == 2):
            raise ValueError(f"{where}: report_rows[{i}] must be a pair (name, relative error), got {row!r}")
    names = [str(name) for name, _ in rows]
    errors = _array([float(backend.to_numpy(e)) for _, e in rows], "report_rows errors", where)  # (n,)
    if (errors < 0).any() or not numpy.isfinite(errors).all():
        raise ValueError(f"{where}: relative errors must be finite and >= 0, got {errors.tolist()}")
    positive = errors[errors > 0]
    smallest = min(positive.min() if positive.size else bound, bound)
    left = 10.0 ** (math.floor(math.log10(smallest)) - 1)                 # where the bars start
    fig = _new_figure(7.5, 1.3 + 0.32 * len(rows))
    ax = fig.add_subplot()
    ok_color, bad_color = matplotlib.colormaps[CMAP](0.55), "#d62728"
    colors = [ok_color if e <= bound else bad_color for e in errors]
    y = numpy.arange(len(rows))                                           # (n,)
    ax.barh(y, numpy.maximum(errors, left) - left, left=left, color=colors, height=0.6)
    ax.set_xscale("log")
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=9)
    ax.invert_yaxis()                                  # first row on top, as in the report
    ax.axvline(bound, color="black", linestyle="--", linewidth=1.2)
    ax.set_xlim(left, max(errors.max(), bound) * 50)
    for yi, e in zip(y, errors):
        ax.text(max(e, left) * 1.3, yi, f"{e:.1e}" if e > 0 else "0", va="center", fontsize=8)
    ax.legend(handles=[Patch(color=ok_color, label=f"passes (<= {bound:g})"),
                       Patch(color=bad_color, label=f"fails (> {bound:g})"),
                       Line2D([], [], color="black", linestyle="--", label=f"bound {bound:g}")],
              fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_xlabel("max relative error (log scale)")
    ax.set_ylabel("tensor")
    ax.set_title(title if title is not None else "Gradient check: analytic vs numeric")
    return fig


# ----------------------------------------------------------------------------- histograms

def _histogram_into(ax, values, bins, name, where, show_mean=True):
    v = _array(values, name, where).ravel()                               # (n,)
    ax.hist(v, bins=bins, color=matplotlib.colormaps[CMAP](0.35), edgecolor="white", linewidth=0.3)
    stats = (f"mean {v.mean():.3g}\n" if show_mean else "") + f"var {v.var():.3g}"
    ax.text(0.97, 0.95, stats, transform=ax.transAxes, ha="right", va="top", fontsize=8,
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8})
    return v


def histogram(values, bins=50, title=None, xlabel=None) -> Figure:
    """A histogram of any array (flattened), with its mean and variance written in the corner.

    values  array of any shape; bins: number of bins or their edges.
    """
    fig = _new_figure(6.0, 3.6)
    ax = fig.add_subplot()
    v = _histogram_into(ax, values, bins, "values", "histogram")
    ax.set_xlabel(xlabel if xlabel is not None else "value")
    ax.set_ylabel("count")
    ax.set_title(title if title is not None else f"Histogram of {v.size} values")
    return fig


def score_variance_figure(d_k_values=(4, 16, 64, 256), rng=None, n_samples: int = 5000) -> Figure:
    """Why the paper divides by sqrt(d_k): histograms of q.k without and with the scale.

    For each d_k, q and k are drawn with independent N(0, 1) components, so var(q.k) = d_k:
    the top row spreads out as d_k grows (softmax saturates), the bottom row q.k / sqrt(d_k)
    keeps variance 1. Columns share the x axis within a row.
    d_k_values  head sizes to compare; rng: a NumPy Generator or an int seed (default seed 0);
    n_samples   (q, k) pairs per d_k.
    """
    where = "score_variance_figure"
    d_ks = [d_k_values] if isinstance(d_k_values, (int, numpy.integer)) else list(d_k_values)
    if not d_ks or any(isinstance(d, bool) or not isinstance(d, (int, numpy.integer)) or d < 1 for d in d_ks):
        raise ValueError(f"{where}: d_k_values must be positive integers, got {d_k_values!r}")
    if rng is None or isinstance(rng, (int, numpy.integer)):
        rng = numpy.random.default_rng(0 if rng is None else int(rng))  # never draws from the package's RNG
    elif not isinstance(rng, numpy.random.Generator):
        raise TypeError(f"{where}: rng must be a numpy.random.Generator, an int seed or None, got {type(rng).__name__}")
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, numpy.integer)) or n_samples < 2:
        raise ValueError(f"{where}: n_samples must be an integer >= 2, got {n_samples!r}")
    fig = _new_figure(2.6 * len(d_ks) + 0.8, 5.2)
    axes = fig.subplots(2, len(d_ks), squeeze=False, sharex="row")
    raw, scaled = [], []
    for d_k in d_ks:
        q = rng.standard_normal((n_samples, d_k))                        # (n, Dk)
        k = rng.standard_normal((n_samples, d_k))                        # (n, Dk)
        scores = (q * k).sum(axis=1)                                     # (n,)
        raw.append(scores)
        scaled.append(scores / math.sqrt(d_k))                           # (n,)
    for row, (samples, label) in enumerate([(raw, "q·k"), (scaled, "q·k / √d_k")]):
        # the same bins across a row, so the widths of the histograms can be compared
        low, high = min(s.min() for s in samples), max(s.max() for s in samples)
        edges = numpy.linspace(low, high, 61)                            # (61,)
        for j, (d_k, values) in enumerate(zip(d_ks, samples)):
            ax = axes[row, j]
            _histogram_into(ax, values, edges, "scores", where, show_mean=False)
            ax.set_title(f"d_k = {d_k}" + (", scaled" if row else ", unscaled"), fontsize=10)
            ax.set_xlabel(label)
            ax.set_ylabel("count")
            ax.tick_params(labelsize=8)
    fig.suptitle("Variance of q·k grows with d_k; dividing by √d_k keeps it at 1")
    return fig
