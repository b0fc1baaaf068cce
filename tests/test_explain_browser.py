"""The viewer's page in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by
Selenium, the page opened from disk with the network off. Checked as a person would see it: every view draws with
no console error and a screenshot that is not blank, hovering a token changes the lines drawn, unticking a head
removes its lines, the weights drawn are the model's, the gradient shown is the finite-difference dL/dA, each view
exports a PNG or SVG, and nothing is fetched. Skipped where Chromium, its driver or Selenium is missing.

MINITRANSFORMER_README_PICTURES=1 also writes the README's pictures of the head view and the gradient view
(docs/explain-heads.png, docs/explain-gradient.png) from a model trained on the toy corpus.
"""

import base64
import io
import os
import shutil
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import viz

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from test_explain import SRC, TGT, numeric_dattn, small_config  # noqa: E402

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver")
VIEWS = ("heads", "model", "qk", "gradient", "decoding", "masks")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1400,1000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=webdriver.ChromeService(DRIVER), options=options)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0,
                                                                "downloadThroughput": 0, "uploadThroughput": 0})
    yield driver
    driver.quit()


def open_page(browser, explanation, path):
    explanation.save(path)
    browser.get(path.as_uri())
    browser.get_log("browser")                          # from here on, every message is this page's
    return browser


def show(browser, view):
    browser.find_element(By.ID, f"tab-{view}").click()
    return browser.find_element(By.ID, f"view-{view}")


