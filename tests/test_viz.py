"""Tests of minitransformer.kit.running.viz: each function returns a Figure with the expected panels, images,
labels and colour scales, refuses bad shapes with a ValueError naming the argument, and saves to PNG.

Matplotlib is forced onto the Agg backend here, so no display is needed (and none is opened).
"""

import math

import fakecupy
import matplotlib
import numpy as np
import pytest
from matplotlib import _pylab_helpers
from matplotlib.figure import Figure

import minitransformer as mt
from minitransformer import viz


@pytest.fixture(autouse=True, scope="module")
def agg_backend():
    """No display: whatever pyplot might open later draws with Agg (viz itself never uses pyplot)."""
    matplotlib.use("Agg", force=True)


TOKENS = ["the", "cat", "sat", "on", "a", "mat"]


def softmax_rows(shape, seed=0):
    """Random attention weights: each row along the last axis sums to 1."""
    scores = np.random.default_rng(seed).normal(size=shape) * 2.0
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def panels(fig):
    """The axes of a figure that are not colour bars."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def colorbars(fig):
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def tick_texts(axis):
    return [t.get_text() for t in axis.get_ticklabels()]


def visible_tick_texts(axis):
    return [t.label1.get_text() for t in axis.get_major_ticks() if t.label1.get_visible()]


def on_device(a):
    """``a`` on the tests' stand-in for a GPU (tests/fakecupy.py: only .get() brings it to the host), as
    a model's arrays are after ``set_backend("cupy")`` (conftest switches the backend back after the test)."""
    mt.set_backend(fakecupy)
    return fakecupy.asarray(np.asarray(a))


# ----------------------------------------------------------------------------- attention_heatmap

def test_attention_heatmap_image_labels_and_scale():
    w = softmax_rows((3, 4))
    fig = viz.attention_heatmap(w, x_labels=TOKENS[:4], y_labels=TOKENS[:3], title="my map")
    assert isinstance(fig, Figure)
    (ax,) = panels(fig)
    assert len(colorbars(fig)) == 1
    (im,) = ax.images
    np.testing.assert_array_equal(im.get_array(), w)
    assert im.get_clim() == (0.0, 1.0)
    assert im.get_cmap().name == "viridis"
    assert tick_texts(ax.xaxis) == TOKENS[:4]
    assert tick_texts(ax.yaxis) == TOKENS[:3]
    assert ax.get_title() == "my map"
    assert "key" in ax.get_xlabel() and "query" in ax.get_ylabel()
    # small maps carry their numbers, one per cell
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"{v:.2f}" for v in w.ravel())


def test_attention_heatmap_default_title_and_no_annotation_when_large():
    fig = viz.attention_heatmap(softmax_rows((12, 12)))
    (ax,) = panels(fig)
    assert ax.get_title() == "Attention weights"
    assert len(ax.texts) == 0


def test_attention_heatmap_draws_into_given_axes():
    fig = Figure()
    ax = fig.add_subplot()
    out = viz.attention_heatmap(softmax_rows((2, 2)), ax=ax, colorbar=False)
    assert out is fig
    assert len(ax.images) == 1 and len(fig.axes) == 1


def test_attention_heatmap_hides_labels_when_too_many_tokens():
    n = viz.MAX_LABELS + 10
    labels = [f"tok{i}" for i in range(n)]
    fig = viz.attention_heatmap(softmax_rows((n, n)), x_labels=labels, y_labels=labels)
    (ax,) = panels(fig)
    assert not set(tick_texts(ax.xaxis)) & set(labels)
    assert "labels hidden" in ax.get_xlabel() and "labels hidden" in ax.get_ylabel()


def test_attention_heatmap_accepts_device_arrays_and_lists():
    w = softmax_rows((3, 3))
    for given in (on_device(w), w.tolist()):
        (ax,) = panels(viz.attention_heatmap(given))
        np.testing.assert_array_equal(ax.images[0].get_array(), w)


@pytest.mark.parametrize("shape", [(4,), (2, 3, 3), (1, 2, 3, 3)])
def test_attention_heatmap_bad_rank_names_weights(shape):
    with pytest.raises(ValueError, match="weights"):
        viz.attention_heatmap(np.full(shape, 0.5))


# ----------------------------------------------------------------------------- attention_grid

