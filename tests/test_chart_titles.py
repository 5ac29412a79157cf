"""Chart titles broken into lines that fit their charts (`attnviz.figures.common.fitted_lines`,
`attnviz.app.present.room`, the main area's width from `attnviz.app.viewport`).

Plotly draws a title on one line and cuts it at the chart's edge. The server breaks it where the
chart is narrower than the title: the breaks are checked against every way of breaking the title,
the width estimate against what chromium drew, and every page's charts (AppTest) against the width
their columns give them. tests/test_browser_phone.py measures the drawn titles in a real browser.
"""

from __future__ import annotations

import gc
import itertools
import json
import re

import plotly.graph_objects as go
import pytest

from attnviz.app import present, viewport
from attnviz.figures.common import MODEBAR_PX, fitted_lines, text_px

TITLES = [
    "A: Cross-attention (encoder-decoder), layer 3, head 4",
    "Most likely next tokens (chosen: ▁Donnerstag, red)",
    "Residual max_d |M_k·PE(pos) − PE(pos + k)|, float32 table",
    "Angle addition for pair i = 16: lines are the left sides, circles the right sides",
    "<b>Bold</b> and &lt;s&gt; and <span style='color: red'>a coloured part</span> of a title",
    "in each map, rows: query: decoder input token; columns: key: source token; contrast: linear",
]

WORD_BREAK = re.compile(r" (?![^<]*>)")  # a space outside plotly's tags, written anew here

# What chromium drew (the width of each title's box), in Streamlit's theme: titles at 16 px, subtitles
# at 11 px, presenter mode's titles at 24 px (measured on the app's pages at 2400 px wide, where nothing
# is broken). The estimate is meant to be a little over, never under.
DRAWN = [
    ("Cross-attention (encoder-decoder), layer 3, head 4", 16, 354.0),
    ("Most likely next tokens (chosen: ▁Donnerstag, red)", 16, 358.2),
    ("PE for d_model = 128, base 10000", 16, 233.0),
    ("The same numbers in two column orders", 16, 285.0),
    ("Angle addition for pair i = 16: lines are the left sides, circles the right sides", 16, 516.0),
    ("M_k for k = 5, first 16 of 128 dimensions", 24, 413.0),
    ("Residual max_d |M_k·PE(pos) − PE(pos + k)|, float32 table", 24, 601.0),
    ("in each map, rows: query: decoder input token; columns: key: source token; contrast: linear", 11, 415.0),
]


def splits(words: list[str], lines: int):
    """Every way of putting ``words`` in order on ``lines`` lines, none empty."""
    for cuts in itertools.combinations(range(1, len(words)), lines - 1):
        bounds = (0, *cuts, len(words))
        yield [" ".join(words[a:b]) for a, b in itertools.pairwise(bounds)]


def alone(line: str) -> bool:
    """Whether ``line`` is one word (spaces inside plotly's tags do not count)."""
    return len(WORD_BREAK.split(line)) == 1


def best(words: list[str], px: float, font_px: float) -> tuple[int, float]:
    """By trying every break: the fewest lines each of which fits ``px`` or is one word, and the narrowest
    widest line among the ways of using that many."""
    widest = lambda lines: max(text_px(line, font_px) for line in lines)  # noqa: E731
    for n in range(1, len(words) + 1):
        ways = [lines for lines in splits(words, n) if all(text_px(t, font_px) <= px or alone(t) for t in lines)]
        if ways:
            return n, min(widest(lines) for lines in ways)
    raise AssertionError("one word a line always does")


@pytest.mark.parametrize("title", TITLES)
@pytest.mark.parametrize(("px", "font_px"), [(250, 16), (384, 16), (534, 24), (1000, 16), (120, 16)])
def test_a_title_is_broken_into_the_fewest_and_most_even_lines_that_fit(title, px, font_px):
    lines = fitted_lines(title, px, font_px).split("<br>")
    assert " ".join(lines) == title, "every word, in order, and only spaces replaced"
    n, narrowest = best(WORD_BREAK.split(title), px, font_px)
    assert len(lines) == n
    assert all(text_px(line, font_px) <= px or alone(line) for line in lines)
    widest = max(text_px(line, font_px) for line in lines)
    assert narrowest <= widest <= narrowest + 1, "as even as the best breaks, to a pixel"


def test_a_title_that_fits_and_its_own_breaks_are_kept():
    assert fitted_lines("Loss over training", 400, 16) == "Loss over training"
    assert fitted_lines("Two<br>lines", 400, 16) == "Two<br>lines"
    kept = fitted_lines("A short first line<br>" + TITLES[3], 300, 16).split("<br>")
    assert kept[0] == "A short first line" and len(kept) > 2


@pytest.mark.parametrize(("text", "font_px", "drawn"), DRAWN)
def test_the_width_estimate_is_a_little_over_what_chromium_drew(text, font_px, drawn):
    assert 1.0 <= text_px(text, font_px) / drawn <= 1.12


