// attnviz's notebook views: plain JavaScript, no imports, nothing fetched from any host.
//
// The numbers come from Python (attnviz.notebook.frames): palette indices (one byte a pixel, the
// colours of attnviz's contrast), the weights behind them for hover, and labels. This script only
// draws them and sends back what the reader chose (kind, layer, head, contrast, words, a dragged
// box). Rows are queries and columns keys. The same script runs as an anywidget (model: anywidget's)
// and in a self-contained page (model: attnvizStandalone's stand-in, from embedded frames).

const HIGHLIGHT = "#d62728";
const LINES_MAX = 64; // BertViz's lines: drawn when both axes have at most this many tokens
const LABEL_MIN_PX = 11; // token labels beside the map when a cell is at least this tall
const MAP_PX = 640; // the map is scaled to about this many pixels on its longer side

function bytesOf(value) {
  if (!value) return new Uint8Array(0);
  if (value instanceof Uint8Array) return value;
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  return new Uint8Array(0);
}

function halfToFloat(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * Math.pow(2, -14) * (frac / 1024);
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * Math.pow(2, exp - 15) * (1 + frac / 1024);
}

function floatsOf(value) {
  const copy = bytesOf(value).slice(); // aligned
  return new Float32Array(copy.buffer, 0, copy.byteLength / 4);
}

// The weight at a pixel, read when asked (hover): a million float16 weights are not converted up front.
function weightReader(value, dtype) {
  const bytes = bytesOf(value);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dtype === "float16") return (p) => halfToFloat(view.getUint16(2 * p, true));
  return (p) => view.getFloat32(4 * p, true);
}

function make(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) if (child) node.appendChild(child);
  return node;
}

function select(label, options, value, onChange) {
  const box = make("select", { "aria-label": label });
  for (const [v, text] of options) {
    const opt = make("option", { value: String(v), text: String(text) });
    box.appendChild(opt);
  }
  box.value = String(value);
  box.addEventListener("change", () => onChange(box.value));
  const wrap = make("label", { class: "attnviz-pick" }, make("span", { text: label }), box);
  return { wrap, box };
}

function setOptions(box, options, value) {
  box.replaceChildren(...options.map(([v, t]) => make("option", { value: String(v), text: String(t) })));
  box.value = String(value);
}

// The first n characters of text, by code point: String.slice counts UTF-16 units, and had cut an emoji in half
// (a lone surrogate, drawn as a replacement character).
function clip(text, n) {
  return Array.from(text).slice(0, n).join("");
}

function range(n) {
  return Array.from({ length: n }, (_, i) => i + 1);
}

function colourOf(palette, index) {
  return `rgb(${palette[3 * index]},${palette[3 * index + 1]},${palette[3 * index + 2]})`;
}

// ---------------------------------------------------------------------------------------------
// One head: pickers, the map (canvas), BertViz's lines, hover, a dragged box to zoom