def test_attention_grid_one_layer_one_panel_per_head():
    H, T = 6, len(TOKENS)
    attn = softmax_rows((H, T, T))
    fig = viz.attention_grid(attn, x_labels=TOKENS, y_labels=TOKENS)
    axes = panels(fig)
    assert len(axes) == H and len(colorbars(fig)) == 1       # 4 to a row: the 2 spare cells are removed
    assert [ax.get_title() for ax in axes] == [f"head {h}" for h in range(H)]
    for h, ax in enumerate(axes):
        (im,) = ax.images
        np.testing.assert_array_equal(im.get_array(), attn[h])
        assert im.get_clim() == (0.0, 1.0)                   # one shared scale
    assert fig._suptitle.get_text() and "key" in fig._supxlabel.get_text() and "query" in fig._supylabel.get_text()
    fig.canvas.draw()
    # token labels on the outer panels only: left column (y) and panels with nothing below (x)
    assert visible_tick_texts(axes[0].yaxis) == TOKENS and visible_tick_texts(axes[1].yaxis) == []
    assert visible_tick_texts(axes[0].xaxis) == []            # head 4 sits below it
    assert visible_tick_texts(axes[3].xaxis) == TOKENS        # nothing below head 3
    assert visible_tick_texts(axes[5].xaxis) == TOKENS


def test_attention_grid_layers_as_rows_heads_as_columns():
    L, H, Tq, Tk = 3, 4, 5, 6
    attn = [softmax_rows((H, Tq, Tk), seed=layer) for layer in range(L)]
    fig = viz.attention_grid(attn, x_labels=TOKENS, y_labels=TOKENS[:Tq], title="decoder self-attention")
    axes = panels(fig)
    assert len(axes) == L * H
    assert axes[H * 2 + 3].get_title() == "layer 2, head 3"
    np.testing.assert_array_equal(axes[H * 2 + 3].images[0].get_array(), attn[2][3])
    assert fig._suptitle.get_text() == "decoder self-attention"
    row_of = {ax.get_subplotspec().rowspan.start for ax in axes}
    assert row_of == set(range(L))


def test_attention_grid_hides_labels_in_crowded_panels():
    T = viz.MAX_GRID_LABELS + 1
    labels = [f"w{i}" for i in range(T)]
    fig = viz.attention_grid(softmax_rows((2, T, T)), x_labels=labels, y_labels=labels)
    assert not set(tick_texts(panels(fig)[0].xaxis)) & set(labels)
    assert "labels hidden" in fig._supxlabel.get_text()


def test_attention_grid_accepts_device_arrays():
    attn = softmax_rows((2, 3, 3))
    fig = viz.attention_grid([on_device(attn), on_device(attn)])
    assert len(panels(fig)) == 4


@pytest.mark.parametrize("shape", [(4, 4), (4,)])
def test_attention_grid_wrong_rank_names_attn(shape):
    with pytest.raises(ValueError, match=r"attn must be \(H, Tq, Tk\)"):
        viz.attention_grid(np.full(shape, 0.25))


def test_attention_grid_batched_array_says_pick_a_sentence():
    with pytest.raises(ValueError, match=r"attn\[b\]"):
        viz.attention_grid(softmax_rows((2, 4, 3, 3)))


def test_attention_grid_list_of_layers_of_the_wrong_rank_names_attn():
    with pytest.raises(ValueError, match=r"attn must be \(H, Tq, Tk\) or a list over layers"):
        viz.attention_grid([softmax_rows((3, 3))])


# ----------------------------------------------------------------------------- masks

def subsequent(T):
    return np.tril(np.ones((T, T), dtype=bool))[None, None]                # (1,1,T,T)


def padding(ids, pad_id=0):
    return (np.asarray(ids) != pad_id)[:, None, None, :]                   # (B,1,1,T)


