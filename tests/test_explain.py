"""Tests of the viewer's data (minitransformer.kit.running.viewer, ``mt.viz.explain``) and of ``minitransformer
explain``: what the page holds equals the model (attention maps, the queries and keys behind them, dL/dA against
central finite differences in float64), for the core and the fast tier; long inputs are cut with a note; the page
names nothing outside itself; bad arguments are one clear error. The browser tests are in test_explain_browser.py."""

import base64
import json
import re

import fakecupy
import numpy as np
import pytest

import minitransformer as mt
from minitransformer import viz
from minitransformer.kit.cli import main
from minitransformer.kit.data.tokenizers import WordTokenizer
from minitransformer.kit.running import viewer

STACKS = ("encoder", "decoder_self", "decoder_cross")


def small_config(**overrides):
    sizes = dict(d_model=12, num_heads=3, num_encoder_layers=2, num_decoder_layers=2, d_ff=10, dropout=0.0,
                 max_len=64)
    return mt.TransformerConfig(src_vocab_size=11, tgt_vocab_size=13, **{**sizes, **overrides})


def unpack(packed) -> np.ndarray:
    return np.frombuffer(base64.b64decode(packed["b64"]), "<f4").reshape(packed["shape"]).astype(np.float64)


def loss_of(model, src, tgt_in, tgt_out) -> float:
    logits = model(np.asarray([src]), np.asarray([tgt_in]))
    return mt.CrossEntropyLoss(ignore_index=model.config.pad_id)(logits, np.asarray([tgt_out]))


SRC, TGT = [5, 7, 3, 9, 4], [6, 11, 8]


def numeric_dattn(model, core, head: int, monkeypatch, eps: float = 1e-6) -> np.ndarray:
    """(L(A + eps) - L(A - eps)) / 2 eps for every weight of one head of an attention core (Tq,Tk), the weight moved
    where the core's softmax hands it on; L the loss of (SRC, TGT) in eval mode."""
    model.eval()
    softmax = type(core.softmax).forward
    numeric = None
    for sign in (1, -1):
        losses = {}
        for index in np.ndindex(*core.attn.shape[2:]):
            def moved(x, index=index):
                p = softmax(core.softmax, x).copy()
                p[(0, head, *index)] += sign * eps
                return p
            monkeypatch.setattr(core.softmax, "forward", moved)
            losses[index] = loss_of(model, SRC, [1] + TGT, TGT + [2])
            monkeypatch.undo()
        side = np.array([losses[i] for i in np.ndindex(*core.attn.shape[2:])]).reshape(core.attn.shape[2:])
        numeric = side if numeric is None else (numeric - side) / (2 * eps)
    return numeric


def test_dattn_equals_finite_differences_of_the_loss(float64, monkeypatch):
    """Each stack's dL/dA on the page against central differences, every entry of head 1 in the last layer."""
    model = mt.Transformer(small_config())
    data = viz.explain(model, SRC, TGT).data
    for stack in STACKS:
        core = {"encoder": model.encoder.layers[-1].self_attn, "decoder_self": model.decoder.layers[-1].self_attn,
                "decoder_cross": model.decoder.layers[-1].cross_attn}[stack].attention
        page = unpack(data["stacks"][stack]["dattn"])[-1, 1]                        # (Tq,Tk) of head 1
        numeric = numeric_dattn(model, core, 1, monkeypatch)
        scale = np.abs(numeric).max()
        assert scale > 1e-4, f"{stack}: the loss barely depends on these weights, so the check would prove nothing"
        worst = np.unravel_index(np.abs(page - numeric).argmax(), page.shape)
        assert np.abs(page - numeric).max() <= 1e-5 * scale, \
            f"{stack} dL/dA at {worst}: page {page[worst]:.8g}, finite differences {numeric[worst]:.8g}"