@pytest.fixture
def screen(monkeypatch):
    """The session's screen as the browser would have said it: ``screen(width, narrow=False)``."""

    def said(width: int | None, narrow: bool = False) -> None:
        state = {viewport.NARROW: narrow} | ({} if width is None else {viewport.WIDTH: width})
        monkeypatch.setattr(viewport.st, "session_state", state)

    monkeypatch.setattr(present, "presenting", lambda: False)
    return said


def figure(title: str | dict, **layout) -> go.Figure:
    return go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout={"title": title, **layout})


def test_a_chart_whose_title_fits_is_drawn_as_it_is(screen):
    screen(None)
    fig = figure(TITLES[0])
    assert present.room(fig) is fig, "a 1280-pixel screen: no copy, nothing changed"
    screen(550)
    assert present.room(fig) is fig, "550 px: it still fits the whole width"


@pytest.mark.parametrize("margin", [{"t": 60}, {}])
def test_a_broken_title_takes_more_of_the_top_and_the_plot_keeps_its_height(screen, margin):
    screen(550)
    fig = figure(TITLES[0], height=400, margin=margin)
    shown = present.room(fig, 0.5)
    lines = shown.layout.title.text.split("<br>")
    width = (550 - viewport.COLUMN_GAP_PX) / 2 - present.TITLE_INSET_PX
    assert len(lines) == 2 and all(text_px(line, present.CHART_TITLE_PX) <= width for line in lines)
    added = round(present.LINE * present.CHART_TITLE_PX)
    assert shown.layout.margin.t == margin.get("t", present.PLOTLY_TOP_MARGIN_PX) + added
    assert shown.layout.height == 400 + added
    assert fig.layout.title.text == TITLES[0] and fig.layout.height == 400, "the shared figure is left as it was"


def test_a_subtitle_is_broken_at_its_own_size(screen):
    screen(350)
    subtitle = TITLES[5]
    fig = go.Figure(layout={"title": {"text": "A grid", "subtitle": {"text": subtitle}}, "height": 300})
    shown = present.room(fig)
    lines = shown.layout.title.subtitle.text.split("<br>")
    assert len(lines) == 2 and shown.layout.title.text == "A grid"
    assert shown.layout.height == 300 + round(present.LINE * present.CHART_SUBTITLE_PX)


def test_on_a_phone_a_title_starts_below_plotly_s_toolbar(screen):
    screen(350, narrow=True)
    shown = present.room(figure("Loss", height=300, margin={"t": 50}))
    title = shown.layout.title
    assert title.yanchor == "top" and title.yref == "container" and title.pad.t >= MODEBAR_PX
    assert shown.layout.margin.t == 50 + MODEBAR_PX and shown.layout.height == 300 + MODEBAR_PX
    below = figure({"text": "Loss", "pad": {"t": MODEBAR_PX + 12}})  # laid out for a phone already
    assert present.room(below) is below


@pytest.mark.parametrize("subtitle", [None, TITLES[5]])
def test_a_presenter_s_title_continues_in_its_subtitle_at_the_title_s_size(monkeypatch, screen, subtitle):
    """Presenter mode's title pushes the top margin (its automargin stacks the key labels under it), and
    plotly then drew a title of two lines above the figure: the lines after the first open the subtitle."""
    screen(None)
    monkeypatch.setattr(present, "presenting", lambda: True)
    fig = figure({"text": TITLES[1], **({"subtitle": {"text": subtitle}} if subtitle else {})})
    shown = present.room(fig, 0.5).layout.title
    width = (viewport.ROOM_WIDEST_PX - viewport.COLUMN_GAP_PX) / 2 - present.TITLE_INSET_PX
    assert text_px(TITLES[1], present.TITLE_PX) > width, "the case: too wide at the room's 24 px in half a screen"
    assert "<br>" not in shown.text and TITLES[1].startswith(shown.text)
    continued, *own = shown.subtitle.text.split("<br>")
    line = re.fullmatch(r"<span style='font-size:(\d+)px'><b>(.*)</b></span>", continued)
    assert line and int(line[1]) == present.TITLE_PX, continued
    assert f"{shown.text} {line[2]}" == TITLES[1] and text_px(line[2], present.TITLE_PX) <= width
    if subtitle:
        assert " ".join(own) == subtitle and all(text_px(t, present.TICK_PX) <= width for t in own)
    else:
        assert own == ["\u00a0"], "a subtitle of several lines, which plotly draws where it belongs"
    assert shown.subtitle.font.size == present.TICK_PX and shown.subtitle.font.color == present.DARK


def test_the_browser_s_report_keeps_only_widths_a_page_could_have(monkeypatch):
    state = {}
    monkeypatch.setattr(viewport.st, "session_state", state)
    cases = [(550, 550), (None, None), (10**9, None), (-5, None), (True, None), ("550", None), (350, 350)]
    cases += [(551, None), (550.5, None)]  # not a step: a page's script says widths in steps
    for said, kept in cases:
        state.pop(viewport.WIDTH, None)
        state[viewport.WATCH_KEY] = {"screen": {"narrow": False, "width": said}}
        viewport._reported()
        assert state.get(viewport.WIDTH) == kept, said