@pytest.mark.parametrize("make, expected_rows", [
    (lambda: subsequent(5)[0, 0], "query"),                   # (Tq, Tk)
    (lambda: subsequent(5), "query"),                         # (1, 1, Tq, Tk)
    (lambda: subsequent(5)[0], "query"),                      # (1, Tq, Tk)
    (lambda: padding([[3, 4, 5, 0, 0], [3, 4, 5, 6, 0]]), "sentence"),  # (B, 1, 1, Tk)
])
def test_mask_image_shapes(make, expected_rows):
    mask = make()
    fig = viz.mask_image(mask)
    (ax,) = panels(fig)
    (im,) = ax.images
    image = np.asarray(im.get_array())
    np.testing.assert_array_equal(image.astype(bool), mask.reshape(image.shape))
    assert expected_rows in ax.get_ylabel() and "key" in ax.get_xlabel()
    assert ax.get_title() == "Attention mask"
    (cbar,) = colorbars(fig)
    legend = " ".join(tick_texts(cbar.yaxis))
    assert "True" in legend and "may attend" in legend and "False" in legend


def test_mask_image_true_is_bright():
    fig = viz.mask_image(subsequent(3), x_labels=TOKENS[:3], y_labels=TOKENS[:3], title="causal")
    (ax,) = panels(fig)
    im = ax.images[0]
    rgba = im.to_rgba(np.asarray(im.get_array()))
    luminance = rgba[..., :3] @ np.array([0.2126, 0.7152, 0.0722])
    assert luminance[2, 0] > 0.6             # allowed (True): bright
    assert luminance[0, 2] < 0.2             # masked (False): dark
    assert ax.get_title() == "causal" and tick_texts(ax.xaxis) == TOKENS[:3]


def test_mask_image_bad_input_names_mask():
    combined = padding([[1, 2, 0], [1, 2, 3]]) & subsequent(3)            # (2,1,3,3)
    for bad in (combined, np.ones((2, 3, 3), dtype=bool), np.full((3, 3), 0.5), np.ones(3, dtype=bool)):
        with pytest.raises(ValueError, match=r"mask_image: mask must be boolean .* of shape \(Tq, Tk\).*mask\[b\]"):
            viz.mask_image(bad)


def test_mask_image_accepts_zero_one_ints_and_device_arrays():
    fig = viz.mask_image(on_device(np.tril(np.ones((3, 3), dtype=np.int64))))
    np.testing.assert_array_equal(np.asarray(panels(fig)[0].images[0].get_array()), np.tril(np.ones((3, 3))))


def test_masks_figure_side_by_side():
    pad, sub = padding([[3, 4, 0, 0], [3, 4, 5, 0]]), subsequent(4)
    masks = {"padding": pad, "subsequent": sub, "combined, sentence 0": (pad & sub)[0]}
    fig = viz.masks_figure(masks)
    axes = panels(fig)
    assert [ax.get_title() for ax in axes] == list(masks)
    assert all(len(ax.images) == 1 for ax in axes) and len(colorbars(fig)) == 1
    assert [ax.get_subplotspec().colspan.start for ax in axes] == [0, 1, 2]
    assert fig._suptitle.get_text() == "Attention masks"
    with pytest.raises(ValueError, match="masks"):
        viz.masks_figure({})
    with pytest.raises(ValueError, match="masks"):
        viz.masks_figure([sub])
    with pytest.raises(ValueError, match=r"masks\['bad'\]"):
        viz.masks_figure({"bad": np.ones((2, 1, 3, 3), dtype=bool)})


# ----------------------------------------------------------------------------- positional encoding

def sinusoids(T, D):
    pos = np.arange(T)[:, None]
    angle = pos / 10000.0 ** (np.arange(0, D, 2)[None, :] / D)
    pe = np.empty((T, D))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe


def test_positional_encoding_heatmap():
    pe = sinusoids(50, 16)
    for given in (pe, pe[None], on_device(pe)):
        fig = viz.positional_encoding_heatmap(given)
        (ax,) = panels(fig)
        (im,) = ax.images
        np.testing.assert_array_equal(im.get_array(), pe)
        assert im.get_clim() == (-1.0, 1.0) and im.get_cmap().name == "viridis"
        assert "position" in ax.get_ylabel() and "dimension" in ax.get_xlabel() and ax.get_title()
        assert len(colorbars(fig)) == 1
    with pytest.raises(ValueError, match=r"pe \(positions T, dimensions D\) must have 2 axes"):
        viz.positional_encoding_heatmap(pe[0])
    with pytest.raises(ValueError, match="pe"):
        viz.positional_encoding_heatmap(np.zeros((2, 3, 4)))