function headPanel(model, root) {
  const spec = model.get("spec");
  const panel = make("div", { class: "attnviz-head" });
  const bar = make("div", { class: "attnviz-toolbar" });
  const kindPick = select("Attention", spec.kinds.map((k) => [k, k]), model.get("kind"), (v) => choose({ kind: v, layer: 1, head: 1 }));
  const layerPick = select("Layer", [], model.get("layer"), (v) => choose({ layer: Number(v) }));
  const headPick = select("Head", [], model.get("head"), (v) => choose({ head: Number(v) }));
  const contrastPick = select("Contrast", Object.entries(spec.contrasts), model.get("contrast"), (v) => choose({ contrast: v }));
  bar.append(kindPick.wrap, layerPick.wrap, headPick.wrap, contrastPick.wrap);
  let wordsBox = null;
  if (spec.has_words) {
    wordsBox = make("input", { type: "checkbox", "aria-label": "Words" });
    wordsBox.checked = !!model.get("words");
    wordsBox.addEventListener("change", () => choose({ words: wordsBox.checked }));
    bar.append(make("label", { class: "attnviz-pick" }, wordsBox, make("span", { text: "Words" })));
  }
  const whole = make("button", { type: "button", class: "attnviz-whole", text: "Whole map" });
  whole.addEventListener("click", () => choose({ zoom: [] }));
  bar.append(whole);
  const title = make("div", { class: "attnviz-title" });
  const note = make("div", { class: "attnviz-note" });
  const error = make("div", { class: "attnviz-error", role: "alert" });
  const colLabels = make("div", { class: "attnviz-cols" });
  const rowLabels = make("div", { class: "attnviz-rows" });
  const canvas = make("canvas", { class: "attnviz-map", "aria-label": "attention map" });
  const overlay = make("canvas", { class: "attnviz-overlay" });
  const stack = make("div", { class: "attnviz-stack" }, canvas, overlay);
  const grid = make("div", { class: "attnviz-grid" }, make("div"), colLabels, rowLabels, stack);
  const lines = make("canvas", { class: "attnviz-lines", "aria-label": "lines view" });
  const legend = make("div", { class: "attnviz-legend" });
  const tip = make("div", { class: "attnviz-tip" });
  const body = make("div", { class: "attnviz-body" }, grid, lines, legend);
  panel.append(bar, title, note, error, body, tip);
  root.appendChild(panel);

  let state = null; // the frame being shown, decoded
  let hover = { row: -1, col: -1 };
  let drag = null;

  function choose(values) {
    for (const [k, v] of Object.entries(values)) model.set(k, v);
    if (!("zoom" in values) && (model.get("zoom") || []).length) model.set("zoom", []);
    model.save_changes();
  }

  function decode() {
    const frame = model.get("frame");
    if (!frame || !frame.shape) return null;
    const [h, w] = frame.shape;
    const indices = bytesOf(model.get("indices"));
    const weightAt = weightReader(model.get("weights"), frame.dtype);
    const palette = bytesOf(model.get("palette"));
    const [fr, fc] = frame.blocks;
    const longest = Math.max(h, w);
    const scale = Math.max(1, Math.min(28, Math.floor(MAP_PX / longest))) || 1;
    return { frame, h, w, indices, weightAt, palette, fr, fc, scale };
  }

  function syncPickers(frame) {
    const [L, H] = spec.shapes[frame.kind];
    kindPick.box.value = frame.kind;
    setOptions(layerPick.box, range(L).map((i) => [i, i]), frame.layer);
    setOptions(headPick.box, range(H).map((i) => [i, i]), frame.head);
    contrastPick.box.value = frame.contrast;
    if (wordsBox) wordsBox.checked = frame.words;
    const [r0, r1, c0, c1] = frame.region;
    const [Q, K] = frame.full;
    whole.hidden = r0 === 0 && c0 === 0 && r1 === Q && c1 === K;
  }

  function drawMap() {
    const { frame, h, w, indices, palette, scale } = state;
    const image = new ImageData(w, h);
    for (let p = 0; p < h * w; p++) {
      const c = indices[p];
      image.data[4 * p] = palette[3 * c];
      image.data[4 * p + 1] = palette[3 * c + 1];
      image.data[4 * p + 2] = palette[3 * c + 2];
      image.data[4 * p + 3] = 255;
    }
    const small = document.createElement("canvas");
    small.width = w;
    small.height = h;
    small.getContext("2d").putImageData(image, 0, 0);
    for (const c of [canvas, overlay]) {
      c.width = w * scale;
      c.height = h * scale;
    }
    const ctx = canvas.getContext("2d");
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(small, 0, 0, w * scale, h * scale);
    title.textContent = frame.title;
    note.textContent = frame.note;
    labels();
    drawLegend();
  }

  function labels() {
    const { frame, h, w, scale, fr, fc } = state;
    const [r0, , c0] = frame.region;
    const exact = fr === 1 && fc === 1 && scale >= LABEL_MIN_PX;
    rowLabels.replaceChildren();
    colLabels.replaceChildren();
    rowLabels.style.height = `${h * scale}px`;
    colLabels.style.width = `${w * scale}px`;
    if (!exact) return;
    for (let i = 0; i < h; i++) {
      const lab = make("div", { class: "attnviz-label", "data-row": String(i), title: `query ${r0 + i}`, text: frame.rows[r0 + i] });
      lab.style.height = lab.style.lineHeight = `${scale}px`;
      lab.addEventListener("mouseenter", () => setHover(i, -1));
      lab.addEventListener("mouseleave", () => setHover(-1, -1));
      rowLabels.appendChild(lab);
    }
    for (let j = 0; j < w; j++) {
      const lab = make("div", { class: "attnviz-label", "data-col": String(j), title: `key ${c0 + j}`, text: frame.cols[c0 + j] });
      lab.style.width = lab.style.lineHeight = `${scale}px`;
      lab.addEventListener("mouseenter", () => setHover(-1, j));
      lab.addEventListener("mouseleave", () => setHover(-1, -1));
      colLabels.appendChild(lab);
    }
  }

  function drawLegend() {
    const { frame, palette } = state;
    const stops = [];
    for (let k = 0; k < frame.levels; k += 16) stops.push(`${colourOf(palette, k)} ${((100 * k) / (frame.levels - 1)).toFixed(1)}%`);
    stops.push(`${colourOf(palette, frame.levels - 1)} 100%`);
    const ramp = make("div", { class: "attnviz-ramp" });
    ramp.style.background = `linear-gradient(to right, ${stops.join(", ")})`;
    const ticks = make("div", { class: "attnviz-ticks" });
    frame.bar.tickvals.forEach((v, i) => {
      const t = make("span", { text: frame.bar.ticktext[i] });
      t.style.left = `${100 * v}%`;
      ticks.appendChild(t);
    });
    legend.replaceChildren(make("div", { text: frame.bar.title.text }), ramp, ticks);
  }

  function drawLines() {
    const { frame, h, w, indices, palette, fr, fc } = state;
    const ctx = lines.getContext("2d");
    if (fr !== 1 || fc !== 1 || h > LINES_MAX || w > LINES_MAX) {
      lines.hidden = true;
      return;
    }
    lines.hidden = false;
    const pitch = 18;
    const width = 360;
    lines.width = width;
    lines.height = Math.max(h, w) * pitch + 10;
    ctx.clearRect(0, 0, lines.width, lines.height);
    ctx.font = "12px sans-serif";
    const [r0, , c0] = frame.region;
    const left = 130;
    const right = width - 130;
    for (let i = 0; i < h; i++) {
      ctx.fillStyle = i === hover.row ? HIGHLIGHT : "#1a1a1a";
      ctx.textAlign = "right";
      ctx.fillText(clip(frame.rows[r0 + i], 18), left - 6, 14 + i * pitch);
    }
    for (let j = 0; j < w; j++) {
      ctx.fillStyle = j === hover.col ? HIGHLIGHT : "#1a1a1a";
      ctx.textAlign = "left";
      ctx.fillText(clip(frame.cols[c0 + j], 18), right + 6, 14 + j * pitch);
    }
    const top = frame.levels - 1;
    for (let i = 0; i < h; i++) {
      if (hover.row >= 0 && i !== hover.row) continue;
      for (let j = 0; j < w; j++) {
        if (hover.col >= 0 && j !== hover.col) continue;
        const c = indices[i * w + j];
        if (c >= frame.levels) continue; // masked
        const alpha = c / top;
        if (alpha < 0.02) continue;
        ctx.strokeStyle = hover.row >= 0 || hover.col >= 0 ? HIGHLIGHT : colourOf(palette, Math.max(c, top / 2));
        ctx.globalAlpha = alpha;
        ctx.lineWidth = 2;
        ctx.beginPath();
        ctx.moveTo(left, 10 + i * pitch);
        ctx.lineTo(right, 10 + j * pitch);
        ctx.stroke();
      }
    }
    ctx.globalAlpha = 1;
  }

  function drawOverlay() {
    const { h, w, scale } = state;
    const ctx = overlay.getContext("2d");
    ctx.clearRect(0, 0, overlay.width, overlay.height);
    ctx.strokeStyle = HIGHLIGHT;
    ctx.lineWidth = 2;
    if (hover.row >= 0) ctx.strokeRect(1, hover.row * scale + 1, w * scale - 2, scale - 2 > 0 ? scale - 2 : 1);
    if (hover.col >= 0) ctx.strokeRect(hover.col * scale + 1, 1, scale - 2 > 0 ? scale - 2 : 1, h * scale - 2);
    if (drag && drag.now) {
      ctx.setLineDash([4, 3]);
      ctx.strokeStyle = "#111";
      const [x0, y0] = drag.start;
      const [x1, y1] = drag.now;
      ctx.strokeRect(Math.min(x0, x1), Math.min(y0, y1), Math.abs(x1 - x0), Math.abs(y1 - y0));
      ctx.setLineDash([]);
    }
    for (const lab of rowLabels.children) lab.classList.toggle("attnviz-on", Number(lab.dataset.row) === hover.row);
    for (const lab of colLabels.children) lab.classList.toggle("attnviz-on", Number(lab.dataset.col) === hover.col);
  }

  function setHover(row, col) {
    hover = { row, col };
    panel.dataset.hoverRow = String(row);
    panel.dataset.hoverCol = String(col);
    drawOverlay();
    drawLines();
  }

  function cellAt(event) {
    const rect = overlay.getBoundingClientRect();
    const x = ((event.clientX - rect.left) * overlay.width) / rect.width;
    const y = ((event.clientY - rect.top) * overlay.height) / rect.height;
    return [x, y, Math.floor(y / state.scale), Math.floor(x / state.scale)];
  }

  function hideTip() {
    tip.style.display = "none";
    delete panel.dataset.tip;
  }

  // The tooltip and highlight for the pointer at (clientX, clientY), from the frame drawn now: off the
  // map (its edge included) the tooltip goes, rather than keep a cell the pointer has left.
  function pointAt(clientX, clientY) {
    const [, , i, j] = cellAt({ clientX, clientY });
    if (i < 0 || j < 0 || i >= state.h || j >= state.w) {
      hideTip();
      setHover(-1, -1);
      return;
    }
    setHover(i, j);
    const { frame, fr, fc, w, weightAt } = state;
    const [r0, , c0] = frame.region;
    const q = r0 + i * fr;
    const k = c0 + j * fc;
    const where = fr === 1 && fc === 1
      ? `query ${q} ${frame.rows[q]}\nkey ${k} ${frame.cols[k]}`
      : `queries ${q}-${Math.min(q + fr, frame.region[1]) - 1}\nkeys ${k}-${Math.min(k + fc, frame.region[3]) - 1}`;
    const masked = state.indices[i * w + j] >= frame.levels;
    tip.textContent = `${where}\n${masked ? "masked (the future)" : `${frame.values}: ${weightAt(i * w + j).toFixed(4)}`}`;
    tip.style.display = "block";
    const box = panel.getBoundingClientRect();
    tip.style.left = `${clientX - box.left + 14}px`;
    tip.style.top = `${clientY - box.top + 14}px`;
    panel.dataset.tip = `${i},${j}`;
  }

  let pointer = null; // the last pointer position over the map, to redo the tooltip when the frame changes
  overlay.addEventListener("mousemove", (event) => {
    if (!state) return;
    pointer = [event.clientX, event.clientY];
    if (drag) {
      const [x, y] = cellAt(event);
      drag.now = [x, y];
      drawOverlay();
      return;
    }
    pointAt(event.clientX, event.clientY);
  });
  overlay.addEventListener("mouseleave", () => {
    pointer = null;
    hideTip();
    if (!drag) setHover(-1, -1);
  });
  overlay.addEventListener("mousedown", (event) => {
    if (!state || !spec.zoomable) return;
    const [x, y] = cellAt(event);
    drag = { start: [x, y], now: null };
    event.preventDefault();
  });
  window.addEventListener("mouseup", onUp);
  function onUp(event) {
    if (!drag) return;
    const box = drag;
    drag = null;
    drawOverlay();
    if (!box.now) return;
    const [x0, y0] = box.start;
    const [x1, y1] = box.now;
    if (Math.abs(x1 - x0) < 4 && Math.abs(y1 - y0) < 4) return;
    const { frame, fr, fc, scale, h, w } = state;
    const [r0, r1, c0, c1] = frame.region;
    const clampIndex = (v, n) => Math.min(Math.max(v, 0), n - 1);
    const i0 = clampIndex(Math.floor(Math.min(y0, y1) / scale), h);
    const i1 = clampIndex(Math.floor(Math.max(y0, y1) / scale), h);
    const j0 = clampIndex(Math.floor(Math.min(x0, x1) / scale), w);
    const j1 = clampIndex(Math.floor(Math.max(x0, x1) / scale), w);
    const zoom = [r0 + i0 * fr, Math.min(r1, r0 + (i1 + 1) * fr), c0 + j0 * fc, Math.min(c1, c0 + (j1 + 1) * fc)];
    panel.dataset.pending = "zoom";
    choose({ zoom });
  }

  function redraw() {
    const next = decode();
    if (!next) return;
    state = next;
    syncPickers(state.frame);
    drawMap();
    hover = { row: -1, col: -1 };
    if (pointer) pointAt(...pointer); // the pointer rests on the map: tell the new frame's cell there
    else hideTip();
    drawOverlay();
    drawLines();
    const f = state.frame;
    panel.dataset.frame = `${f.kind}|${f.layer}|${f.head}|${f.contrast}|${f.words ? 1 : 0}|${f.region.join(",")}|${f.blocks.join("x")}`;
    panel.dataset.drawn = String(Number(panel.dataset.drawn || 0) + 1);
    delete panel.dataset.pending;
  }

  function showError() {
    error.textContent = model.get("error") || "";
    delete panel.dataset.pending;
    const frame = model.get("frame");
    if (model.get("error") && frame && frame.shape) syncPickers(frame); // a refused choice: back to what is drawn
  }

  model.on("change:frame", redraw);
  model.on("change:error", showError);
  redraw();
  showError();
  return () => {
    model.off("change:frame", redraw);
    model.off("change:error", showError);
    window.removeEventListener("mouseup", onUp);
  };
}