@pytest.mark.parametrize("tier", ["core", "fast"])
def test_the_page_holds_the_models_attention_queries_and_keys(tier):
    model = (mt.Transformer if tier == "core" else mt.fast.Transformer)(small_config())
    data = viz.explain(model, SRC, TGT).data
    assert data["tier"] == tier and data["tgt_in"] == ["<bos>", "6", "11", "8"]
    model.eval()
    model(np.asarray([SRC]), np.asarray([[1] + TGT]))
    maps = model.attention_maps()
    for stack in STACKS:
        s = data["stacks"][stack]
        attn, q, k, mask = (unpack(s[key]) for key in ("attn", "q", "k", "mask"))
        np.testing.assert_allclose(attn, np.stack(maps[stack])[:, 0], atol=1e-6, err_msg=stack)
        # the path the page draws: softmax(q k^T * scale), masked keys left out, gives the weights
        scores = np.where(mask > 0.5, q @ k.swapaxes(-1, -2) * s["scale"], -np.inf)     # (L,H,Tq,Tk)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        np.testing.assert_allclose(weights / weights.sum(-1, keepdims=True), attn, atol=1e-5, err_msg=stack)
    assert s["scale"] == pytest.approx(1 / np.sqrt(4))
    causal = unpack(data["stacks"]["decoder_self"]["mask"])
    assert (causal == np.tril(np.ones((4, 4)))).all()


