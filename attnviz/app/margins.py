"""Side margins that already hold a map's row labels and colour bar, so that plotly draws it once.

Streamlit's plotly theme turns on ``automargin`` for every axis, and a colour bar always pushes the
margin it needs. The maps ask for 10 px at each side: plotly draws the map, measures its row labels,
its axis title and its colour bar, finds they need more (173 px at the left of a map of en-de's
tokens, 95 at the right), widens the margins and draws the whole figure again. That second draw was
a seventh to a fifth of the browser's time for each chart a rerun changes (docs/suite-time.md,
twenty-fifth session), on every visitor's screen. A margin at least as wide as a push leaves
plotly's layout as it is, and no second draw follows: `settled` gives a map those margins, from
the width of its labels in the theme's font.

Only what is measured here is estimated: a heatmap's rows on the left (a category axis with its
labels listed, as `attnviz.figures.common.ticks` makes them) and a vertical colour bar at the plot's
right edge whose labels are listed, under the theme's sizes. Any other figure keeps its margins, and
plotly widens them as before. An estimate that falls short costs what it cost before, the second
draw; one that is over leaves a few pixels more beside the labels (tests/test_browser_clicks.py
measures both against plotly's own pushes on every page, after every click).
"""

from __future__ import annotations

import math
import re

from attnviz.figures.common import drawn_text

# Advance widths of Streamlit's font ("Source Sans", weight 400), in ems, as chromium draws them
# (measured between two "H"s at 1000 px, so that kerning with a neighbour counts): ASCII, Latin-1 and
# Latin Extended-A (GPT-2's byte pieces, Ġ and Ċ, are there), Greek, punctuation, arrows, the marks
# tokens are shown with (␣, ▁) and some of mathematics; a character the font lacks, as the fallback
# font of the machine that measured drew it. A label's width is the sum over its characters, and
# `LABEL_OVER` more: the box plotly measures a label by was up to 1.5% wider than the sum.
_RANGES = (
    (0x20, 0x7E), (0xA1, 0xFF), (0x100, 0x17F), (0x391, 0x3A9), (0x3B1, 0x3C9), (0x2010, 0x2026),
    (0x2030, 0x203A), (0x2190, 0x2199),
)  # fmt: skip
_MORE = "↵⏎␣▁−√∞≈≠≤≥∑∏∈∂∆∇∫"
_MILLI_EM = (
    200, 289, 426, 497, 497, 824, 609, 249, 303, 303, 418, 497, 249, 311, 249, 350, 497, 497, 497, 497, 497,
    497, 497, 497, 497, 497, 249, 249, 497, 497, 497, 425, 847, 543, 588, 571, 615, 527, 494, 617, 652, 263,
    479, 579, 486, 727, 647, 664, 566, 664, 569, 534, 536, 645, 515, 786, 513, 476, 539, 303, 350, 303, 497,
    500, 542, 504, 553, 456, 555, 496, 292, 504, 544, 246, 247, 495, 255, 829, 547, 542, 555, 555, 347, 419,
    338, 544, 467, 719, 446, 467, 425, 303, 241, 303, 497, 289, 497, 497, 497, 497, 241, 497, 542, 744, 345,
    429, 497, 0, 423, 542, 331, 497, 367, 367, 542, 562, 560, 249, 542, 367, 365, 429, 781, 808, 796, 425, 544,
    544, 544, 544, 544, 544, 822, 571, 527, 527, 527, 527, 263, 263, 263, 263, 639, 647, 664, 664, 664, 664,
    664, 497, 664, 645, 645, 645, 645, 476, 583, 576, 504, 504, 504, 504, 504, 504, 778, 456, 496, 496, 496,
    496, 246, 246, 246, 246, 544, 547, 542, 542, 542, 542, 542, 497, 542, 544, 544, 544, 544, 467, 555, 467,
    544, 504, 544, 504, 544, 504, 571, 456, 571, 456, 571, 456, 571, 456, 615, 573, 635, 562, 527, 496, 527,
    496, 527, 496, 527, 496, 527, 496, 617, 504, 617, 504, 617, 504, 617, 504, 652, 544, 692, 557, 263, 246,
    263, 246, 263, 246, 263, 246, 263, 247, 526, 493, 480, 247, 579, 495, 495, 486, 255, 486, 255, 486, 265,
    486, 362, 500, 298, 647, 547, 647, 547, 647, 547, 769, 635, 547, 664, 542, 664, 542, 664, 542, 847, 839,
    569, 347, 569, 347, 569, 347, 534, 419, 534, 419, 534, 419, 534, 419, 536, 338, 536, 338, 536, 338, 645,
    544, 645, 544, 645, 544, 645, 544, 645, 544, 645, 544, 786, 718, 476, 467, 476, 539, 425, 539, 425, 539,
    425, 271, 544, 588, 498, 588, 527, 539, 652, 664, 263, 579, 515, 727, 647, 533, 664, 645, 566, 653, 538,
    536, 476, 719, 513, 699, 678, 560, 565, 484, 531, 448, 424, 541, 522, 262, 494, 494, 562, 474, 431, 535,
    586, 549, 432, 546, 458, 510, 680, 481, 689, 701, 311, 311, 497, 480, 800, 800, 391, 500, 249, 249, 249,
    249, 426, 426, 426, 518, 454, 454, 304, 304, 334, 667, 948, 1194, 1564, 249, 426, 520, 249, 374, 520, 339,
    271, 271, 619, 619, 619, 619, 619, 619, 619, 619, 619, 619, 838, 838, 635, 769, 497, 557, 782, 497, 497,
    497, 497, 504, 673, 871, 528, 588, 669, 355,
)  # fmt: skip
_SHOWN = [chr(code) for first, last in _RANGES for code in range(first, last + 1)] + list(_MORE)
_EM = dict(zip(_SHOWN, (milli / 1000 for milli in _MILLI_EM), strict=True))
# A character the font lacks is drawn in another font, which differs from machine to machine: CJK
# takes an em, an emoji a little more. Counted wide: too wide costs a few pixels, too narrow a redraw.
OTHER_EM = 1.25
LABEL_OVER = 1.015
_BR = re.compile(r"<br\s*/?>")