// ---------------------------------------------------------------------------------------------
// Every head: thumbnails; a click opens the head below

function modelPanel(model, root) {
  const panel = make("div", { class: "attnviz-model" });
  const title = make("div", { class: "attnviz-title" });
  const canvas = make("canvas", { class: "attnviz-thumbs", "aria-label": "every head" });
  panel.append(title, canvas);
  root.appendChild(panel);
  let layout = null;

  function draw() {
    const info = model.get("grid_info");
    if (!info || !info.grid_shape) return;
    const [L, H, h, w] = info.grid_shape;
    const data = bytesOf(model.get("grid"));
    const palette = bytesOf(model.get("palette"));
    const scale = Math.max(1, Math.floor(72 / Math.max(h, w)));
    const gap = Math.max(6, Math.round(0.12 * w * scale));
    const left = 60;
    const top = 22;
    canvas.width = left + H * (w * scale + gap);
    canvas.height = top + L * (h * scale + gap);
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "white";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.imageSmoothingEnabled = false;
    ctx.font = "12px sans-serif";
    ctx.fillStyle = "#1a1a1a";
    const frame = model.get("frame") || {};
    for (let l = 0; l < L; l++) {
      ctx.fillText(`layer ${l + 1}`, 4, top + l * (h * scale + gap) + (h * scale) / 2 + 4);
      for (let k = 0; k < H; k++) {
        if (l === 0) ctx.fillText(`head ${k + 1}`, left + k * (w * scale + gap), 14);
        const image = new ImageData(w, h);
        const base = (l * H + k) * h * w;
        for (let p = 0; p < h * w; p++) {
          const c = data[base + p];
          image.data.set([palette[3 * c], palette[3 * c + 1], palette[3 * c + 2], 255], 4 * p);
        }
        const small = document.createElement("canvas");
        small.width = w;
        small.height = h;
        small.getContext("2d").putImageData(image, 0, 0);
        const x = left + k * (w * scale + gap);
        const y = top + l * (h * scale + gap);
        ctx.drawImage(small, x, y, w * scale, h * scale);
        const chosen = frame.kind === info.grid_kind && frame.layer === l + 1 && frame.head === k + 1;
        ctx.strokeStyle = chosen ? HIGHLIGHT : "#d9d9d9";
        ctx.lineWidth = chosen ? 3 : 1;
        ctx.strokeRect(x - 1, y - 1, w * scale + 2, h * scale + 2);
      }
    }
    layout = { L, H, h, w, scale, gap, left, top };
    canvas.dataset.layout = [left, top, w * scale, h * scale, gap].join(","); // where each head is, in canvas pixels
    title.textContent = `${info.grid_title}: click a head to open it below`;
    panel.dataset.drawn = String(Number(panel.dataset.drawn || 0) + 1);
  }

  canvas.addEventListener("click", (event) => {
    if (!layout) return;
    const rect = canvas.getBoundingClientRect();
    const x = ((event.clientX - rect.left) * canvas.width) / rect.width - layout.left;
    const y = ((event.clientY - rect.top) * canvas.height) / rect.height - layout.top;
    const k = Math.floor(x / (layout.w * layout.scale + layout.gap));
    const l = Math.floor(y / (layout.h * layout.scale + layout.gap));
    if (k < 0 || l < 0 || k >= layout.H || l >= layout.L) return;
    model.set("kind", model.get("grid_info").grid_kind);
    model.set("layer", l + 1);
    model.set("head", k + 1);
    if ((model.get("zoom") || []).length) model.set("zoom", []);
    model.save_changes();
  });
  model.on("change:grid_info", draw);
  model.on("change:frame", draw);
  draw();
  return () => {
    model.off("change:grid_info", draw);
    model.off("change:frame", draw);
  };
}