def test_positional_encoding_curves():
    pe = sinusoids(40, 8)
    fig = viz.positional_encoding_curves(pe, dims=(4, 5, 6, 7))
    (ax,) = panels(fig)
    assert len(ax.lines) == 4
    for line, d in zip(ax.lines, (4, 5, 6, 7)):
        np.testing.assert_array_equal(line.get_xdata(), np.arange(40))
        np.testing.assert_array_equal(line.get_ydata(), pe[:, d])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["dim 4 (sin)", "dim 5 (cos)", "dim 6 (sin)",
                                                                   "dim 7 (cos)"]
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    learned = viz.positional_encoding_curves(pe, dims=[0], sinusoidal=False)
    assert [t.get_text() for t in panels(learned)[0].get_legend().get_texts()] == ["dim 0"]
    for bad in ((8,), (-1,), (), (1.5,)):
        with pytest.raises(ValueError, match="dims"):
            viz.positional_encoding_curves(pe, dims=bad)


# ----------------------------------------------------------------------------- training curves

def noam(steps, d_model=16, warmup=10):
    steps = np.asarray(steps, dtype=float)
    return d_model**-0.5 * np.minimum(steps**-0.5, steps * warmup**-1.5)


def test_lr_schedule_from_list_counts_steps_from_one():
    lrs = noam(np.arange(1, 51))
    fig = viz.lr_schedule(list(lrs))
    (ax,) = panels(fig)
    curve, peak = ax.lines
    np.testing.assert_array_equal(curve.get_xdata(), np.arange(1, 51))
    np.testing.assert_allclose(curve.get_ydata(), lrs)
    assert peak.get_xdata()[0] == 10 and "step 10" in ax.get_legend().get_texts()[0].get_text()
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == "learning rate"
    assert ax.get_title() == "Learning-rate schedule" and ax.get_yscale() == "linear"


def test_lr_schedule_from_pair_and_log_scale():
    steps = np.arange(0, 200, 5) + 1
    fig = viz.lr_schedule((steps, noam(steps)), title="Noam", logy=True)
    (ax,) = panels(fig)
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), steps)
    assert ax.get_yscale() == "log" and ax.get_title() == "Noam"
    with pytest.raises(ValueError, match="lrs"):
        viz.lr_schedule((steps[:-1], noam(steps)))
    with pytest.raises(ValueError, match="lrs"):
        viz.lr_schedule(np.ones((3, 4)))


def test_loss_curves_train_and_valid():
    train = list(np.linspace(4.0, 1.0, 60))
    valid_steps, valid_losses = [20, 40, 60], [3.1, 2.2, 1.4]
    fig = viz.loss_curves(train, valid=(valid_steps, valid_losses))
    (ax,) = panels(fig)
    assert len(ax.lines) == 2
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), np.arange(1, 61))
    np.testing.assert_array_equal(ax.lines[1].get_xdata(), valid_steps)
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), valid_losses)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["train", "valid"]
    assert ax.get_xlabel() == "step" and ax.get_ylabel() == "loss" and ax.get_title()


def test_loss_curves_dict_with_json_keys_epoch_axis_and_smoothing():
    fig = viz.loss_curves({"3": 1.0, "1": 3.0, "2": 2.0}, valid=[2.5, 2.0, 1.5], xlabel="epoch", logy=True)
    (ax,) = panels(fig)
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [1, 2, 3])     # sorted by step
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), [3.0, 2.0, 1.0])
    assert ax.get_xlabel() == "epoch" and ax.get_yscale() == "log"
    noisy = 2.0 + np.random.default_rng(0).normal(size=500) * 0.1
    (ax,) = panels(viz.loss_curves(noisy))
    raw, mean = ax.lines
    assert len(raw.get_xdata()) == 500 and len(mean.get_xdata()) < 500
    assert np.std(mean.get_ydata()) < np.std(noisy)