# Streamlit's plotly theme (its PlotlyChart, Streamlit 1.67): tick labels 12 px, axis titles 14 px
# set 24 px off the labels (``title.standoff``), and the plot 8 px in from its axes (``margin.pad``).
THEME_TICK_PX, THEME_AXIS_TITLE_PX, THEME_STANDOFF_PX = 12, 14, 24
# Plotly.js's title depth where a standoff is set: CAP_SHIFT of the font, and LINE_SPACING a line more.
CAP_SHIFT, LINE_SPACING = 0.7, 1.3
# From the axis to the far edge of its row labels, beyond the widest label: measured in chromium as
# plotly's own push less the label and the title, at 12, 14 and 18 px (26.4, 26.8, 27.6 px).
ROW_LABEL_GAP_PX, ROW_LABEL_GAP_EM = 24.0, 0.2
# A vertical colour bar at the plot's edge, its default 30 px thick with 10 px of padding, pushes the
# right margin by its labels' width and 61 px (the bar, its padding and the gap to the labels), or by
# its title's width on top and 29.6 px, whichever is more (measured likewise, 12 to 20 px).
BAR_PX, BAR_TITLE_PX = 61.0, 29.6
# A push within 1 px of the margin is no change to plotly (its didMarginChange); each estimate is
# rounded up and given this much more.
SLACK_PX = 2


def label_px(text: str, font_px: float) -> float:
    """How wide plotly draws one line of ``text`` (its HTML-like text: tags and entities as drawn) at
    ``font_px`` in Streamlit's font; a character outside the measured ones counts `OTHER_EM`."""
    return LABEL_OVER * font_px * sum(_EM.get(ch, OTHER_EM) for ch in drawn_text(text))


def _lines_px(text: str, font_px: float) -> float:
    """The widest of ``text``'s lines ("<br>" apart) at ``font_px``."""
    return max(label_px(line, font_px) for line in _BR.split(text))