// ---------------------------------------------------------------------------------------------
// Decoding step by step

function stepPanel(model, root) {
  const spec = model.get("spec");
  const { n_steps: n, n_layers: L, n_heads: H, prefix_len: P } = spec;
  const S = spec.src.length;
  const selfRows = floatsOf(model.get("self_rows"));
  const crossRows = floatsOf(model.get("cross_rows"));
  const panel = make("div", { class: "attnviz-step" });
  let step = 0;
  let layer = L;
  let head = 1;
  const prev = make("button", { type: "button", text: "◀ step" });
  const next = make("button", { type: "button", text: "step ▶" });
  const slider = make("input", { type: "range", min: "0", max: String(n - 1), value: "0", "aria-label": "Step" });
  const layerPick = select("Layer", range(L).map((i) => [i, i]), layer, (v) => { layer = Number(v); draw(); });
  const headPick = select("Head", range(H).map((i) => [i, i]), head, (v) => { head = Number(v); draw(); });
  prev.addEventListener("click", () => { step = Math.max(0, step - 1); draw(); });
  next.addEventListener("click", () => { step = Math.min(n - 1, step + 1); draw(); });
  slider.addEventListener("input", () => { step = Number(slider.value); draw(); });
  const bar = make("div", { class: "attnviz-toolbar" }, prev, slider, next, layerPick.wrap, headPick.wrap);
  const output = make("div", { class: "attnviz-output" });
  const chosen = make("div", { class: "attnviz-title" });
  const top = make("div", { class: "attnviz-note" });
  const cross = make("div", { class: "attnviz-chips" });
  const self = make("div", { class: "attnviz-chips" });
  panel.append(bar, output, chosen, top);
  if (S) panel.append(make("div", { class: "attnviz-note", text: "cross-attention: where this step looks in the source" }), cross);
  panel.append(make("div", { class: "attnviz-note", text: "decoder self-attention: where it looks in what came before (causal)" }), self);
  root.appendChild(panel);

  function chips(box, tokens, values) {
    let peak = 0;
    for (const v of values) peak = Math.max(peak, v);
    box.replaceChildren(
      ...tokens.map((t, i) => {
        const chip = make("span", { class: "attnviz-chip", title: `${i} ${t}: ${values[i].toFixed(4)}`, text: t });
        chip.style.background = `rgba(33, 113, 181, ${values[i].toFixed(3)})`;
        chip.style.color = values[i] > 0.5 ? "white" : "#1a1a1a";
        if (values[i] === peak && peak > 0) chip.classList.add("attnviz-on");
        return chip;
      }),
    );
  }

  function draw() {
    slider.value = String(step);
    const t = spec.step_lengths[step];
    output.replaceChildren(
      ...spec.written.map((tok, i) => {
        const chip = make("span", { class: "attnviz-chip" + (i === step ? " attnviz-on" : ""), text: tok });
        chip.addEventListener("click", () => { step = i; draw(); });
        return chip;
      }),
    );
    chosen.textContent = `step ${step + 1} of ${n}: writes ${spec.written[step]} (probability ${spec.prob[step].toFixed(3)})`;
    top.textContent = "candidates: " + spec.top[step].map(([tok, p]) => `${tok} ${p.toFixed(3)}`).join(", ");
    const at = ((step * L + (layer - 1)) * H + (head - 1));
    if (S) chips(cross, spec.src, Array.from(crossRows.subarray(at * S, at * S + S)));
    chips(self, spec.prefix.slice(0, t), Array.from(selfRows.subarray(at * P, at * P + t)));
    panel.dataset.step = String(step);
    panel.dataset.drawn = String(Number(panel.dataset.drawn || 0) + 1);
  }
  draw();
  return () => {};
}