def errors(browser) -> list:
    return [entry["message"] for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def not_blank(png: bytes) -> None:
    from matplotlib import image

    pixels = image.imread(io.BytesIO(png))[..., :3]                     # (h, w, 3)
    colours = len(np.unique((pixels * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    assert pixels.shape[0] > 50 and pixels.std() > 0.05 and colours > 20, f"{colours} colours, std {pixels.std()}"


def visible_lines(browser):
    return [line for line in browser.find_elements(By.CSS_SELECTOR, "#head-svg line.link") if line.is_displayed()]


@pytest.fixture(scope="module")
def small_page(tmp_path_factory):
    """A small float64 core model's page for (SRC, TGT), saved once, and the model itself."""
    mt.set_default_dtype("float64")
    try:
        mt.manual_seed(3)
        model = mt.Transformer(small_config())
        path = viz.explain(model, SRC, TGT).save(tmp_path_factory.mktemp("page") / "page.html")
    finally:
        mt.set_default_dtype("float32")
    return path, model


@pytest.fixture
def page(browser, small_page):
    """The small page, freshly opened (each test starts from the page as it loads)."""
    path, model = small_page
    browser.get(path.as_uri())
    browser.get_log("browser")
    return browser, model


def test_every_view_draws_without_errors_and_fetches_nothing(page):
    browser, _ = page
    for view in VIEWS:
        section = show(browser, view)
        assert section.is_displayed() and not errors(browser), view
        not_blank(section.screenshot_as_png)
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0


def test_a_page_of_the_models_own_beam_output_draws_too(browser, tmp_path):
    """No target given: the gradient is of the model's own output, the decoding a beam's, and a longer source."""
    model = mt.fast.Transformer(small_config())
    explanation = viz.explain(model, [4 + i % 7 for i in range(30)], beam_size=3)
    open_page(browser, explanation, tmp_path / "own.html")
    for view in VIEWS:
        not_blank(show(browser, view).screenshot_as_png)
        assert not errors(browser), view
    assert "beam search, beam 3" in show(browser, "decoding").text
    # the beam, step by step: each hypothesis and its score, the one the output grows from in bold
    shown = browser.execute_script("return [...document.querySelectorAll('#beam-table tr')].map(tr => "
                                   "[...tr.querySelectorAll('td')].map(td => [td.textContent, "
                                   "getComputedStyle(td).fontWeight]))")
    beam = explanation.data["decoding"]["beam"]
    assert len(shown) == len(beam) >= len(explanation.data["output_ids"])
    for t, (cells, hyps) in enumerate(zip(shown, beam)):
        assert [c[0].split() for c in cells] == [text.split() + [f"{score:.3f}"] for text, score, _ in hyps], t
        assert [c[1] == "700" for c in cells] == [grows for *_, grows in hyps], t
    best = shown[-1][0][0].split()[:-1]                                 # the output, with <eos> if it ended
    assert best[:len(explanation.data["output_ids"])] == explanation.data["tgt_out"][:-1] and shown[-1][0][1] == "700"


def test_hovering_a_token_shows_its_row_alone(page):
    browser, _ = page
    show(browser, "heads")
    every = visible_lines(browser)
    token = browser.find_element(By.CSS_SELECTOR, "#head-svg text.tok[data-side='data-q'][data-i='2']")
    ActionChains(browser).move_to_element(token).perform()
    row = visible_lines(browser)
    assert 0 < len(row) < len(every) and {line.get_attribute("data-q") for line in row} == {"2"}
    ActionChains(browser).move_by_offset(0, 400).perform()             # away from the tokens: every line again
    assert len(visible_lines(browser)) == len(every)


def test_unticking_a_head_removes_its_lines(page):
    browser, _ = page
    show(browser, "heads")
    heads = lambda: {line.get_attribute("data-head") for line in visible_lines(browser)}   # noqa: E731
    assert heads() == {"0", "1", "2"}
    browser.find_element(By.CSS_SELECTOR, "input.head-toggle[data-head='1']").click()
    assert heads() == {"0", "2"}
    browser.find_element(By.CSS_SELECTOR, "input.head-toggle[data-head='1']").click()
    assert heads() == {"0", "1", "2"}


def test_the_weights_drawn_are_the_models(page):
    browser, model = page
    model.eval()
    model(np.asarray([SRC]), np.asarray([[1] + TGT]))
    maps = model.attention_maps()
    for stack in ("encoder", "decoder_self", "decoder_cross"):
        read = browser.execute_script("const t = explainData.S[arguments[0]].attn; return [t.shape, Array.from(t.v)]",
                                      stack)
        np.testing.assert_allclose(np.reshape(read[1], read[0]), np.stack(maps[stack])[:, 0], atol=1e-6)
    # the head view's lines: one per weight of at least 0.01, as dark as the weight
    show(browser, "heads")
    for line in browser.find_elements(By.CSS_SELECTOR, "#head-svg line.link"):
        h, q, k = (int(line.get_attribute(a)) for a in ("data-head", "data-q", "data-k"))
        assert float(line.get_attribute("stroke-opacity")) == pytest.approx(maps["encoder"][0][0, h, q, k], abs=1e-6)
    drawn = len(browser.find_elements(By.CSS_SELECTOR, "#head-svg line.link"))
    assert drawn == int((maps["encoder"][0][0] >= 0.01).sum())
    # queries and keys: the softmax the page computes from q and k is the model's weight, row by row
    show(browser, "qk")
    cells = browser.find_elements(By.CSS_SELECTOR, "#qk-svg text")
    softmax = [float(c.text) for c in cells if c.get_attribute("class") == "model-weight"]
    np.testing.assert_allclose(softmax, maps["encoder"][0][0, 0, 0], atol=1e-4)
    texts = [c.text for c in cells]
    computed = [float(texts[i - 1]) for i, c in enumerate(cells) if c.get_attribute("class") == "model-weight"]
    np.testing.assert_allclose(computed, softmax, atol=1e-4)


def test_the_gradient_shown_is_the_finite_difference_dattn(page, monkeypatch):
    """The page's dL/dA of the cross-attention, head 0 of the last layer, against central differences."""
    browser, model = page
    read = browser.execute_script("const t = explainData.S.decoder_cross.dattn; return [t.shape, Array.from(t.v)]")
    shown = np.reshape(read[1], read[0])[-1, 0]                         # (T,S)
    numeric = numeric_dattn(model, model.decoder.layers[-1].cross_attn.attention, 0, monkeypatch)
    assert np.abs(numeric).max() > 1e-4
    np.testing.assert_allclose(shown, numeric, atol=1e-5 * np.abs(numeric).max())


def test_the_shares_shown_are_the_pages_and_add_up(page, small_page):
    """The gradient view's table: each head's share of the gradient at the embeddings, as the data holds it, and
    the rest, so that every layer's row adds up to 100%."""
    browser, _ = page
    show(browser, "gradient")
    rows = browser.execute_script("return [...document.querySelectorAll('#share-table tr')].slice(1).map(tr => "
                                  "[...tr.querySelectorAll('td')].map(td => td.textContent))")
    data = viz.explain(small_page[1], SRC, TGT).data["stacks"]
    expected = [(share, data[stack]["grad_norm"][i]) for stack in ("encoder", "decoder_self", "decoder_cross")
                for i, share in enumerate(data[stack]["share"])]
    assert len(rows) == len(expected) == 6
    for cells, (share, norm) in zip(rows, expected):
        percents = [float(c.split("%")[0]) for c in cells]
        np.testing.assert_allclose(percents[:-1], 100 * np.asarray(share), atol=0.051)
        np.testing.assert_allclose([float(c.split("(")[1].rstrip(")")) for c in cells[:-1]], norm, rtol=0.051)
        assert sum(percents) == pytest.approx(100, abs=0.05 * len(percents))


def test_each_view_exports_a_png_or_an_svg(page):
    browser, _ = page
    for view in VIEWS:
        show(browser, view)
        figures = browser.execute_script("return explainFigures(arguments[0])", view)
        assert figures, view
        for figure in figures:
            if figure["name"].endswith(".png"):
                png = base64.b64decode(figure["url"].split(",", 1)[1])
                assert png[:8] == b"\x89PNG\r\n\x1a\n"
                not_blank(png)
            else:
                svg = urllib.parse.unquote(figure["url"].split(",", 1)[1])
                assert figure["name"].endswith(".svg") and svg.startswith("<svg") and "<text" in svg, view
    assert not errors(browser)


@pytest.mark.skipif(not os.environ.get("MINITRANSFORMER_README_PICTURES"),
                    reason="writes the README's pictures only when MINITRANSFORMER_README_PICTURES is set")
def test_readme_pictures(browser, tmp_path):
    from minitransformer.kit.cli import main

    out = tmp_path / "toy"
    assert main(["train", "--task", "toy", "--steps", "400", "--out", str(out), "--d-model", "32", "--heads", "4",
                 "--layers", "2", "--d-ff", "64", "--no-progress"]) == 0
    browser.get((out / "explain.html").as_uri())
    Select = pytest.importorskip("selenium.webdriver.support.select").Select
    stack, layer = browser.find_elements(By.CSS_SELECTOR, ".controls select")
    Select(stack).select_by_value("decoder_cross")
    Select(layer).select_by_value("1")                                  # the last layer: the sharpest alignment
    docs = REPO / "docs"
    docs.mkdir(exist_ok=True)
    for view, name in (("heads", "explain-heads.png"), ("gradient", "explain-gradient.png")):
        png = show(browser, view).screenshot_as_png
        not_blank(png)
        (docs / name).write_bytes(png)
    assert not errors(browser)