def test_loss_curves_with_the_validation_score_beside_the_loss():
    train = list(np.linspace(4.0, 1.0, 60))
    fig = viz.loss_curves(train, valid=([20, 40, 60], [3.1, 2.2, 1.4]), metric=([20, 40, 60], [12.5, 61.0, 97.3]),
                          metric_name="valid BLEU", logy=True)
    loss_ax, score_ax = panels(fig)
    assert loss_ax.get_ylabel() == "loss" and loss_ax.get_yscale() == "log"
    (line,) = score_ax.lines
    np.testing.assert_array_equal(line.get_xdata(), [20, 40, 60])
    np.testing.assert_array_equal(line.get_ydata(), [12.5, 61.0, 97.3])
    assert score_ax.get_ylabel() == "valid BLEU" and score_ax.get_yscale() == "linear"
    assert score_ax.get_shared_x_axes().joined(loss_ax, score_ax)           # the same steps on both
    assert [t.get_text() for t in score_ax.texts] == ["97.3"]               # where the run ended
    with pytest.raises(ValueError, match="metric"):
        viz.loss_curves(train, metric=([1, 2], [1.0]))


@pytest.mark.parametrize("low, high", [(1.4, 6.0), (0.3, 6.0), (0.02, 9.0)])
def test_log_axes_carry_plain_numbers(low, high):
    """A loss between 1.4 and 6 spans less than a decade: matplotlib's own labels read "6 x 10^0"."""
    for fig in (viz.loss_curves(list(np.geomspace(high, low, 50)), logy=True),
                viz.lr_schedule(list(np.geomspace(low, high, 50) * 1e-3), logy=True)):
        (ax,) = panels(fig)
        fig.canvas.draw()
        labels = [t.get_text() for t in ax.yaxis.get_ticklabels(which="both") if t.get_text()]
        assert len(labels) >= 2, labels
        for label in labels:
            float(label.replace("\u2212", "-"))                   # a plain number: no "$", "\\times", "10^"


def test_attention_labels_are_words_and_the_axes_say_what_a_row_is():
    bpe = ["a</w>", "orange", "farbenen</w>", "hut</w>", "<eos>"]
    fig = viz.attention_heatmap(softmax_rows((2, 5)), x_labels=bpe, y_labels=["<bos>", "a"],
                                y_name="query: the decoder's input at that position", x_name="key: source")
    (ax,) = panels(fig)
    assert tick_texts(ax.xaxis) == ["a", "orange@@", "farbenen", "hut", "<eos>"]
    assert ax.get_ylabel() == "query: the decoder's input at that position" and ax.get_xlabel() == "key: source"
    fig = viz.attention_grid(softmax_rows((2, 2, 5)), x_labels=bpe, y_labels=["<bos>", "a"], y_name="rows")
    assert visible_tick_texts(panels(fig)[0].xaxis) == ["a", "orange@@", "farbenen", "hut", "<eos>"]
    assert fig._supylabel.get_text() == "rows" and "key" in fig._supxlabel.get_text()


def test_loss_curves_bad_input():
    with pytest.raises(ValueError, match="valid"):
        viz.loss_curves([1.0, 0.5], valid=([1, 2, 3], [1.0, 0.5]))
    with pytest.raises(ValueError, match="train"):
        viz.loss_curves(np.ones((2, 3, 4)))
    with pytest.raises(ValueError, match="train"):
        viz.loss_curves([])


# ----------------------------------------------------------------------------- gradient-check bars

def test_bar_errors():
    rows = [("x", 3e-10), ("W_q", 2e-9), ("b", 0.0), ("gamma", 5e-5)]
    fig = viz.bar_errors(rows)
    (ax,) = panels(fig)
    bars = ax.patches
    assert len(bars) == len(rows)
    assert ax.get_xscale() == "log"
    assert tick_texts(ax.yaxis) == [name for name, _ in rows]
    for bar, (_, err) in zip(bars, rows):
        if err > 0:
            assert math.isclose(bar.get_x() + bar.get_width(), err, rel_tol=1e-9)
    bound_lines = [line for line in ax.lines if list(line.get_xdata()) == [1e-6, 1e-6]]
    assert len(bound_lines) == 1
    colors = [tuple(bar.get_facecolor()) for bar in bars]
    assert colors[0] == colors[1] == colors[2] != colors[3]             # only gamma fails
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    assert len(panels(viz.bar_errors(dict(rows), bound=1e-4))[0].patches) == 4
    for bound in (0, -1e-6, float("inf"), "1e-6"):            # 0 would be a bare "math domain error"
        with pytest.raises(ValueError, match=r"bar_errors: bound must be a finite number > 0"):
            viz.bar_errors(rows, bound=bound)