def charts(node, share: float = 1.0):
    """Every chart under ``node`` of an AppTest's page with the part of the main area's width its columns
    give it (Streamlit's column weights, made to sum to 1)."""
    if getattr(node, "type", None) == "column":
        share *= node.weight
    if getattr(node, "type", None) == "plotly_chart":
        yield node, share
    for child in getattr(node, "children", {}).values():
        yield from charts(child, share)


PAGES = ["app.py", *(f"pages/{name}.py" for name in ("explorer", "compare", "decoding", "beyond", "positional"))]
PAGES += [f"pages/{name}.py" for name in ("linearity", "formation", "mechanics", "variants", "walkthrough", "atlas")]


def drawn_px(line: str, font_px: float) -> float:
    """``line`` of a title or subtitle at ``font_px``, or at the size a span around it gives."""
    size = re.match(r"<span style='font-size:(\d+)px'>", line)
    return text_px(line, float(size[1]) if size else font_px)


@pytest.mark.slow  # AppTest runs every page three times
@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_every_page_s_chart_titles_fit_the_width_their_columns_give_them():
    """A 1024x768 screen beside the sidebar (a main area of 550 px), a phone (350 px, its columns
    stacked) and a 1024x768 projector in presenter mode (850 px, the room's fonts): every line of every
    title fits the chart's share of the main area, read from the page's own columns."""
    from streamlit.testing.v1 import AppTest

    broken = 0
    for width, narrow, presenting in ((550, False, False), (350, True, False), (850, False, True)):
        title_px = present.TITLE_PX if presenting else present.CHART_TITLE_PX
        subtitle_px = present.TICK_PX if presenting else present.CHART_SUBTITLE_PX
        for page in PAGES:
            at = AppTest.from_file("../app.py", default_timeout=120)
            at.session_state[viewport.WIDTH] = width
            at.session_state[viewport.NARROW] = narrow
            at.session_state[present.PRESENT] = presenting
            at.run()
            if page != "app.py":
                at.switch_page(page).run()
            assert not at.exception, (page, [e.value for e in at.exception])
            for chart, share in charts(at.main):
                share = 1.0 if narrow else share
                px = width * share - viewport.COLUMN_GAP_PX * (1 - share) - present.TITLE_INSET_PX
                title = json.loads(chart.proto.spec)["layout"].get("title") or {}
                for part, font_px in ((title, title_px), (title.get("subtitle") or {}, subtitle_px)):
                    for line in (part.get("text") or "").split("<br>"):
                        assert drawn_px(line, font_px) <= px or alone(line), (page, width, share, line)
                broken += "<br>" in (title.get("text") or "") + ((title.get("subtitle") or {}).get("text") or "")
    assert broken >= 10, f"only {broken} titles were broken: the case this test is for is gone"


def test_a_title_hung_from_its_top_is_moved_down_by_what_plotly_raises_it(screen):
    """Plotly draws a title of several lines hung from its top higher than on one line (the first line
    rose 12-16 px above where it was, and out of the chart, in chromium): a broken one is moved down."""
    screen(550)
    title = {"text": TITLES[0], "y": 1.0, "yref": "container", "yanchor": "top", "pad": {"t": 12}}
    shown = present.room(figure(title, height=400, margin={"t": 150}), 0.5)
    rise = round(present.MULTILINE_RISE * present.CHART_TITLE_PX)
    assert shown.layout.title.text.count("<br>") == 1 and shown.layout.title.pad.t == 12 + rise
    assert shown.layout.margin.t == 150 + round(present.LINE * present.CHART_TITLE_PX) + rise


def test_a_shared_figure_s_broken_copy_is_made_once_for_each_width(screen):
    screen(550)
    fig = figure(TITLES[0])
    first = present.room(fig, 0.5)
    assert present.room(fig, 0.5) is first, "every rerun of every session gets the one copy"
    assert present.room(fig, 0.4) is not first and present.room(figure(TITLES[0]), 0.5) is not first
    key = (id(fig), False, viewport.chart_px(0.5) - present.TITLE_INSET_PX, False)
    assert key in present._SHOWN
    del fig, first
    gc.collect()
    assert key not in present._SHOWN, "the copy goes with its figure"


def test_room_keeps_a_bounded_number_of_figures(monkeypatch, screen):
    """Thirty visitors at thirty widths keep no more than `present.SHOWN_KEPT` copies, however long the
    figures live (the shared ones live in the cache)."""
    screen(550)
    monkeypatch.setattr(present, "SHOWN_KEPT", 5)
    monkeypatch.setattr(present, "_SHOWN", {})
    figures = [figure(TITLES[0]) for _ in range(12)]
    shown = [present.room(fig, 0.5) for fig in figures]
    assert len(present._SHOWN) == 5 and all("<br>" in fig.layout.title.text for fig in shown)
    assert present.room(figures[-1], 0.5) is shown[-1], "the newest are kept"
