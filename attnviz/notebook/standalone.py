"""A notebook view without a widget manager: one HTML document, a static picture, an SVG file.

- `document`: the view's script and style inline, its state and the frames it can be asked for
  embedded as JSON (binary buffers as base64), and a small stand-in for the widget model that
  answers a choice from those frames. No network, no ``require.js``: it runs in an iframe's
  ``srcdoc`` (`iframe`), in a saved ``.html`` file, or where anywidget's front end cannot load.
- `fallback_png` and `fallback_html`: what the view shows now, as a picture and its numbers, for
  nbconvert, code hosts and a notebook reopened without its widget state.
- `svg`: the head view's map as a vector picture (cells, labels, colour bar).

The pictures are the frames' own palette indices (`attnviz.notebook.frames`): the same colours
as the widget and the app.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from itertools import product
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from attnviz.errors import InputError
from attnviz.figures.common import WEIGHT_COLORSCALE
from attnviz.figures.images import CONTRASTS, LEVELS, colour_indices, contrast_values, palette

STATIC = Path(__file__).parent / "static"
PAGE_BUDGET = 32 * 2**20  # the most bytes of frames a standalone page embeds (base64 adds a third)
GRID_SHARE = 0.5  # of PAGE_BUDGET, the most the model view's thumbnail grids take: the rest keeps head frames
MIN_PICTURE_PX = 320  # a fallback picture is scaled up (whole pixels per cell) to at least this many pixels
SVG_CELLS = 128 * 128  # up to this many cells an SVG draws one rectangle per cell; beyond, one embedded image
TOP_WEIGHTS = 8  # the fallback's table: the strongest weights of the map shown


# What no file of ours may hold as it is: the characters XML 1.0 forbids (C0 controls but tab, newline and
# carriage return; U+FFFE, U+FFFF), which make an SVG not well-formed, and lone surrogates, which UTF-8 cannot
# encode (a text decoded with errors="surrogateescape"). Python strings never pair surrogates, so all are lone.
UNWRITABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff\ud800-\udfff]")
SURROGATE = re.compile("[\ud800-\udfff]")


def _stand_in(match: re.Match) -> str:
    code = ord(match.group())
    return chr(0x2400 + code) if code < 0x20 else f"\\u{code:04x}"  # a C0 control as its control picture: ␀ ␌ ␛


def visible(text: str) -> str:
    """``text`` with each `UNWRITABLE` character shown as a visible stand-in: a C0 control as its Unicode control
    picture (U+2400 + its code: "\\x0c" as "␌"), the others as "\\uXXXX"."""
    return UNWRITABLE.sub(_stand_in, text)


def escape(text: str) -> str:
    """``text`` for HTML and SVG: `visible`, then HTML-escaped (quotes included)."""
    return html.escape(visible(text), quote=True)


def _encode(value):
    """``value`` as JSON, its bytes as {"$b64": ...} (the page decodes them into DataViews, as anywidget's)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _script_json(value) -> str:
    """JSON safe inside a <script> element: no "</" can close it early, and a lone surrogate (only ever inside a
    string) written as its escape, which UTF-8 can encode and the script reads back as the same string."""
    text = json.dumps(_encode(value), ensure_ascii=False).replace("</", "<\\/").replace("<!--", "<\\!--")
    return SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def script() -> str:
    """The views' script as a classic script: the ES module without its export line."""
    source = (STATIC / "views.js").read_text(encoding="utf-8")
    marker = "export default"
    if marker not in source:
        raise RuntimeError("views.js lost its export line")
    return source[: source.rindex(marker)]


def document(state: dict, frames: dict, view: str) -> str:
    """The view as one self-contained HTML document (see the module's docstring)."""
    css = (STATIC / "views.css").read_text(encoding="utf-8")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>attnviz {escape(view)} view</title>
<style>body{{margin:0;font-family:system-ui,sans-serif}}{css}</style></head>
<body><div id="attnviz-root" class="attnviz-page"></div>
<script>
{script()}
const ATTNVIZ_STATE = {_script_json(state)};
const ATTNVIZ_FRAMES = {_script_json(frames)};
attnvizStandalone(document.getElementById("attnviz-root"), ATTNVIZ_STATE, ATTNVIZ_FRAMES);
</script></body></html>
"""


def iframe(doc: str, height: int = 720) -> str:
    """``doc`` shown through an iframe's ``srcdoc``: its script runs with no widget manager."""
    return (
        f'<iframe srcdoc="{escape(doc)}" style="width:100%;height:{height}px;border:1px solid #ddd" '
        'sandbox="allow-scripts" title="attnviz view"></iframe>'
    )


# ---------------------------------------------------------------------------------------------
# The frames a page embeds


def frame_key(kind: str, layer: int, head: int, contrast: str, words: bool) -> str:
    """How the page names a frame (views.js builds the same key)."""
    return f"{kind}|{layer}|{head}|{contrast}|{int(bool(words))}"


def head_frames(frames, source, state: dict, budget: int | None = None, grids: dict | None = None) -> dict:
    """The head view's frames for a page: every choice if they fit in ``budget`` (`PAGE_BUDGET`), else the
    fewest choices around the current one (this head under each contrast, then this head alone). Each frame
    counts at its own kind's and wording's size: a short target's cross-attention frames are small, but
    every encoder frame beside them is S x S. With the model view's ``grids``, only the kinds and contrasts
    that have their grid on the page: the page shows a head frame with its grid."""
    budget = PAGE_BUDGET if budget is None else budget
    kind, layer, head = state["kind"], state["layer"], state["head"]
    contrast, words = state["contrast"], state["words"]
    wordings = [False, True] if source.words is not None else [False]
    every = [
        (k, la, h, c, w)
        for k in source.kinds
        for la, h in product(range(1, source.shape(k)[0] + 1), range(1, source.shape(k)[1] + 1))
        for c in CONTRASTS
        for w in wordings
    ]
    shown = every if grids is None else [choice for choice in every if f"{choice[0]}|{choice[3]}" in grids]
    size = {(k, w): frames.frame_bytes(k, w) for k in source.kinds for w in wordings}
    this_head = [
        (kind, layer, head, c, w) for c in CONTRASTS for w in wordings if grids is None or f"{kind}|{c}" in grids
    ]
    if sum(size[k, w] for k, _, _, _, w in shown) <= budget:
        chosen = shown
    elif sum(size[k, w] for k, _, _, _, w in this_head) <= budget:
        chosen = this_head
    else:
        chosen = [(kind, layer, head, contrast, words)]
    table = {}
    for choice in chosen:
        frame = dict(frames.frame(*choice))
        frame.pop("rows"), frame.pop("cols")  # once per kind and wording, below
        table[frame_key(*choice)] = frame
    labels = {f"{k}|{int(w)}": frames.labels(k, w) for k in source.kinds for w in wordings}
    return {"head": table, "labels": labels, "complete": len(chosen) == len(every)}


def grid_frames(source, state: dict) -> dict:
    """The model view's thumbnails for a page: every kind under every contrast if they fit in `GRID_SHARE` of
    `PAGE_BUDGET`, else the current kind's and contrast's, then as many of the others as fit (this kind's other
    contrasts first). Sizes come from the shapes (`grid_bytes`): a grid left out is never computed."""
    from attnviz.notebook.frames import grid_bytes, grid_frame

    kind, contrast = state["kind"], state["contrast"]
    others = [(k, c) for k in sorted(source.kinds, key=lambda k: k != kind) for c in CONTRASTS]
    chosen, spent = [], 0
    for k, c in [(kind, contrast), *(pair for pair in others if pair != (kind, contrast))]:
        size = grid_bytes(source, k)
        if not chosen or spent + size <= GRID_SHARE * PAGE_BUDGET:
            chosen.append((k, c))
            spent += size
    return {f"{k}|{c}": grid_frame(source, k, c) for k, c in chosen}


# ---------------------------------------------------------------------------------------------
# Static pictures


def _indices(state: dict) -> tuple[np.ndarray, str, str]:
    """(palette indices, title, note) of what the view shows now."""
    view = state.get("view")
    if view in ("head", "model") and state.get("frame"):
        frame = state["frame"]
        if view == "model" and state.get("grid"):
            return _grid_picture(state), state["grid_info"]["grid_title"], frame["note"]
        h, w = frame["shape"]
        return np.frombuffer(state["indices"], dtype=np.uint8).reshape(h, w), frame["title"], frame["note"]
    if view == "step":
        spec = state["spec"]
        S, L, H, n = len(spec["src"]), spec["n_layers"], spec["n_heads"], spec["n_steps"]
        if S:
            rows = np.frombuffer(state["cross_rows"], dtype=np.float32).reshape(n, L, H, S)[:, L - 1, 0]
            what = f"cross-attention, layer {L}, head 1: one row per step, one column per source token"
        else:
            P = spec["prefix_len"]
            rows = np.frombuffer(state["self_rows"], dtype=np.float32).reshape(n, L, H, P)[:, L - 1, 0]
            what = f"decoder self-attention, layer {L}, head 1: one row per step, one column per position"
        indices = colour_indices(contrast_values(rows, "linear"))
        return indices, "decoding step by step", what
    raise InputError(f"the {view} view has no picture of its own")


def _grid_picture(state: dict) -> np.ndarray:
    from attnviz.figures.images import BACKGROUND_INDEX, grid_layout

    L, H, h, w = state["grid_info"]["grid_shape"]
    tiles = np.frombuffer(state["grid"], dtype=np.uint8).reshape(L, H, h, w)
    width, height, xs, ys = grid_layout(L, H, h, w)
    picture = np.full((height, width), BACKGROUND_INDEX, dtype=np.uint8)
    for layer in range(L):
        for head in range(H):
            picture[ys[layer] : ys[layer] + h, xs[head] : xs[head] + w] = tiles[layer, head]
    return picture


def _scaled(indices: np.ndarray) -> np.ndarray:
    scale = max(1, -(-MIN_PICTURE_PX // max(indices.shape)))
    return np.repeat(np.repeat(indices, scale, axis=0), scale, axis=1)


def _png(indices: np.ndarray) -> bytes:
    image = Image.fromarray(np.ascontiguousarray(indices, dtype=np.uint8), mode="P")
    image.putpalette(palette(WEIGHT_COLORSCALE).ravel().tolist())
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _atlas_png(state: dict) -> bytes:
    spec = state["spec"]
    kind = spec["kinds"][0]
    points, stat = spec["atlas"][kind], spec["statistics"][0]
    image = Image.new("RGB", (MIN_PICTURE_PX, MIN_PICTURE_PX), "white")
    draw = ImageDraw.Draw(image)
    x, y = np.array(points["x"]), np.array(points["y"])
    span = max(np.ptp(x), np.ptp(y)) or 1.0
    to_px = lambda v, lo: 20 + (v - lo) / span * (MIN_PICTURE_PX - 40)  # noqa: E731
    for xi, yi, colour in zip(x, y, points["statistics"][stat]["colours"], strict=True):
        px, py = to_px(xi, x.min()), MIN_PICTURE_PX - to_px(yi, y.min())
        draw.ellipse((px - 6, py - 6, px + 6, py + 6), fill=colour, outline="white")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def fallback_png(state: dict) -> bytes:
    """A PNG of what the view shows now: its map (scaled up, whole pixels a cell) or the atlas's map of heads."""
    if state.get("view") == "atlas":
        return _atlas_png(state)
    indices, _, _ = _indices(state)
    return _png(_scaled(indices))


def _top_weights(state: dict) -> str:
    """The strongest weights of the head view's map now, as an HTML table (exact maps only)."""
    frame = state.get("frame") or {}
    if state.get("view") not in ("head", "model") or frame.get("blocks") != [1, 1]:
        return ""
    h, w = frame["shape"]
    weights = np.frombuffer(state["weights"], dtype=frame["dtype"]).reshape(h, w).astype(np.float64)
    r0, _, c0, _ = frame["region"]
    order = np.argsort(weights, axis=None)[::-1][:TOP_WEIGHTS]
    rows = "".join(
        f"<tr><td>{r0 + i} {escape(frame['rows'][r0 + i])}</td><td>{c0 + j} {escape(frame['cols'][c0 + j])}</td>"
        f"<td>{weights[i, j]:.4f}</td></tr>"
        for i, j in zip(*np.unravel_index(order, weights.shape), strict=True)
    )
    return (
        f"<table><caption>strongest weights</caption><tr><th>{escape(frame['row_title'])}</th>"
        f"<th>{escape(frame['col_title'])}</th><th>weight</th></tr>{rows}</table>"
    )


def _atlas_table(state: dict) -> str:
    spec = state["spec"]
    points = spec["atlas"][spec["kinds"][0]]
    stats = spec["statistics"][:4]
    head = "".join(f"<th>{escape(spec['labels'][s])}</th>" for s in stats)

    def cell(value) -> str:
        return "<td></td>" if value is None else f"<td>{value:.3f}</td>"

    body = "".join(
        f"<tr><td>{la}</td><td>{h}</td>" + "".join(cell(points["statistics"][s]["values"][i]) for s in stats) + "</tr>"
        for i, (la, h) in enumerate(zip(points["layer"], points["head"], strict=True))
    )
    return f"<table><tr><th>layer</th><th>head</th>{head}</tr>{body}</table>"


def fallback_html(state: dict) -> str:
    """The static fallback as HTML with no script: the picture, its title and note, and its numbers."""
    png = base64.b64encode(fallback_png(state)).decode("ascii")
    if state.get("view") == "atlas":
        spec = state["spec"]
        title = f"head atlas: {spec['titles'][spec['kinds'][0]]}, {spec['sentences']} sentences"
        note, numbers = f"coloured by {spec['labels'][spec['statistics'][0]]}", _atlas_table(state)
    else:
        _, title, note = _indices(state)
        numbers = _top_weights(state)
        if state.get("view") == "step":
            spec = state["spec"]
            numbers = (
                "<p>"
                + " ".join(f"{escape(t)} ({p:.2f})" for t, p in zip(spec["written"], spec["prob"], strict=True))
                + "</p>"
            )
    still = escape(state.get("still_id", ""))  # the view's script hides this picture once it draws
    return (
        f'<div class="attnviz-fallback" data-attnviz-still="{still}" style="font-family:system-ui,sans-serif;'
        'font-size:13px">'
        f"<b>attnviz: {escape(title)}</b><br><small>{escape(note)} (a still picture: run the cell for the view)</small>"
        f'<br><img alt="{escape(title)}" style="image-rendering:pixelated;max-width:100%" '
        f'src="data:image/png;base64,{png}">{numbers}</div>'
    )


# ---------------------------------------------------------------------------------------------
# SVG


def svg(state: dict) -> str:
    """The head view's map now as an SVG document: one rectangle per cell (an embedded image past
    `SVG_CELLS` cells), the tokens along both axes, the title, and the colour bar."""
    if state.get("view") not in ("head", "model") or not state.get("frame"):
        raise InputError(f"an SVG is made of the head view's map; the {state.get('view')} view saves as .html")
    frame = state["frame"]
    h, w = frame["shape"]
    indices = np.frombuffer(state["indices"], dtype=np.uint8).reshape(h, w)
    colours = ["#{:02x}{:02x}{:02x}".format(*c) for c in palette(WEIGHT_COLORSCALE)]
    r0, r1, c0, c1 = frame["region"]
    exact = frame["blocks"] == [1, 1]
    cell = max(4, min(24, 640 // max(h, w)))
    left, top = 180, 160
    width, height = left + w * cell + 120, top + h * cell + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        f'font-size="{min(12, cell)}">',
        f'<text x="4" y="18" font-size="15" font-weight="bold">{escape(frame["title"])}</text>',
        f'<text x="4" y="36" font-size="11">{escape(frame["note"])}</text>',
    ]
    if h * w <= SVG_CELLS:
        for i in range(h):
            for j in range(w):
                out.append(
                    f'<rect x="{left + j * cell}" y="{top + i * cell}" width="{cell}" height="{cell}" '
                    f'fill="{colours[indices[i, j]]}"/>'
                )
    else:
        png = base64.b64encode(_png(indices)).decode("ascii")
        out.append(
            f'<image x="{left}" y="{top}" width="{w * cell}" height="{h * cell}" preserveAspectRatio="none" '
            f'style="image-rendering:pixelated" href="data:image/png;base64,{png}"/>'
        )
    if exact and max(h, w) <= 128:
        for i in range(h):
            out.append(
                f'<text x="{left - 4}" y="{top + i * cell + cell * 0.75}" text-anchor="end">'
                f"{escape(frame['rows'][r0 + i])}</text>"
            )
        for j in range(w):
            x, y = left + j * cell + cell * 0.75, top - 4
            out.append(f'<text transform="translate({x},{y}) rotate(-90)">{escape(frame["cols"][c0 + j])}</text>')
    out.append(
        f'<text x="{left}" y="{height - 12}">{escape(frame["row_title"])} (rows) by '
        f"{escape(frame['col_title'])} (columns)</text>"
    )
    bar_x = left + w * cell + 30
    for k in range(LEVELS):
        y = top + (LEVELS - 1 - k) * 200 / LEVELS
        out.append(f'<rect x="{bar_x}" y="{y:.2f}" width="14" height="{200 / LEVELS + 0.5:.2f}" fill="{colours[k]}"/>')
    bar = frame["bar"]
    for value, text in zip(bar["tickvals"], bar["ticktext"], strict=True):
        y = top + (1 - value) * 200
        out.append(f'<text x="{bar_x + 18}" y="{y + 4:.1f}" font-size="10">{escape(str(text))}</text>')
    out.append(f'<text x="{bar_x}" y="{top - 8}" font-size="10">{escape(bar["title"]["text"])}</text>')
    out.append("</svg>")
    return "\n".join(out)