def test_curves_from_a_dict_take_json_string_steps():
    (ax,) = panels(viz.lr_schedule({"2": 0.5, "1": 1.0}))      # sorted as numbers
    assert ax.lines[0].get_xdata().tolist() == [1.0, 2.0]


# ----------------------------------------------------------------------------- histograms

def test_histogram():
    values = np.random.default_rng(1).normal(size=(20, 50))
    fig = viz.histogram(values, bins=30, xlabel="q·k")
    (ax,) = panels(fig)
    assert len(ax.patches) == 30
    assert sum(p.get_height() for p in ax.patches) == values.size
    assert ax.get_xlabel() == "q·k" and ax.get_ylabel() == "count" and ax.get_title()
    assert f"var {values.var():.3g}" in ax.texts[0].get_text()


def test_score_variance_figure_shows_the_variance_growing_and_fixed():
    d_ks = (4, 16, 64)
    fig = viz.score_variance_figure(d_ks, rng=np.random.default_rng(3), n_samples=4000)
    axes = panels(fig)
    assert len(axes) == 2 * len(d_ks)
    unscaled, scaled = axes[: len(d_ks)], axes[len(d_ks):]
    for d_k, top, bottom in zip(d_ks, unscaled, scaled):
        var_top = float(top.texts[0].get_text().split()[-1])
        var_bottom = float(bottom.texts[0].get_text().split()[-1])
        assert abs(var_top / d_k - 1) < 0.15                      # var(q.k) = d_k
        assert abs(var_bottom - 1) < 0.15                         # var(q.k / sqrt(d_k)) = 1
        assert str(d_k) in top.get_title() and top.get_xlabel() and bottom.get_xlabel()
    assert fig._suptitle.get_text()
    # same seed, same figure
    again = viz.score_variance_figure(d_ks, rng=3, n_samples=10)
    same = viz.score_variance_figure(d_ks, rng=3, n_samples=10)
    assert [p.get_height() for p in panels(again)[0].patches] == [p.get_height() for p in panels(same)[0].patches]
    with pytest.raises(ValueError, match="d_k_values"):
        viz.score_variance_figure((0, 4))


# ----------------------------------------------------------------------------- every figure

FIGURES = {
    "attention_heatmap": lambda: viz.attention_heatmap(softmax_rows((3, 3)), TOKENS[:3], TOKENS[:3]),
    "attention_grid": lambda: viz.attention_grid([softmax_rows((2, 4, 4))] * 2, TOKENS[:4], TOKENS[:4]),
    "mask_image": lambda: viz.mask_image(subsequent(4)),
    "masks_figure": lambda: viz.masks_figure({"pad": padding([[1, 2, 0]]), "sub": subsequent(3)}),
    "positional_encoding_heatmap": lambda: viz.positional_encoding_heatmap(sinusoids(20, 8)),
    "positional_encoding_curves": lambda: viz.positional_encoding_curves(sinusoids(20, 8)),
    "lr_schedule": lambda: viz.lr_schedule(noam(np.arange(1, 30))),
    "loss_curves": lambda: viz.loss_curves([3.0, 2.0, 1.5], valid=([2], [2.2])),
    "bar_errors": lambda: viz.bar_errors([("W", 1e-9)]),
    "histogram": lambda: viz.histogram([1.0, 2.0, 2.0, 3.0], bins=3),
    "score_variance_figure": lambda: viz.score_variance_figure((2, 8), n_samples=200),
}


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_figure_saves_to_png_and_shows_in_notebooks(name, tmp_path):
    managers_before = _pylab_helpers.Gcf.get_num_fig_managers()
    fig = FIGURES[name]()
    assert isinstance(fig, Figure)
    assert _pylab_helpers.Gcf.get_num_fig_managers() == managers_before   # pyplot's state untouched
    path = tmp_path / f"{name}.png"
    fig.savefig(path, dpi=40)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for ax in panels(fig):                                             # every panel says what it shows
        assert ax.get_title() or fig._suptitle is not None
        assert ax.get_xlabel() or fig._supxlabel is not None
        assert ax.get_ylabel() or fig._supylabel is not None


def test_figures_display_inline_in_jupyter_without_pyplot():
    # IPython asks an object for _repr_png_ when no formatter is registered for it (no %matplotlib inline)
    fig = viz.mask_image(subsequent(3))
    assert fig._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n"