// ---------------------------------------------------------------------------------------------
// The head atlas: the map of heads and the table

function atlasPanel(model, root) {
  const spec = model.get("spec");
  const panel = make("div", { class: "attnviz-atlas" });
  let kind = spec.kinds[0];
  let stat = spec.statistics[0];
  let picked = null;
  const kindPick = select("Attention", spec.kinds.map((k) => [k, spec.titles[k]]), kind, (v) => { kind = v; picked = null; draw(); });
  const statPick = select("Colour", spec.statistics.map((s) => [s, spec.labels[s]]), stat, (v) => { stat = v; draw(); });
  const title = make("div", { class: "attnviz-title" });
  const svgNS = "http://www.w3.org/2000/svg";
  const plot = document.createElementNS(svgNS, "svg");
  plot.setAttribute("width", "420");
  plot.setAttribute("height", "420");
  plot.setAttribute("class", "attnviz-atlas-map");
  const table = make("table", { class: "attnviz-table" });
  const tableBox = make("div", { class: "attnviz-table-box" }, table);
  panel.append(make("div", { class: "attnviz-toolbar" }, kindPick.wrap, statPick.wrap), title, make("div", { class: "attnviz-body" }, plot, tableBox));
  root.appendChild(panel);

  function draw() {
    const points = spec.atlas[kind];
    const values = points.statistics[stat];
    const xs = points.x;
    const ys = points.y;
    const span = Math.max(Math.max(...xs) - Math.min(...xs), Math.max(...ys) - Math.min(...ys)) || 1;
    const px = (v, lo) => 30 + ((v - lo) / span) * 360;
    plot.replaceChildren();
    points.layer.forEach((layer, i) => {
      const dot = document.createElementNS(svgNS, "circle");
      dot.setAttribute("cx", px(xs[i], Math.min(...xs)).toFixed(1));
      dot.setAttribute("cy", (420 - px(ys[i], Math.min(...ys))).toFixed(1));
      dot.setAttribute("r", "8");
      dot.setAttribute("fill", values.colours[i]);
      const isPicked = picked && picked[0] === layer && picked[1] === points.head[i];
      dot.setAttribute("stroke", isPicked ? HIGHLIGHT : "white");
      dot.setAttribute("stroke-width", isPicked ? "3" : "1");
      const v = values.values[i];
      const tip = document.createElementNS(svgNS, "title");
      tip.textContent = `layer ${layer}, head ${points.head[i]}: ${spec.labels[stat]} ${v === null ? "not defined" : v.toFixed(4)}`;
      dot.appendChild(tip);
      dot.addEventListener("click", () => { picked = [layer, points.head[i]]; draw(); });
      plot.appendChild(dot);
    });
    const order = points.layer.map((_, i) => i).sort((a, b) => (values.values[b] ?? -Infinity) - (values.values[a] ?? -Infinity));
    const head = make("tr", {}, make("th", { text: "layer" }), make("th", { text: "head" }), make("th", { text: spec.labels[stat] }));
    table.replaceChildren(
      head,
      ...order.map((i) => {
        const v = values.values[i];
        const row = make("tr", {}, make("td", { text: String(points.layer[i]) }), make("td", { text: String(points.head[i]) }), make("td", { text: v === null ? "—" : v.toFixed(4) }));
        if (picked && picked[0] === points.layer[i] && picked[1] === points.head[i]) row.classList.add("attnviz-on");
        row.addEventListener("click", () => { picked = [points.layer[i], points.head[i]]; draw(); });
        return row;
      }),
    );
    title.textContent = `${spec.titles[kind]}: ${xs.length} heads over ${spec.sentences} sentences, close on the map when they attend alike`;
    panel.dataset.drawn = String(Number(panel.dataset.drawn || 0) + 1);
  }
  draw();
  return () => {};
}