# What a figure may set itself that moves its labels or its colour bar from where they were measured.
_OWN_AXIS = {
    "side", "ticks", "ticklen", "ticklabelstandoff", "ticklabelposition", "ticklabelshift", "tickangle",
    "showticklabels", "visible", "automargin", "mirror", "showline", "anchor", "position", "shift",
}  # fmt: skip
_OWN_BAR = {
    "orientation", "thickness", "thicknessmode", "xpad", "xanchor", "xref", "outlinewidth", "borderwidth",
    "ticks", "ticklen", "ticklabelposition", "showticklabels", "exponentformat",
}  # fmt: skip


def _left(yaxis: dict) -> float | None:
    """The left margin the rows of a category axis with listed labels push, or None for another axis."""
    if yaxis.get("type") != "category" or yaxis.get("ticktext") is None or _OWN_AXIS & yaxis.keys():
        return None
    font = (yaxis.get("tickfont") or {}).get("size") or THEME_TICK_PX
    labels = [str(label) for label in yaxis["ticktext"]]
    widest = max((label_px(label, font) for label in labels), default=0.0)
    push = widest + ROW_LABEL_GAP_PX + ROW_LABEL_GAP_EM * font
    title = yaxis.get("title") or {}  # plotly's figures hold every title as a dict
    text = title.get("text")
    if text:
        if "standoff" in title:
            return None
        size = (title.get("font") or {}).get("size") or THEME_AXIS_TITLE_PX
        extra_lines = len(_BR.findall(text))
        push += size * (CAP_SHIFT + extra_lines * LINE_SPACING) + THEME_STANDOFF_PX
    return push


def _right(trace: dict) -> float | None:
    """The right margin a heatmap's colour bar pushes, placed at the plot's edge (``x=1``), or None."""
    bar = trace.get("colorbar") or {}
    if bar.get("x") != 1 or bar.get("ticktext") is None or _OWN_BAR & bar.keys():
        return None
    font = (bar.get("tickfont") or {}).get("size") or THEME_TICK_PX
    push = max((label_px(str(label), font) for label in bar["ticktext"]), default=0.0) + BAR_PX
    title = bar.get("title") or {}
    text = title.get("text")
    if text:
        if title.get("side", "top") != "top":
            return None
        size = (title.get("font") or {}).get("size") or THEME_AXIS_TITLE_PX
        push = max(push, _lines_px(text, size) + BAR_TITLE_PX)
    return push


def _beyond(xaxis: dict, left: float, right: float) -> bool:
    """Whether the first or last key label, centred on its column (flat) or rising from it at an angle,
    could reach further out than the margins on its side: half its width and its font size (a rising
    label's height, turned). Plotly would widen that margin: such a map keeps its margins."""
    labels = xaxis.get("ticktext")
    if not labels:
        return False
    font = (xaxis.get("tickfont") or {}).get("size") or THEME_TICK_PX
    reach = [label_px(str(label), font) / 2 + font for label in (labels[0], labels[-1])]
    return reach[0] > left or reach[1] > right


def settled(data: list[dict], layout: dict) -> dict | None:
    """The side margins (``{"l": ..., "r": ...}``) that hold the rows and the colour bar of a map given
    as plain dicts (`attnviz.figures.common.copied_spec`), under Streamlit's theme: a figure of one
    heatmap that shows its scale, on one pair of axes, with the plot's padding left to the theme.
    None for any other figure, or one whose margins are already as wide."""
    heatmaps = [trace for trace in data if trace.get("type") == "heatmap"]
    scales = [trace for trace in heatmaps if trace.get("showscale") is not False]
    if len(heatmaps) != len(data) or len(scales) != 1 or any(key in layout for key in ("xaxis2", "yaxis2")):
        return None
    margin = layout.get("margin") or {}
    if "pad" in margin or (layout.get("legend") and layout.get("showlegend")):
        return None
    left, right = _left(layout.get("yaxis") or {}), _right(scales[0])
    if left is None or right is None or _beyond(layout.get("xaxis") or {}, left, right):
        return None
    wanted = {"l": math.ceil(left) + SLACK_PX, "r": math.ceil(right) + SLACK_PX}
    if all((margin.get(side) or 0) >= px for side, px in wanted.items()):
        return None
    return {side: max(px, margin.get(side) or 0) for side, px in wanted.items()}