def test_fast_and_core_give_the_same_gradient_view():
    core = mt.Transformer(small_config())
    fast = mt.fast.Transformer(small_config())
    fast.load_state_dict(core.state_dict())
    pages = [viz.explain(m, SRC, TGT).data for m in (core, fast)]
    assert pages[0]["loss"] == pytest.approx(pages[1]["loss"], rel=1e-5)
    for stack in STACKS:
        a, b = (unpack(p["stacks"][stack]["dattn"]) for p in pages)
        np.testing.assert_allclose(a, b, atol=1e-6 * np.abs(a).max(), err_msg=stack)
        # shares are fractions of one, some near 0: float32 gradients of the two tiers agree to about 1e-6 of g
        np.testing.assert_allclose(pages[0]["stacks"][stack]["share"], pages[1]["stacks"][stack]["share"], rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(pages[0]["stacks"][stack]["grad_norm"], pages[1]["stacks"][stack]["grad_norm"],
                                   rtol=1e-4)


def cores_of(model) -> dict:
    return {"encoder": [layer.self_attn.attention for layer in model.encoder.layers],
            "decoder_self": [layer.self_attn.attention for layer in model.decoder.layers],
            "decoder_cross": [layer.cross_attn.attention for layer in model.decoder.layers]}


def embedding_gradients(model, monkeypatch, core=None, keep=None) -> dict:
    """One backward pass of the loss of (SRC, TGT) in eval mode -> the gradients reaching the source and target
    embeddings (the stacks' inputs) and each core's dout. With core and keep (H,) given: of that core's gradient
    only the heads' parts keep selects go on, dout for a self-attention, dk and dv for the cross-attention."""
    model.eval()
    caught = {}
    for m in (model.src_embed, model.tgt_embed, *sum(cores_of(model).values(), [])):
        def catch(dout, m=m, backward=m.backward):
            caught[m] = dout.copy()
            if m is not core:
                return backward(dout)
            keep_h = np.asarray(keep, float)[None, :, None, None]
            if any(core is layer.cross_attn.attention for layer in model.decoder.layers):
                dq, dk, dv = backward(dout)
                return dq, dk * keep_h, dv * keep_h
            return backward(dout * keep_h)
        monkeypatch.setattr(m, "backward", catch)
    logits = model(np.asarray([SRC]), np.asarray([[1] + TGT]))
    loss_fn = mt.CrossEntropyLoss(ignore_index=model.config.pad_id)
    loss_fn(logits, np.asarray([TGT + [2]]))
    model.backward(loss_fn.backward())
    monkeypatch.undo()
    return caught


@pytest.mark.parametrize("tier", ["core", "fast"])
def test_the_heads_and_the_rest_add_up_to_the_gradient_at_the_embeddings(float64, monkeypatch, tier):
    """For every layer: g = sum of g_h + r, g_h the part of g through head h (a backward pass keeping head h's
    gradient alone, less one keeping none), r the paths that miss every head (the pass keeping none); the page's
    share <g_h, g> / |g|^2 and |g_h| are those of g_h."""
    model = (mt.Transformer if tier == "core" else mt.fast.Transformer)(small_config(norm_first=tier == "fast"))
    data = viz.explain(model, SRC, TGT).data
    full = embedding_gradients(model, monkeypatch)
    H = model.config.num_heads
    for stack, cores in cores_of(model).items():
        g = full[model.tgt_embed if stack == "decoder_self" else model.src_embed].ravel()
        for i, core in enumerate(cores):
            def at_embeddings(keep, core=core):
                caught = embedding_gradients(model, monkeypatch, core, keep)
                return caught[model.tgt_embed if stack == "decoder_self" else model.src_embed].ravel()
            rest = at_embeddings(np.zeros(H))
            heads = [at_embeddings(np.eye(H)[h]) - rest for h in range(H)]
            np.testing.assert_allclose(sum(heads) + rest, g, rtol=0, atol=1e-12 * np.abs(g).max())
            assert max(np.abs(h).max() for h in heads) > 1e-3 * np.abs(g).max(), f"{stack} {i}: no head matters"
            np.testing.assert_allclose(data["stacks"][stack]["share"][i], [h @ g / (g @ g) for h in heads],
                                       rtol=1e-9, atol=1e-12, err_msg=f"{stack} layer {i}")
            np.testing.assert_allclose(data["stacks"][stack]["grad_norm"][i], [np.linalg.norm(h) for h in heads],
                                       rtol=1e-9, err_msg=f"{stack} layer {i}")


@pytest.mark.parametrize("stack, layer, head", [("encoder", 1, 2), ("decoder_self", 1, 0), ("decoder_cross", 0, 1)])
def test_a_heads_part_is_the_finite_difference_of_its_output(float64, monkeypatch, stack, layer, head):
    """g_h = (d o_h / d x)^T dL/do_h, o_h the head's output: every path through the head is a path from the
    embeddings x to o_h, then one from o_h to the loss. Moving x one coordinate at a time (central differences)
    gives d o_h / d x; with dL/do_h caught in a backward pass, g_h, then the page's share and |g_h|.
    (The cross-attention of layer 0: its queries do not depend on the source, so all its source paths go
    through its keys and values, which is what the page counts.)"""
    model = mt.Transformer(small_config())
    data = viz.explain(model, SRC, TGT).data
    caught = embedding_gradients(model, monkeypatch)
    core = cores_of(model)[stack][layer]
    side = model.tgt_pos if stack == "decoder_self" else model.src_pos
    g = caught[model.tgt_embed if stack == "decoder_self" else model.src_embed]
    dout = caught[core][0, head]                                          # dL/do_h (Tq,Dv)
    forward, eps, g_h = type(side).forward, 1e-6, np.zeros_like(g)
    for index in np.ndindex(*g.shape):
        outputs = []
        for sign in (1, -1):
            def moved(x, offset=0, sign=sign, index=index):
                out = forward(side, x, offset).copy()
                out[index] += sign * eps
                return out
            monkeypatch.setattr(side, "forward", moved)
            model(np.asarray([SRC]), np.asarray([[1] + TGT]))
            outputs.append(core.attn[0, head] @ core._cache.v[0, head])        # o_h = A_h V_h (Tq,Dv)
            monkeypatch.undo()
        g_h[index] = ((outputs[0] - outputs[1]) / (2 * eps) * dout).sum()
    assert np.abs(g_h).max() > 1e-4, "the head barely reaches the embeddings: the check would prove nothing"
    assert data["stacks"][stack]["share"][layer][head] == pytest.approx((g_h * g).sum() / (g * g).sum(), rel=1e-6)
    assert data["stacks"][stack]["grad_norm"][layer][head] == pytest.approx(np.linalg.norm(g_h), rel=1e-6)


def test_the_model_is_left_as_it_was():
    model = mt.Transformer(small_config())
    model.train()
    for p in model.parameters():
        p.grad[...] = 0.5
    before = {name: p.data.copy() for name, p in model.named_parameters()}
    viz.explain(model, SRC)
    assert model.training
    for name, p in model.named_parameters():
        assert (p.grad == 0.5).all() and (p.data == before[name]).all(), name


def test_decoding_steps_are_the_greedy_output_and_their_probabilities():
    model = mt.Transformer(small_config())
    model.eval()
    data = viz.explain(model, SRC).data
    hyp = mt.decoding.greedy_decode(model, np.asarray([SRC]), max_len=viewer.MAX_TOKENS - 1)[0]
    steps = data["decoding"]["steps"]
    assert data["output_ids"] == hyp and [s["token"] for s in steps[:-1]] == [str(i) for i in hyp]
    if len(hyp) < viewer.MAX_TOKENS - 1:
        assert steps[-1]["token"] == "<eos>" and not data["notes"]
    else:                                              # cut: the last row is what the model would have said next
        assert steps[-1]["token"] == steps[-1]["top"][0][0] and data["notes"] == ["the output was cut at 49 tokens"]
    logits = model(np.asarray([SRC]), np.asarray([[1] + hyp]))[0].astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    for t, step in enumerate(steps):
        assert step["top"][0][1] == pytest.approx(p[t].max(), rel=1e-5) and step["p"] <= step["top"][0][1] + 1e-9
    assert data["target"] == "the model's own output" and data["tgt_out"][:-1] == [s["token"] for s in steps[:-1]]
    beam = viz.explain(model, SRC, beam_size=3).data
    assert beam["output_ids"] == mt.decoding.beam_search(model, np.asarray([SRC]), beam_size=3,
                                                         max_len=viewer.MAX_TOKENS - 1)[0]
    assert beam["decoding"]["method"].startswith("beam search, beam 3")


def test_the_beam_shown_is_what_beam_search_ranks(float64):
    """Each step's hypotheses on the page, best first, with their scores s = log P(Y) / lp(|Y|) recomputed by
    feeding each one through the model; the output grows from the one marked, and beam search's own answer for
    each sentence of a batch is the best of its last step."""
    model = mt.Transformer(small_config(max_len=12))
    model.eval()
    data = viz.explain(model, SRC, beam_size=3, alpha=0.6).data
    beam, out = data["decoding"]["beam"], data["output_ids"]
    assert len(beam) == len(out) + 1 or len(out) == 11 and len(beam) == 11
    for t, hyps in enumerate(beam):
        assert len(hyps) == 3 and [h[1] for h in hyps] == sorted((h[1] for h in hyps), reverse=True), t
        assert [h[2] for h in hyps].count(True) == 1, f"step {t}: one hypothesis is the output's start"
        for text, score, grows in hyps:
            ids = [2 if token == "<eos>" else int(token) for token in text.split()]
            assert grows == (ids == (out + [2])[:len(ids)] and (len(ids) == t + 1 or ids[-1] == 2)), (t, text)
            logits = model(np.asarray([SRC]), np.asarray([[1] + ids[:-1]]))[0]
            log_p = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - \
                logits.max(-1, keepdims=True)
            expected = log_p[np.arange(len(ids)), ids].sum() / mt.decoding.length_penalty(len(ids), 0.6)
            assert score == pytest.approx(expected, rel=1e-9), (t, text)
    assert beam[-1][0][2], "the output is the best hypothesis of the last step"
    wide = viz.explain(model, SRC, beam_size=20).data["decoding"]["beam"]      # more than the 11 tokens to choose
    assert len(wide[0]) == 11 and json.loads(json.dumps(wide, allow_nan=False)) == wide
    src = np.asarray([SRC, [4, 6, 8, 10, 0]])
    with pytest.raises(TypeError, match="beam_search: steps must be a list"):
        mt.decoding.beam_search(model, src, steps=True)
    steps = []
    answers = mt.decoding.beam_search(model, src, beam_size=4, max_len=8, steps=steps)
    for b, answer in enumerate(answers):
        rows, tokens, scores = next(step for step in reversed(steps) if b in step[0])     # its last step
        best = tokens[list(rows).index(b), 0].tolist()
        assert best[:len(answer)] == answer and best[len(answer):len(answer) + 1] in ([2], [])


def test_long_inputs_are_cut_with_a_note():
    model = mt.Transformer(small_config(max_len=200))
    src = [4 + i % 7 for i in range(viewer.MAX_TOKENS + 20)]
    data = viz.explain(model, src, src[:viewer.MAX_TOKENS + 5]).data
    assert len(data["src"]) == viewer.MAX_TOKENS and len(data["tgt_in"]) == viewer.MAX_TOKENS
    assert any(f"the first {viewer.MAX_TOKENS} are shown" in note for note in data["notes"])


def test_texts_are_read_and_labelled_by_the_tokenizers():
    src_tok = WordTokenizer.build(["a small dog sees the ball", "the cat"])
    tgt_tok = WordTokenizer.build(["ein kleiner hund sieht den ball", "die katze"])
    cfg = small_config()
    model = mt.Transformer(mt.TransformerConfig(**{**cfg.to_dict(), "src_vocab_size": src_tok.vocab_size,
                                                   "tgt_vocab_size": tgt_tok.vocab_size}))
    data = viz.explain(model, "the small dog", "ein hund", tokenizers=(src_tok, tgt_tok)).data
    assert data["src"] == ["the", "small", "dog"] and data["tgt_out"] == ["ein", "hund", "<eos>"]
    assert data["target"] == "the given target"


@pytest.mark.parametrize("call, message", [
    (lambda m: viz.explain(m, "a text"), "tokenizers"),
    (lambda m: viz.explain(m, SRC, beam_size=0), "beam_size"),
    (lambda m: viz.explain(m, SRC, tokenizers="words"), "tokenizers must be a pair"),
    (lambda m: viz.explain(m, [4, 99]), "src"),
    (lambda m: viz.explain(m, []), "src"),
    (lambda m: viz.explain(m, SRC).save("page.txt"), ".html, .png"),
    (lambda m: viz.explain(m, SRC).figure("cross"), "stack"),
    (lambda m: viz.explain(m, SRC).figure(layer=5), "layer"),
    (lambda m: viz.explain("model", SRC), "model must be"),
])
def test_bad_arguments_are_one_clear_error(call, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        call(mt.Transformer(small_config()))


def test_the_page_is_self_contained_and_saves(tmp_path):
    e = viz.explain(mt.Transformer(small_config()), SRC)
    page = e.save(tmp_path / "page.html").read_text("utf-8")
    assert page.startswith("<!DOCTYPE html>") and "explain-data" in page and "function renderHeads" in page
    # nothing is fetched: no script or style from a file or the network, no fonts, no requests
    for pattern in (r"<script[^>]*\ssrc=", r"<link[^>]*stylesheet", r"@import", r"url\(", r"fetch\(",
                    r"XMLHttpRequest", r"https?://(?!www\.w3\.org/2000/svg)"):
        assert not re.search(pattern, page), pattern
    assert "</script" not in page.split('id="explain-data">')[1].split("</script>")[0]
    assert e._repr_html_().startswith("<iframe srcdoc=") and "&lt;!DOCTYPE html&gt;" in e._repr_html_()
    png = e.save(tmp_path / "fig.png", stack="encoder", layer=0).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_token_like_a_closing_script_tag_stays_data(tmp_path):
    tok = WordTokenizer.build(["</script><b>x</b>"])
    model = mt.Transformer(mt.TransformerConfig(**{**small_config().to_dict(), "src_vocab_size": tok.vocab_size,
                                                   "tgt_vocab_size": tok.vocab_size}))
    page = viz.explain(model, "</script><b>x</b>", tokenizers=(tok, tok)).html()
    data = page.split('id="explain-data">')[1].split("</script>")[0]
    assert page.count("</script>") == 2 and "<" not in data and '"\\u003c"' in data


def test_explain_command_writes_the_page(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--task", "copy", "--steps", "3", "--heldout", "5", "--out", str(out), "--d-model", "16",
                 "--heads", "2", "--layers", "1", "--d-ff", "24", "--no-progress"]) == 0
    assert (out / "explain.html").read_text("utf-8").startswith("<!DOCTYPE html>")      # train writes one too
    capsys.readouterr()
    page = tmp_path / "mine.html"
    assert main(["explain", "--checkpoint", str(out), "4 5 6 7", "--out", str(page), "--beam-size", "2"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {page}" in printed and "translation:" in printed
    assert '"src":["4","5","6","7"]' in page.read_text("utf-8")
    assert main(["explain", "--checkpoint", str(out), "four five"]) == 2
    assert "give token ids separated by spaces" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "--checkpoint", str(out), "4 5", "--beam-size", "0"])
    assert exit_.value.code == 2 and "--beam-size" in capsys.readouterr().err


def test_explain_command_reads_a_sentence_as_translate_does(tmp_path, capsys):
    out = tmp_path / "toy"
    assert main(["train", "--task", "toy", "--steps", "2", "--limit", "3", "--out", str(out), "--d-model", "16",
                 "--heads", "2", "--layers", "1", "--d-ff", "24", "--no-progress"]) == 0
    written = (out / "explain.html").read_text("utf-8")                  # a held-out sentence, in words
    assert '"src":["' in written and '"tier":"fast"' in written
    capsys.readouterr()
    page = tmp_path / "dog.html"
    assert main(["explain", "--checkpoint", str(out), "The small dog sees the computer.", "--out", str(page),
                 "--target", "der kleine hund sieht den ball ."]) == 0
    printed = capsys.readouterr()
    assert "read as <unk>): computer" in printed.err and f"wrote {page}" in printed.out
    data = json.loads(page.read_text("utf-8").split('id="explain-data">')[1].split("</script>")[0])
    assert data["src"] == ["the", "small", "dog", "sees", "the", "<unk>", "."]
    assert data["tgt_out"] == ["der", "kleine", "hund", "sieht", "den", "ball", ".", "<eos>"]
    assert main(["explain", "--checkpoint", str(out), "  "]) == 2
    assert "give a sentence to explain" in capsys.readouterr().err


def test_a_model_on_the_device_gives_the_same_page(float64):
    """On the tests' stand-in for a GPU (tests/fakecupy.py refuses implicit copies to the host): the same data."""
    model = mt.Transformer(small_config())
    host = viz.explain(model, SRC, TGT).data
    state = model.state_dict()
    mt.set_backend(fakecupy)
    on_device = mt.fast.Transformer(small_config())
    on_device.load_state_dict(state)
    device = viz.explain(on_device, SRC, TGT).data
    assert device["loss"] == pytest.approx(host["loss"], rel=1e-9) and device["output_ids"] == host["output_ids"]
    for stack in STACKS:
        for key in ("attn", "dattn", "q", "k"):
            a, b = unpack(host["stacks"][stack][key]), unpack(device["stacks"][stack][key])
            np.testing.assert_allclose(b, a, atol=1e-6 * max(1.0, np.abs(a).max()), err_msg=f"{stack} {key}")