// ---------------------------------------------------------------------------------------------

// The view is drawn: the still picture Python put in an output of its own (for nbconvert and code
// hosts) goes, with its output area in JupyterLab and Notebook 7.
function hideStill(id) {
  if (!id) return;
  for (const still of document.querySelectorAll(`[data-attnviz-still="${CSS.escape(id)}"]`)) {
    (still.closest(".jp-OutputArea-child") || still).style.display = "none";
  }
}

function render({ model, el }) {
  const root = make("div", { class: "attnviz-view" });
  el.appendChild(root);
  const view = model.get("view");
  const cleanups = [];
  if (view === "model") cleanups.push(modelPanel(model, root));
  if (view === "head" || view === "model") cleanups.push(headPanel(model, root));
  if (view === "step") cleanups.push(stepPanel(model, root));
  if (view === "atlas") cleanups.push(atlasPanel(model, root));
  hideStill(model.get("still_id"));
  root.dataset.ready = "1";
  return () => cleanups.forEach((done) => done());
}

// A stand-in for the widget model in a self-contained page: a choice is answered from the frames
// embedded in the page (attnviz.notebook.standalone), with no kernel.
function attnvizStandalone(el, rawState, rawFrames) {
  const decode = (value) => {
    if (value && typeof value === "object" && !Array.isArray(value)) {
      if ("$b64" in value) {
        const text = atob(value.$b64);
        const bytes = new Uint8Array(text.length);
        for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
        return new DataView(bytes.buffer);
      }
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, decode(v)]));
    }
    if (Array.isArray(value)) return value.map(decode);
    return value;
  };
  const state = decode(rawState);
  const frames = decode(rawFrames);
  if (state.spec) state.spec = { ...state.spec, zoomable: false }; // a region needs Python: the page has none
  const handlers = {};
  let pending = {};
  const fire = (name) => (handlers[`change:${name}`] || []).forEach((f) => f());
  const model = {
    get: (name) => state[name],
    set: (name, value) => { pending[name] = value; },
    on: (event, f) => { (handlers[event] = handlers[event] || []).push(f); },
    off: (event, f) => { handlers[event] = (handlers[event] || []).filter((g) => g !== f); },
    save_changes: () => {
      Object.assign(state, pending);
      pending = {};
      if (!frames.head) return;
      const key = `${state.kind}|${state.layer}|${state.head}|${state.contrast}|${state.words ? 1 : 0}`;
      const found = frames.head[key];
      if (!found) {
        // As the widget's Python puts a refused choice back: the state (and the pickers) say what the map shows.
        // A refused choice left in the state had made every later key hold it, and refused choices the page has.
        const { kind, layer, head, contrast, words } = state.frame;
        Object.assign(state, { kind, layer, head, contrast, words });
        state.error = "This choice is not saved in this page (it keeps what fits in its size budget): run the notebook for every head.";
        fire("error");
        return;
      }
      const [rows, cols] = frames.labels[`${state.kind}|${state.words ? 1 : 0}`];
      Object.assign(state, { frame: { ...found, rows, cols }, indices: found.indices, weights: found.weights, error: "" });
      if (frames.grids) {
        const grid = frames.grids[`${state.kind}|${state.contrast}`];
        const { grid: data, ...info } = grid;
        Object.assign(state, { grid: data, grid_info: info });
        fire("grid_info");
      }
      fire("error");
      fire("frame");
    },
  };
  return render({ model, el });
}

export default { render };
