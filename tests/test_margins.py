"""attnviz.app.margins: the side margins a map's rows and colour bar need, so plotly draws it once.

What the estimates are measured against, plotly's own pushes in a real browser, is checked on every
page and after every click in tests/test_browser_clicks.py; here, the rules: which figures get
margins, that margins only grow, and the label widths chromium drew.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnviz.app import margins
from attnviz.app.present import _fitted
from attnviz.figures.attention import attention_heatmap
from attnviz.figures.common import copied_spec

TOKENS = ["<s>", "▁Donnerstag", "▁the", "</s>"]


def _map(**kwargs):
    weights = np.full((len(TOKENS), len(TOKENS)), 1 / len(TOKENS))
    return attention_heatmap(weights, TOKENS, TOKENS, "cross", **kwargs)


# One line of text as chromium drew it in Streamlit's font (getBoundingClientRect of plotly's labels:
# the explorer's row labels and colour bar, a layer grid's rows), in px.
DRAWN = [
    ("&lt;s&gt; → ▁Donnerstag", 14, 112.2),
    ("zwanzig → &lt;/s&gt;", 14, 86.0),
    ("▁thousand", 14, 67.7),
    ("layer 1 head 1", 12, 69.0),
    ("4 → &lt;/s&gt;", 14, 46.0),
    ("0.75", 12, 20.9),
    ("weight", 20, 57.1),
]


@pytest.mark.parametrize(("text", "font_px", "drawn"), DRAWN)
def test_a_label_is_as_wide_as_chromium_drew_it_or_up_to_2_percent_wider(text, font_px, drawn):
    estimate = margins.label_px(text, font_px)
    assert drawn - 0.1 <= estimate <= drawn * 1.02 + 0.1


def test_a_character_outside_the_font_counts_wide():
    assert margins.label_px("中", 14) == pytest.approx(margins.LABEL_OVER * margins.OTHER_EM * 14)
    assert margins.label_px("中", 14) > margins.label_px("M", 14)


def test_a_maps_sides_hold_its_widest_row_label_its_axis_title_and_its_colour_bar():
    data, layout = copied_spec(_map())
    sides = margins.settled(data, layout)
    widest = max(margins.label_px(label, 14) for label in layout["yaxis"]["ticktext"])
    assert widest == margins.label_px("▁Donnerstag", 14)
    title = 14 * margins.CAP_SHIFT + margins.THEME_STANDOFF_PX
    gap = margins.ROW_LABEL_GAP_PX + margins.ROW_LABEL_GAP_EM * 14
    assert sides["l"] - margins.SLACK_PX - 1 < widest + gap + title <= sides["l"] - margins.SLACK_PX
    bar = margins.label_px("0.75", margins.THEME_TICK_PX) + margins.BAR_PX
    assert sides["r"] - margins.SLACK_PX - 1 < bar <= sides["r"] - margins.SLACK_PX


def test_a_longer_row_label_or_a_two_line_axis_title_widens_the_left_only():
    data, layout = copied_spec(_map())
    base = margins.settled(data, layout)
    layout["yaxis"]["ticktext"] = [*layout["yaxis"]["ticktext"][:-1], "a much longer row label than any"]
    longer = margins.settled(data, layout)
    assert longer["l"] > base["l"] and longer["r"] == base["r"]
    layout["yaxis"]["title"] = {"text": "query:<br>decoder input token", "font": {"size": 20}}
    two_lines = margins.settled(data, layout)
    added = 20 * (margins.CAP_SHIFT + margins.LINE_SPACING) - 14 * margins.CAP_SHIFT
    assert two_lines["l"] - longer["l"] == pytest.approx(added, abs=1)


def test_a_long_colour_bar_title_widens_the_right():
    data, layout = copied_spec(_map())
    base = margins.settled(data, layout)
    data[0]["colorbar"]["title"] = {"text": "weight<br>÷ its row's largest weight"}
    assert margins.settled(data, layout)["r"] > base["r"]


def test_margins_only_grow():
    data, layout = copied_spec(_map())
    sides = margins.settled(data, layout)
    layout["margin"] |= {"l": sides["l"] + 50, "r": 5}
    assert margins.settled(data, layout) == {"l": sides["l"] + 50, "r": sides["r"]}
    layout["margin"] |= {"r": sides["r"] + 9}
    assert margins.settled(data, layout) is None  # both already as wide: the figure stays as it is


@pytest.mark.parametrize(
    "change",
    [
        "a second heatmap with its own scale",
        "a line over the map",
        "a colour bar 2% of the plot's width beyond it",
        "a colour bar of numbers plotly chooses",
        "a colour bar title at its side",
        "a colour bar of its own thickness",
        "numeric rows",
        "rows whose labels plotly chooses",
        "rows with ticks of their own",
        "an axis title with a standoff of its own",
        "padding of its own",
        "a second y axis",
        "a legend",
        "a first key label reaching past the left margin",
        "a last key label reaching past the right margin",
    ],
)
def test_a_figure_outside_what_was_measured_keeps_its_margins(change):
    data, layout = copied_spec(_map())
    bar, rows = data[0]["colorbar"], layout["yaxis"]
    if change == "a second heatmap with its own scale":
        data.append({**data[0]})
    elif change == "a line over the map":
        data.append({"type": "scatter", "x": [0, 1], "y": [0, 1]})
    elif change == "a colour bar 2% of the plot's width beyond it":
        bar.pop("x")
    elif change == "a colour bar of numbers plotly chooses":
        bar.pop("ticktext")
    elif change == "a colour bar title at its side":
        bar["title"] = {"text": "weight", "side": "right"}
    elif change == "a colour bar of its own thickness":
        bar["thickness"] = 12
    elif change == "numeric rows":
        rows["type"] = "linear"
    elif change == "rows whose labels plotly chooses":
        rows.pop("ticktext")
    elif change == "rows with ticks of their own":
        rows["ticks"] = ""
    elif change == "an axis title with a standoff of its own":
        rows["title"] = {"text": "query", "standoff": 5}
    elif change == "padding of its own":
        layout["margin"]["pad"] = 0
    elif change == "a second y axis":
        layout["yaxis2"] = {}
    elif change == "a legend":
        layout |= {"showlegend": True, "legend": {"x": 1}}
    elif change == "a first key label reaching past the left margin":
        layout["xaxis"]["ticktext"][0] = "a first key far longer than the rows' labels and their axis title"
    elif change == "a last key label reaching past the right margin":
        layout["xaxis"]["ticktext"][-1] = "a last key longer than the colour bar"
    assert margins.settled(data, layout) is None
    assert margins.settled(*copied_spec(_map())) is not None  # the map itself, unchanged, gets them


def test_a_screens_map_asks_for_its_margins_and_a_phones_keeps_its_own():
    wide = _fitted(_map(), 900, narrow=False)
    assert wide.layout.margin.l > 100 and wide.layout.margin.r > 80
    assert wide.data[0].colorbar.x == 1
    phone = _map(narrow=True)
    assert phone.data[0].colorbar.orientation == "h"
    assert margins.settled(*copied_spec(phone)) is None
    assert _fitted(phone, 360, narrow=True).layout.margin.l == phone.layout.margin.l
