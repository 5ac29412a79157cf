"""What every figure shares: colours, tick labels, input checks and the export button's settings.

Figure builders take plain data (numpy arrays, token lists) and return a plotly figure; they never
call Streamlit. Axes always say which side is the query and which the key, and every tick label is
prefixed with its position so that repeated tokens never merge into one tick. Tokens are
HTML-escaped before plotly sees them: plotly reads ``<s>`` as its strike-through tag, so the start
and end tokens ``<s>`` and ``</s>`` would otherwise vanish from the labels.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from attnviz.kinds import TITLES, axis_names, shown_token

WEIGHT_COLORSCALE = "Blues"
SCORE_COLORSCALE = "RdBu_r"  # diverging: negative blue, 0 white, positive red
MASKED_GREY = "#bdbdbd"  # darker than Blues' white zero and RdBu's white midpoint
HEAD_COLORS = qualitative.Dark24  # a head keeps its colour whichever heads are shown
HIGHLIGHT = "#d62728"
# Above this many tokens an axis labels every n-th position only; the data stay exact.
MAX_TICK_LABELS = 80
TICK_FONT = {"size": 14, "color": "#1a1a1a"}  # token labels: dark, and larger than plotly's 12 px grey
# Key labels on top lie flat when plotly finds they fit side by side, else rise at 60 degrees (the
# figures' top margin is sized for that, so a title never meets them).
KEY_ANGLES = [0, -60]
TITLE_PX, SUBTITLE_PX, AXIS_TITLE_PX = 44, 22, 28  # the bands a title, its subtitle and an axis title take
# A legend under a chart: at the figure's foot, which plotly lays out under the axis title at any
# width. One placed in the plot's own units (y = -0.2) sat on the axis title, and, hung by its bottom,
# moved onto the tick labels when a resize changed its rows (tests/test_browser_formation.py).
FOOT_LEGEND = {"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom", "x": 0, "xanchor": "left"}
# A map's colour bar at the plot's right edge, not plotly's 2% of the plot's width beyond it: the margin
# it takes is then the same at every width, and the app can give it that margin before plotly draws
# (attnviz.app.margins).
AT_THE_EDGE = {"x": 1}

# A phone's layout (``narrow``: a window under about 640 px, about 330 to 400 px for the figure).
# Token labels are cut to a few characters (the whole label stays on hover) so that the map keeps
# most of the width; key labels stand upright, one in every n beyond NARROW_KEY_LABELS, so that
# each has the width of its column; a title wraps, and starts below plotly's toolbar, which
# floats over the figure's top right corner.
NARROW_TICK_FONT = {**TICK_FONT, "size": 12}
NARROW_CHAR_PX = 7.5  # about that many px a character at NARROW_TICK_FONT's 12 px
NARROW_ROW_CHARS, NARROW_KEY_CHARS = 8, 6
NARROW_KEY_LABELS = 12  # a map about 220 px wide: 18 px a label, about one line of 12 px text
NARROW_TITLE_CHARS = 34  # a title of 17 px breaks into lines of at most this many characters
MODEBAR_PX = 36  # plotly's toolbar: 24 px buttons 2 px from the figure's top, and a gap

# How wide a title is drawn, to break it into lines that fit its chart (`fitted_lines`): the advance
# widths of Source Sans, the font Streamlit gives plotly, in em, measured in chromium's canvas, in a
# few classes. Plotly's SVG titles came out about 6% wider than the canvas's widths: against 57 drawn
# titles and subtitles, `text_px` is 2-11% over. Other characters count as wide as the widest letter.
_EM = {
    ch: em
    for em, chars in (
        (0.21, " "),
        (0.30, "ij|',.:;l·’I!f"),
        (0.36, "()[]{}-t/\\r"),
        (0.51, '*?sz"xcvyJY–L0123456789#$+<=>F^_ek~−×é'),
        (0.60, "agVXESTAZ`houübdnpqCPRKß"),
        (0.70, "B&DG→NUHOQΩ"),
        (0.87, "ωwM▁W—%m@"),
    )
    for ch in chars
}
OTHER_EM = 1.03
_TAG = re.compile(r"<[^>]*>")
_BREAK = re.compile(r" (?![^<]*>)")  # a space outside plotly's tags (<b>, <span style="...">)


def position_labels(tokens: Sequence[str], start: int = 0) -> list[str]:
    """'3 ▁the': unique tick labels even when a token repeats; positions count from ``start``."""
    return [f"{i} {shown_token(t)}" for i, t in enumerate(tokens, start)]


def plotly_labels(tokens: Sequence[str], start: int = 0) -> list[str]:
    """Position labels escaped for plotly's HTML-like text: '0 &lt;s&gt;' displays as '0 <s>'."""
    return [html.escape(label, quote=False) for label in position_labels(tokens, start)]


