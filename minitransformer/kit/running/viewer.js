// The viewer: one sentence through a minitransformer model, drawn from the data viewer.py packs into the page.
// Plain DOM, SVG and canvas; no library, nothing fetched. Every view reads the same stacks of arrays:
// attn and dattn (L,H,Tq,Tk), q and k (L,H,T,Dk), mask (Tq,Tk), share and grad_norm (L,H).
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("explain-data").textContent);
  const SVGNS = "http://www.w3.org/2000/svg";
  const HEAD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"];
  const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 73, 137], [49, 104, 142], [38, 130, 142], [31, 158, 137],
    [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];
  const STACK_NAMES = {encoder: "encoder self-attention", decoder_self: "decoder self-attention (masked)",
    decoder_cross: "decoder cross-attention (on the source)"};

  // base64 float32 -> {shape, v}; a view of the rows and columns at a leading index
  function unpack(p) {
    const bytes = atob(p.b64), u = new Uint8Array(bytes.length);
    for (let i = 0; i < bytes.length; i++) u[i] = bytes.charCodeAt(i);
    return {shape: p.shape, v: new Float32Array(u.buffer)};
  }
  function matrix(t, ...lead) {
    const rows = t.shape[lead.length], cols = t.shape[lead.length + 1];
    let off = 0;
    lead.forEach((x, d) => { off = off * t.shape[d] + x; });
    off *= rows * cols;
    return {rows, cols, get: (i, j) => t.v[off + i * cols + j]};
  }
  const S = {};
  for (const name of Object.keys(D.stacks)) {
    const s = D.stacks[name];
    S[name] = {attn: unpack(s.attn), dattn: unpack(s.dattn), q: unpack(s.q), k: unpack(s.k),
      mask: unpack(s.mask), share: s.share, grad_norm: s.grad_norm, scale: s.scale};
  }
  window.explainData = {D, S, matrix};        // for readers who open the console, and for the tests

  function labels(stack) {
    // a decoder query is labelled by the token it produces (the next one), as attention.png labels its rows
    return {rows: stack === "encoder" ? D.src : D.tgt_out, cols: stack === "decoder_self" ? D.tgt_in : D.src};
  }
  function rgb(c) { return `rgb(${c[0] | 0},${c[1] | 0},${c[2] | 0})`; }
  function viridis(x) {
    x = Math.min(1, Math.max(0, x)) * (VIRIDIS.length - 1);
    const i = Math.min(VIRIDIS.length - 2, Math.floor(x)), f = x - i;
    return rgb(VIRIDIS[i].map((c, n) => c + f * (VIRIDIS[i + 1][n] - c)));
  }
  function diverging(x) {      // -1 blue, 0 white, +1 red
    x = Math.min(1, Math.max(-1, x));
    const end = x < 0 ? [59, 76, 192] : [180, 4, 38], f = Math.abs(x);
    return rgb([0, 1, 2].map(n => 255 + f * (end[n] - 255)));
  }
  function el(tag, attrs, parent, text) {
    const e = tag in {svg: 1, line: 1, text: 1, rect: 1, g: 1} ? document.createElementNS(SVGNS, tag) :
      document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function select(parent, label, options, onchange) {
    const l = el("label", {}, parent, label + " ");
    const s = el("select", {}, l);
    options.forEach(([value, text]) => el("option", {value}, s, text));
    s.addEventListener("change", onchange);
    return s;
  }
  function canvas(parent, width, height) {
    const c = el("canvas", {width: Math.ceil(width), height: Math.ceil(height), class: "figure"}, parent);
    const ctx = c.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, c.width, c.height);
    ctx.font = "11px sans-serif";
    return ctx;
  }
  // One heatmap at (x, y), cells of `cell` px; labels {rows, cols} when given (rows left, columns below, upright)
  function heatmap(ctx, x, y, m, cell, colour, lab, title) {
    for (let i = 0; i < m.rows; i++)
      for (let j = 0; j < m.cols; j++) {
        ctx.fillStyle = colour(m.get(i, j));
        ctx.fillRect(x + j * cell, y + i * cell, Math.ceil(cell), Math.ceil(cell));
      }
    ctx.fillStyle = "#222";
    if (title) { ctx.textAlign = "left"; ctx.fillText(title, x, y - 5); }
    if (!lab) return;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    lab.rows.forEach((t, i) => ctx.fillText(t, x - 4, y + (i + 0.5) * cell));
    lab.cols.forEach((t, j) => {
      ctx.save();
      ctx.translate(x + (j + 0.5) * cell, y + m.rows * cell + 4);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(t, 0, 0);
      ctx.restore();
    });
    ctx.textBaseline = "alphabetic";
  }
  const longest = a => Math.max(...a.map(t => t.length)) * 6.5 + 10;

  // -- the frame: header, shared controls, tabs -----------------------------------------------------------------
  const header = el("header", {}, document.body);
  el("h1", {}, header, `minitransformer: inside the model (${D.tier} tier, d_model ${D.config.d_model}, ` +
    `${D.config.num_heads} heads, ${D.config.num_encoder_layers}+${D.config.num_decoder_layers} layers)`);
  el("div", {class: "sentence"}, header, "source: " + D.src.join(" "));
  el("div", {class: "sentence"}, header, "output: " + D.decoding.steps.map(s => s.token).join(" "));
  if (D.target !== "the model's own output") el("div", {class: "sentence"}, header, "target: " + D.tgt_out.join(" "));
  D.notes.forEach(n => el("div", {class: "note"}, header, "Note: " + n));
  const controls = el("div", {class: "controls"}, header);
  const state = {view: "heads", stack: "encoder", layer: 0, big: null, head: 0, query: 0, decodeHead: -1};
  const stackSelect = select(controls, "stack", Object.keys(STACK_NAMES).map(k => [k, STACK_NAMES[k]]), e => {
    state.stack = e.target.value; state.query = 0; state.big = null; render(); });
  const layerCount = name => S[name].attn.shape[0];
  const layerSelect = select(controls, "layer", [...Array(Math.max(layerCount("encoder"),
    layerCount("decoder_self"))).keys()].map(i => [i, i]), e => {
    state.layer = +e.target.value; state.big = null; render(); });
  const exportButton = el("button", {class: "export", id: "export"}, controls, "Export this view (PNG / SVG)");
  exportButton.addEventListener("click", () => figures(state.view).forEach(f => {
    const a = el("a", {href: f.url, download: f.name}, document.body);
    a.click();
    a.remove();
  }));
  const nav = el("nav", {}, document.body), main = el("main", {}, document.body);
  const VIEWS = {heads: "Head view", model: "Model view", qk: "Queries and keys", gradient: "Gradient",
    decoding: "Decoding", masks: "Masks and positions"};
  const sections = {}, tabs = {};
  for (const [name, title] of Object.entries(VIEWS)) {
    tabs[name] = el("button", {id: "tab-" + name}, nav, title);
    tabs[name].addEventListener("click", () => { state.view = name; render(); });
    sections[name] = el("section", {id: "view-" + name}, main);
  }

  function render() {
    state.layer = Math.min(state.layer, layerCount(state.stack) - 1);
    layerSelect.value = state.layer;
    stackSelect.value = state.stack;
    for (const name in VIEWS) {
      tabs[name].classList.toggle("active", name === state.view);
      sections[name].classList.toggle("active", name === state.view);
    }
    const sec = sections[state.view];
    sec.innerHTML = "";
    RENDER[state.view](sec, state.stack, state.layer);
  }

  // -- head view: a line from each query token to each key it attends to, one colour per head --------------------
  const headsOn = new Array(D.config.num_heads).fill(true);
  function renderHeads(sec, stack, layer) {
    el("p", {class: "help"}, sec, `${STACK_NAMES[stack]}, layer ${layer}. A line joins a query token (left) to a ` +
      "key (right), as dark as its weight; a decoder query is named by the token it produces. Hover a token to " +
      "see its row (left) or column (right) alone; untick a head to hide its lines.");
    const toggles = el("div", {class: "heads-toggles"}, sec);
    headsOn.forEach((on, h) => {
      const l = el("label", {}, toggles);
      const box = el("input", {type: "checkbox", class: "head-toggle", "data-head": h}, l);
      box.checked = on;
      box.addEventListener("change", () => { headsOn[h] = box.checked; render(); });
      el("span", {class: "swatch", style: `background:${HEAD_COLOURS[h % 16]}`}, l);
      l.appendChild(document.createTextNode(`head ${h}`));
    });
    const lab = labels(stack), n = Math.max(lab.rows.length, lab.cols.length), left = longest(lab.rows) + 10;
    const width = left + 260 + longest(lab.cols), svg = el("svg", {id: "head-svg", class: "figure", xmlns: SVGNS,
      width, height: n * 20 + 20, "font-family": "sans-serif", "font-size": 13}, sec);
    el("rect", {width, height: n * 20 + 20, fill: "#fff"}, svg);
    const y = i => 20 + i * 20, lines = el("g", {}, svg);
    headsOn.forEach((on, h) => {
      if (!on) return;
      const m = matrix(S[stack].attn, layer, h);
      for (let i = 0; i < m.rows; i++)
        for (let j = 0; j < m.cols; j++) {
          const w = m.get(i, j);
          if (w < 0.01) continue;
          el("line", {class: "link", "data-head": h, "data-q": i, "data-k": j, x1: left + 10, y1: y(i) - 4,
            x2: left + 240, y2: y(j) - 4, stroke: HEAD_COLOURS[h % 16], "stroke-width": 2, "stroke-opacity": w}, lines);
        }
    });
    const only = (attr, i) => lines.querySelectorAll("line").forEach(l => {
      l.style.display = i === null || l.getAttribute(attr) === String(i) ? "" : "none"; });
    const sides = [[lab.rows, left, "end", "data-q"], [lab.cols, left + 250, "start", "data-k"]];
    sides.forEach(([tokens, x, anchor, attr]) =>
      tokens.forEach((t, i) => {
        const text = el("text", {class: "tok", x, y: y(i), "text-anchor": anchor, "data-i": i, "data-side": attr},
          svg, t);
        text.addEventListener("mouseenter", () => only(attr, i));
        text.addEventListener("mouseleave", () => only(attr, null));
      }));
  }

  // -- model view: every layer x head as a thumbnail; click one to open it large -------------------------------------
  function renderModel(sec, stack) {
    el("p", {class: "help"}, sec, `${STACK_NAMES[stack]}: a row per layer, a column per head, weights 0 (dark) to 1 ` +
      "(yellow). Click a map to open it large with its tokens.");
    const t = S[stack].attn, [L, H] = t.shape, side = 84, gap = 14, top = 22, left = 58;
    const ctx = canvas(sec, left + H * (side + gap), top + L * (side + gap));
    for (let l = 0; l < L; l++) {
      ctx.fillStyle = "#222"; ctx.textAlign = "right";
      ctx.fillText(`layer ${l}`, left - 6, top + l * (side + gap) + side / 2);
      for (let h = 0; h < H; h++) {
        const m = matrix(t, l, h);
        heatmap(ctx, left + h * (side + gap), top + l * (side + gap), m, side / Math.max(m.rows, m.cols), viridis, null,
          l === 0 ? `head ${h}` : "");
      }
    }
    ctx.canvas.addEventListener("click", e => {
      const h = Math.floor((e.offsetX - left) / (side + gap)), l = Math.floor((e.offsetY - top) / (side + gap));
      if (h >= 0 && h < H && l >= 0 && l < L) { state.big = [l, h]; render(); }
    });
    if (state.big) {
      const [l, h] = state.big, m = matrix(t, l, h), lab = labels(stack);
      const cell = Math.max(8, Math.min(22, 600 / m.cols));
      const x = longest(lab.rows), big = canvas(sec, x + m.cols * cell + 20, 30 + m.rows * cell + longest(lab.cols));
      big.canvas.id = "model-big";
      heatmap(big, x, 24, m, cell, viridis, lab, `${STACK_NAMES[stack]}, layer ${l}, head ${h}`);
    }
  }

  // -- queries and keys: for one head and one query, q * k per key, its sum, the scale, the softmax ----------------
  function renderQK(sec, stack, layer) {
    const lab = labels(stack), s = S[stack], H = s.q.shape[1];
    const heads = select(sec, "head", [...Array(H).keys()].map(h => [h, h]), e => {
      state.head = +e.target.value; render(); });
    const query = select(sec, " query token", lab.rows.map((t, i) => [i, `${i}: ${t}`]), e => {
      state.query = +e.target.value; render(); });
    heads.value = state.head = Math.min(state.head, H - 1);
    query.value = state.query = Math.min(state.query, lab.rows.length - 1);
    const q = matrix(s.q, layer, state.head), k = matrix(s.k, layer, state.head), mask = matrix(s.mask);
    const a = matrix(s.attn, layer, state.head), i = state.query, dk = q.cols;
    el("p", {class: "help"}, sec, `score(q, k) = sum of q * k over the ${dk} dimensions, times the scale ` +
      `${s.scale.toPrecision(3)}${s.scale < 1 ? " = 1/sqrt(d_k)" : ""}; masked keys get no weight; the softmax of ` +
      "the scores is the weight. Blue negative, red positive.");
    const rows = lab.cols.map((_, j) => {
      const prod = [...Array(dk).keys()].map(d => q.get(i, d) * k.get(j, d));
      const score = prod.reduce((x, y) => x + y, 0);
      return {prod, score, scaled: score * s.scale, allowed: mask.get(i, j) > 0.5};
    });
    const best = Math.max(...rows.filter(r => r.allowed).map(r => r.scaled));
    const total = rows.reduce((x, r) => x + (r.allowed ? Math.exp(r.scaled - best) : 0), 0);
    const big = Math.max(1e-12, ...rows.flatMap(r => r.prod.map(Math.abs)));
    const cell = Math.max(3, Math.min(10, 320 / dk)), x0 = longest(lab.cols), cols = [x0 + dk * cell + 12];
    [70, 80, 80, 80].forEach(w => cols.push(cols[cols.length - 1] + w));
    const svg = el("svg", {id: "qk-svg", class: "figure", xmlns: SVGNS, width: cols[4] + 110,
      height: 60 + rows.length * 16, "font-family": "sans-serif", "font-size": 12}, sec);
    el("rect", {width: cols[4] + 110, height: 60 + rows.length * 16, fill: "#fff"}, svg);
    el("text", {x: 4, y: 16}, svg,
      `query "${lab.rows[i]}" (position ${i}), head ${state.head}, ${STACK_NAMES[stack]}, layer ${layer}`);
    ["q ∘ k, per dimension", "sum", "× scale", "softmax", "model's A"].forEach((t, c) =>
      el("text", {x: c ? cols[c - 1] : x0, y: 40}, svg, t));
    rows.forEach((r, j) => {
      const y = 50 + j * 16;
      el("text", {x: x0 - 4, y: y + 11, "text-anchor": "end"}, svg, lab.cols[j]);
      r.prod.forEach((p, d) =>
        el("rect", {x: x0 + d * cell, y, width: cell, height: 14, fill: diverging(p / big)}, svg));
      const weight = r.allowed ? Math.exp(r.scaled - best) / total : 0;
      [r.score.toFixed(3), r.scaled.toFixed(3), r.allowed ? weight.toFixed(4) : "masked", a.get(i, j).toFixed(4)]
        .forEach((t, c) => el("text", {x: cols[c], y: y + 11, class: c === 3 ? "model-weight" : ""}, svg, t));
      el("rect", {x: cols[4] + 50, y: y + 2, width: 60 * a.get(i, j), height: 10,
        fill: HEAD_COLOURS[state.head % 16]}, svg);
    });
  }

  // -- gradient: dL/dA of every head of a layer, and each head's share of the gradient at the embeddings ----------
  function renderGradient(sec, stack, layer) {
    el("p", {class: "help"}, sec, `After one backward pass of the loss (${D.loss.toFixed(4)}, cross-entropy on ` +
      `${D.target}): dL/dA for each head of ${STACK_NAMES[stack]}, layer ${layer}. Red: raising that weight raises ` +
      "the loss; blue: raising it lowers the loss. A head's share: of the gradient g reaching the embeddings " +
      "(the source for the encoder and the cross-attention, the target for the decoder's self-attention), the " +
      "part g_h that flows through the head (for a cross head, through its keys and values), as <g_h, g> / |g|²; " +
      "a layer's heads and the rest (the paths around them by the residual connection; for the cross-attention, " +
      "also those through its queries) add up to 100%. A negative share pulls against the whole. |g_h| is the " +
      "size of the head's part.");
    const t = S[stack].dattn, H = t.shape[1], lab = labels(stack);
    const pct = v => (100 * v).toFixed(1) + "%";
    let peak = 1e-30;
    for (let h = 0; h < H; h++) {
      const m = matrix(t, layer, h);
      for (let i = 0; i < m.rows; i++) for (let j = 0; j < m.cols; j++) peak = Math.max(peak, Math.abs(m.get(i, j)));
    }
    const n = Math.max(lab.rows.length, lab.cols.length), cell = Math.max(3, Math.min(22, 220 / n)), per = 4;
    const side = n * cell, x0 = longest(lab.rows), w = Math.max(side + 24, 140), h0 = 24;
    const hh = side + longest(lab.cols) + 30;
    const ctx = canvas(sec, x0 + Math.min(H, per) * w, Math.ceil(H / per) * hh + 24);
    ctx.canvas.id = "gradient-canvas";
    for (let h = 0; h < H; h++) {
      const m = matrix(t, layer, h), x = x0 + (h % per) * w, y = h0 + Math.floor(h / per) * hh;
      const shown = cell >= 7 ? {rows: h % per ? [] : lab.rows, cols: lab.cols} : null;   // labels when they fit
      heatmap(ctx, x, y, m, cell, v => diverging(v / peak), shown, `head ${h}: share ${pct(S[stack].share[layer][h])}`);
    }
    ctx.fillStyle = "#222"; ctx.textAlign = "left";
    ctx.fillText(`colour scale ±${peak.toExponential(2)}`, x0, ctx.canvas.height - 6);
    const table = el("table", {class: "share", id: "share-table"}, sec), head = el("tr", {}, table);
    el("th", {}, head, "share of each head (|g_h|)");
    for (let h = 0; h < H; h++) el("th", {}, head, `head ${h}`);
    el("th", {}, head, "rest");
    for (const [name, s] of Object.entries(S))
      s.share.forEach((row, l) => {
        const tr = el("tr", {}, table);
        el("th", {}, tr, `${name}, layer ${l}`);
        row.forEach((v, h) => el("td", {style: `background:${diverging(v)}`}, tr,
          `${pct(v)} (${s.grad_norm[l][h].toExponential(1)})`));
        el("td", {}, tr, pct(1 - row.reduce((a, b) => a + b, 0)));
      });
  }

  // -- decoding: the output step by step, each step's cross-attention beside the token chosen ---------------------
  function renderDecoding(sec, stack, layer) {
    const dec = D.decoding, cross = unpackOnce(), L = cross.shape[0], H = cross.shape[1];
    const l = Math.min(layer, L - 1);
    el("p", {class: "help"}, sec, `${dec.method}: log P(output) = ${dec.log_p.toFixed(3)}, ` +
      `score ${dec.score.toFixed(3)}` +
      ` (log P over the length penalty). Each row: the token chosen at that step and its probability, the ` +
      `cross-attention of layer ${l} on the source at that step, and the ${dec.steps[0].top.length} most probable ` +
      "tokens.");
    const pick = select(sec, "heads", [[-1, "mean of the heads"], ...[...Array(H).keys()].map(h => [h, `head ${h}`])],
      e => { state.decodeHead = +e.target.value; render(); });
    pick.value = state.decodeHead;
    const cell = 18, x0 = 40 + longest(dec.steps.map(s => `${s.token} ${s.p.toFixed(2)}`)), y0 = longest(D.src);
    const ctx = canvas(sec, x0 + D.src.length * cell + 420, y0 + dec.steps.length * cell + 10);
    ctx.canvas.id = "decoding-canvas";
    const heads = state.decodeHead < 0 ? [...Array(H).keys()] : [state.decodeHead];
    const row = t => ({rows: 1, cols: D.src.length,
      get: (_, j) => heads.reduce((x, h) => x + matrix(cross, l, h).get(t, j), 0) / heads.length});
    dec.steps.forEach((s, t) => {
      const y = y0 + t * cell;
      heatmap(ctx, x0, y, row(t), cell, viridis, t === 0 ? {rows: [], cols: []} : null);
      ctx.fillStyle = "#222"; ctx.textAlign = "right";
      ctx.fillText(`${t}`, 24, y + 13);
      ctx.fillText(`${s.token} ${s.p.toFixed(2)}`, x0 - 6, y + 13);
      ctx.textAlign = "left";
      const top = s.top.map(([tok, p]) => `${tok} ${p.toFixed(2)}`).join("   ");
      ctx.fillText(top, x0 + D.src.length * cell + 10, y + 13);
    });
    ctx.textAlign = "left";
    D.src.forEach((tok, j) => {
      ctx.save(); ctx.translate(x0 + (j + 0.5) * cell + 4, y0 - 4); ctx.rotate(-Math.PI / 2); ctx.fillText(tok, 0, 0);
      ctx.restore();
    });
    if (!dec.beam) return;
    el("p", {class: "help"}, sec, "The beam after each step: its hypotheses, best first, each with its score " +
      "(log P over the length penalty; a hypothesis that ended keeps its score). In bold the one the output grows " +
      "from: its tokens are the rows above, each beside its cross-attention.");
    const table = el("table", {class: "beam", id: "beam-table"}, sec);
    dec.beam.forEach((hyps, t) => {
      const tr = el("tr", {}, table);
      el("th", {}, tr, `${t}`);
      hyps.forEach(([text, score, grows]) =>
        el("td", {class: grows ? "grows" : ""}, tr, `${text}  ${score.toFixed(3)}`));
    });
  }
  let crossCache = null;
  const unpackOnce = () => crossCache ||
    (crossCache = D.decoding.cross ? unpack(D.decoding.cross) : S.decoder_cross.attn);

  // -- masks and positional encodings of this sentence -----------------------------------------------------------
  function renderMasks(sec) {
    el("p", {class: "help"}, sec, "The masks as they apply to this sentence (yellow: may attend, dark: masked), and " +
      "the positional encodings added to the embeddings of its positions (blue negative, red positive).");
    const pad = matrix(S.encoder.mask), self = matrix(S.decoder_self.mask), T = self.rows;
    const cell = Math.max(6, Math.min(16, 400 / Math.max(T, pad.cols)));
    const target = {rows: D.tgt_in, cols: D.tgt_in}, panels = [
      ["source padding (encoder, cross)", {rows: 1, cols: pad.cols, get: (_, j) => pad.get(0, j)}, {rows: ["all"],
        cols: D.src}],
      ["subsequent", {rows: T, cols: T, get: (i, j) => +(j <= i)}, target],
      ["decoder self: padding and subsequent", self, target]];
    const x0 = longest(D.tgt_in), lab = longest(D.src.concat(D.tgt_in));
    const ctx = canvas(sec, 3 * (x0 + Math.max(T, pad.cols) * cell + 30), 40 + Math.max(T, 1) * cell + lab);
    ctx.canvas.id = "masks-canvas";
    let x = x0;
    panels.forEach(([title, m, l]) => {
      heatmap(ctx, x, 30, m, cell, v => viridis(v > 0.5 ? 0.95 : 0), cell >= 8 ? l : null, title);
      x += m.cols * cell + x0 + 30;
    });
    const pe = unpack(D.pe), pm = matrix({shape: [1, ...pe.shape], v: pe.v}, 0), pc = Math.max(1, 600 / pm.cols);
    const p2 = canvas(sec, 60 + pm.cols * pc, 40 + pm.rows * 10);
    p2.canvas.id = "pe-canvas";
    for (let i = 0; i < pm.rows; i++) for (let j = 0; j < pm.cols; j++) {
      p2.fillStyle = diverging(pm.get(i, j)); p2.fillRect(40 + j * pc, 24 + i * 10, Math.ceil(pc), 10);
    }
    p2.fillStyle = "#222"; p2.textAlign = "left";
    p2.fillText(`positional encoding (${D.config.positional}): a row per position 0..${pm.rows - 1}, ` +
      `a column per dimension (d_model ${pm.cols})`, 40, 16);
  }

  const RENDER = {heads: renderHeads, model: renderModel, qk: renderQK, gradient: renderGradient,
    decoding: renderDecoding, masks: renderMasks};

  // -- export: each figure of a view as PNG (canvas) or SVG -------------------------------------------------------
  function figures(view) {
    return [...sections[view].querySelectorAll(".figure")].map((f, n) => {
      const name = `explain-${view}-${state.stack}-layer${state.layer}-${n}`;
      if (f.tagName.toLowerCase() === "canvas") return {name: name + ".png", url: f.toDataURL("image/png")};
      const text = new XMLSerializer().serializeToString(f);
      return {name: name + ".svg", url: "data:image/svg+xml;charset=utf-8," + encodeURIComponent(text)};
    });
  }
  window.explainFigures = figures;
  render();
})();