def label_text(label: str) -> str:
    """The token of a position label, without its position: '3 ▁the' gives '▁the'."""
    return label.split(" ", 1)[1] if " " in label else label


def kind_titles(kind: str) -> tuple[str, str, str]:
    """(title, query axis title, key axis title) of a map of ``kind``, e.g. "query: source token"."""
    query, key = axis_names(kind, "token")  # a ValueError naming the kinds for an unknown kind
    return TITLES[kind], query, key


def as_array(data, what: str, ndim: int) -> np.ndarray:
    """``data`` (numpy, nested lists, or a torch tensor on any device) as float32 numpy with ``ndim`` axes.

    float32 is what the model produces, and half the bytes of float64 in the figure's JSON.
    """
    if hasattr(data, "detach"):  # a torch tensor: no torch import needed here
        data = data.detach().float().cpu().numpy()
    array = np.asarray(data, dtype=np.float32)
    if array.ndim != ndim:
        raise ValueError(f"{what} must have {ndim} axes, got shape {array.shape}")
    return array


def check_tokens(n: int, tokens: Sequence[str], axis: str) -> None:
    if n != len(tokens):
        raise ValueError(f"the maps have {n} {axis} positions but {len(tokens)} {axis} tokens were given")


def check_mask(mask, Q: int, K: int) -> np.ndarray | None:
    """``mask`` (Q, K, True = may attend) as a bool array, or None; one flag per cell or a ValueError."""
    if mask is None:
        return None
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (Q, K):
        raise ValueError(f"mask is {mask.shape} but the weights are {(Q, K)}; pass one flag per cell")
    return mask


MAX_TICK_CHARS = 40  # a tick label shows at most this many characters: a 10,000-letter word is one token too


def ticks(labels: list[str], tokens: bool = False, most: int = MAX_TICK_LABELS, chars: int | None = None) -> dict:
    """Axis settings that label every position, or every n-th one beyond ``most`` labels.

    With ``tokens`` the labels are position labels (`plotly_labels`): the categories keep the
    position, so that repeated tokens stay apart and hover names the position, but when every
    position is labelled the tick shows the token alone ("4 2" read as two numbers). A tick shows at
    most `MAX_TICK_CHARS` characters, and with ``chars`` (a phone's layout) at most that many, in
    `NARROW_TICK_FONT`; the hover keeps the whole label.
    """
    step = max(1, math.ceil(len(labels) / most))
    shown = labels[::step]
    text = [label_text(label) for label in shown] if tokens and step == 1 else shown
    text = [shortened(label, min(chars or MAX_TICK_CHARS, MAX_TICK_CHARS)) for label in text]
    settings = {"type": "category", "tickmode": "array", "tickvals": shown, "ticktext": text}
    font = TICK_FONT if chars is None else NARROW_TICK_FONT
    return {**settings, "tickfont": font} if tokens else settings


ROW_LABEL_PITCH = 1.4  # a row label needs about 1.4 times its font size of height to stand clear of the next


def rows_that_fit(plot_px: float, font_px: float = TICK_FONT["size"], pitch: float = ROW_LABEL_PITCH) -> int:
    """How many row labels of ``font_px`` fit one above the other in ``plot_px`` without touching (at least 2),
    each taking ``pitch`` times its font size.

    A map's rows get the figure's height less its margins; beyond this many, `ticks` labels every
    n-th row, so that the labels of a long map never pile on top of each other.
    """
    return max(2, int(plot_px // (font_px * pitch)))


def shortened(label: str, chars: int) -> str:
    """``label`` (escaped for plotly) cut to at most ``chars`` characters as shown, "…" marking the cut."""
    text = html.unescape(label)
    return label if len(text) <= chars else html.escape(text[: chars - 1] + "…", quote=False)


def wrapped(title: str, chars: int = NARROW_TITLE_CHARS) -> str:
    """``title`` broken at spaces into lines of at most ``chars`` characters where it can ("<br>" between)."""
    return "<br>".join(_filled(title.split(" "), lambda line: len(line) <= chars))


def drawn_text(text: str) -> str:
    """The characters plotly draws for ``text``, its HTML-like text: tags left out, entities read."""
    return html.unescape(_TAG.sub("", text))


def text_px(text: str, font_px: float) -> float:
    """About how wide plotly draws one line of ``text`` (its HTML-like text) at ``font_px`` in Streamlit's
    font: a little over rather than under."""
    return font_px * sum(_EM.get(ch, OTHER_EM) for ch in drawn_text(text))


def fitted_lines(text: str, px: float, font_px: float) -> str:
    """``text`` with each of its lines ("<br>" apart) broken at spaces into lines at most ``px`` wide at
    ``font_px`` (`text_px`), where it can: a word wider than ``px`` keeps a line of its own. A line is
    broken into as few lines as fit, as even as they can be: no last word left alone on a line."""

    def within(width: float) -> Callable[[str], bool]:
        return lambda line: text_px(line, font_px) <= width

    lines: list[str] = []
    for line in text.split("<br>"):
        words = _BREAK.split(line)
        most = len(_filled(words, within(px)))
        low, high = 0.0, px  # the narrowest width that still takes no more lines, to a pixel
        while high - low > 1:
            mid = (low + high) / 2
            low, high = (low, mid) if len(_filled(words, within(mid))) <= most else (mid, high)
        lines += _filled(words, within(high))
    return "<br>".join(lines)


def _filled(words: list[str], fits: Callable[[str], bool]) -> list[str]:
    """``words`` put in lines one after another, each line as full as ``fits`` allows."""
    lines: list[str] = []
    for word in words:
        if lines and fits(lines[-1] + " " + word):
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def title_band_px(title: str | None, subtitle: bool = False, narrow: bool = False) -> int:
    """The height a figure's ``title`` takes at its top: its band and a ``subtitle``'s, and with ``narrow``
    (a phone) each further line the title was wrapped into (`wrapped`) and plotly's toolbar above it."""
    px = TITLE_PX + (SUBTITLE_PX if subtitle else 0)
    if narrow:
        px += SUBTITLE_PX * (title or "").count("<br>") + MODEBAR_PX
    return px


def above_top_labels(
    title: str | None, labels: Sequence[str], angle: float = 60.0, subtitle: str | None = None, narrow: bool = False
) -> dict:
    """Layout for a figure whose key labels sit on top, rotated by ``angle``: its title and top margin.

    The title (and ``subtitle``) go to the top of the figure, and the margin below them is sized for
    the longest label (rotated) and the axis title, so that a long first token never runs into the
    title. (Plotly sizes the margin for the labels or for the title, whichever needs more, not both.)
    With ``narrow`` (a phone) the labels are at most `NARROW_KEY_CHARS` characters of 12 px, and the
    title wraps and starts below plotly's toolbar.
    """
    longest = max((len(html.unescape(label)) for label in labels), default=0)
    if narrow:
        label_px = max(min(longest, NARROW_KEY_CHARS) * NARROW_CHAR_PX * math.sin(math.radians(angle)), 8) + 14
        title = wrapped(title) if title else title
    else:  # about 8.5 px a character at TICK_FONT's 14 px; a flat label needs one line
        label_px = max(min(longest, 48) * 8.5 * math.sin(math.radians(angle)), 8) + 14
    title_px = title_band_px(title, bool(subtitle), narrow)
    top = MODEBAR_PX if narrow else 0
    heading = {"text": title, "y": 1.0, "yref": "container", "yanchor": "top", "pad": {"t": 12 + top}}
    if subtitle:
        heading["subtitle"] = {"text": subtitle}
    return {
        "title": heading,
        "margin": {"l": 10, "r": 10, "t": round(title_px + AXIS_TITLE_PX + label_px), "b": 10},
    }


def vertical_line(x: float, text: str, line: dict) -> tuple[dict, dict]:
    """A line up the whole plot at ``x`` and its label at the top, right of the line: the shape and the
    annotation plotly's ``add_vline(x, annotation_text=text)`` writes, for a layout made whole."""
    where = {"xref": "x", "yref": "y domain"}
    shape = {"type": "line", "x0": x, "x1": x, "y0": 0, "y1": 1, "line": line, **where}
    note = {"text": text, "showarrow": False, "x": x, "y": 1, "xanchor": "left", "yanchor": "top", **where}
    return shape, note


def copied_spec(fig) -> tuple[list[dict], dict]:
    """A figure's traces and layout as plain dicts (a deep copy), to change and make a new figure of in
    one go: ``go.Figure(data=traces, layout=layout)``. Plotly's updates on a figure (update_layout,
    add_shape, ...) check every key path and lay the figure out anew, each taking milliseconds.

    The layout leaves out the template plotly puts in every figure: the new figure takes plotly's
    default again, as attnviz's figures all do, where handing the template over would check its
    hundreds of keys once more (about 10 ms). Not ``fig.to_dict()``: that writes numpy arrays as
    base64 text, which the new figure would then hold in place of its arrays.
    """
    layout = fig.layout.to_plotly_json()
    layout.pop("template", None)
    return [trace.to_plotly_json() for trace in fig.data], layout


def remade(data: list[dict], layout: dict) -> go.Figure:
    """The figure of a `copied_spec` after changes, made without plotly's validators.

    Every value in it came from a figure plotly had already checked, or is one attnviz sets itself
    (fonts, sizes, titles, shapes), which tests compare with what plotly's own updates make
    (``tests/test_room_figures.py``). Checking them all again was most of a room's copy: a chart of 36
    lines took 11 ms to make checked and 2.6 ms so (2-core AMD EPYC, Zen 4).
    """
    return go.Figure(data=data, layout=layout, _validate=False)


def export_config(filename: str, fmt: str) -> dict:
    """The plotly ``config`` for ``st.plotly_chart`` whose camera button downloads ``filename``.``fmt``.

    The browser renders the image, so PNG and SVG need no Chrome on the server. ``fmt`` is "png"
    (drawn at twice the on-screen size) or "svg".
    """
    if fmt not in ("png", "svg"):
        raise ValueError(f"fmt must be 'png' or 'svg', got {fmt!r}")
    stem = filename.rsplit("/", 1)[-1].rsplit("\\", 1)[-1]
    if stem.lower().endswith("." + fmt):  # plotly appends the extension itself
        stem = stem[: -len(fmt) - 1]
    if not stem:
        raise ValueError(f"filename must name a file, got {filename!r}")
    options = {"format": fmt, "filename": stem}
    if fmt == "png":
        options["scale"] = 2
    return {"toImageButtonOptions": options, "displaylogo": False}
