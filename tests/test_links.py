"""Saved links keep opening the same view: the widgets they set, and the titles of what is drawn.

``tests/golden/links.json`` holds, for each link, what the app showed when it was saved. A change
that moves page code around (a new frame, smaller pages) must leave every entry as it is; a change
meant to alter a view regenerates the file with ``ATTNVIZ_RECORD_LINKS=1 pytest tests/test_links.py``
and shows the difference in review.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import open_from_link

GOLDEN = Path(__file__).parent / "golden" / "links.json"

# Links written before choices had short names give the label the widget shows ("All heads (model
# view)"); the app now writes the option's key ("grid"). Both must keep opening the same view.
LINKS: list[tuple[str, dict[str, str | list[str]]]] = [
    ("app.py", {}),
    ("app.py", {"src": "twenty-one", "words": "true"}),
    ("pages/explorer.py", {"kind": "cross", "layer": "3", "head": "1"}),
    ("pages/explorer.py", {"kind": "encoder", "view": "All heads (model view)", "contrast": "each row to its maximum"}),
    ("pages/explorer.py", {"kind": "encoder", "view": "grid", "contrast": "row"}),
    ("pages/explorer.py", {"view": "Head statistics", "kind": "decoder"}),
    ("pages/explorer.py", {"view": "Aggregate", "aggregate": "max", "layer": "2"}),
    ("pages/explorer.py", {"model": "reverse", "src": "h e l l o", "view": "Lines", "lines_heads": ["1", "3"]}),
    ("pages/compare.py", {"cmp_what": "another model", "cmp_model": "reverse"}),
    ("pages/compare.py", {"cmp_what": "model", "cmp_model": "reverse"}),
    ("pages/compare.py", {"cmp_src": "Thursday, July 3, 1998", "cmp_view": "All heads"}),
    ("pages/decoding.py", {"beam": "4", "step": "3"}),
    ("pages/beyond.py", {"bw_method": "rollout", "bw_kind": "encoder"}),
    ("pages/atlas.py", {"at_kind": "encoder", "at_layer": "2", "at_head": "3"}),
    ("pages/walkthrough.py", {"wt_layer": "2", "wt_head": "2"}),
    ("pages/mechanics.py", {"mech_tab": "Masks"}),
    ("pages/variants.py", {"var_tab": "Complexity (section 4)"}),
    ("pages/positional.py", {"pe_length": "64"}),
    ("pages/linearity.py", {"lin_k": "5"}),
    ("pages/formation.py", {"model": "reverse", "step": "600", "formation_statistic": "anti_diagonal"}),
]


def link_id(page: str, params: dict) -> str:
    return page + "?" + "&".join(f"{k}={v}" for k, v in params.items())


def unbroken(title: str | None) -> str | None:
    """A chart's title on one line, as written before it was broken to fit its chart."""
    return title.replace("<br>", " ") if title else title


def opened(page: str, params: dict) -> dict:
    """What the app shows when ``params`` are in the address bar and ``page`` is opened."""
    at = open_from_link(page, params, timeout=180)
    assert not at.exception, [e.value for e in at.exception]
    notices = [t.proto.body for t in at.get("toast")]
    charts = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    return {
        "widgets": {key: json.loads(json.dumps(at.session_state[key], default=str)) for key in params},
        "notices": notices,
        # what a title says: where it breaks into lines depends on the screen (attnviz.app.present.room)
        "titles": [unbroken((c.get("layout", {}).get("title") or {}).get("text")) for c in charts],
        "headings": [h.value for h in [*at.title, *at.header, *at.subheader]],
    }


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.slow
@pytest.mark.parametrize(("page", "params"), LINKS, ids=[link_id(*link) for link in LINKS])
def test_a_saved_link_opens_the_same_view(page, params, golden, fresh_streamlit_caches):
    shown = opened(page, params)
    key = link_id(page, params)
    if os.environ.get("ATTNVIZ_RECORD_LINKS"):
        golden[key] = shown
        GOLDEN.write_text(json.dumps(golden, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
        return
    assert key in golden, f"{key} was never recorded: ATTNVIZ_RECORD_LINKS=1 pytest tests/test_links.py"
    assert not shown["notices"], "a saved link's values are all usable"
    assert shown == golden[key]


def test_every_page_has_a_saved_link():
    from attnviz.app.registry import PAGES

    assert {page.path for page in PAGES} | {"app.py"} <= {page for page, _ in LINKS}


@pytest.mark.slow
def test_the_address_bar_holds_short_values_whatever_the_link_gave(fresh_streamlit_caches):
    """A label from an older link is rewritten to the option's key; a choice made on the page is written
    by its key, and the default leaves the parameter out."""
    at = open_from_link("pages/explorer.py", {"view": "All heads (model view)", "contrast": "each row to its maximum"})
    assert not at.exception, [e.value for e in at.exception]
    assert (at.session_state["view"], at.session_state["contrast"]) == ("grid", "row")
    assert (at.query_params.get("view"), at.query_params.get("contrast")) == ("grid", "row")
    at.selectbox(key="view").set_value("lines").run()
    assert at.query_params.get("view") == "lines"
    at.selectbox(key="view").set_value("one").run()  # the default: no parameter, as Streamlit's own binding
    assert "view" not in at.query_params
    assert at.query_params.get("contrast") == "row"


@pytest.mark.slow
def test_a_link_value_that_is_neither_key_nor_label_is_set_aside(fresh_streamlit_caches):
    at = open_from_link("pages/explorer.py", {"view": "gird"})
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["view"] == "one"
    assert any("view='gird'" in t.proto.body for t in at.get("toast"))
    assert "view" not in at.query_params


def _set_aside(at) -> list[str]:
    return [c.value for c in at.caption if c.value.startswith("Set aside from the link")]


@pytest.mark.parametrize("raw", ["20000", "2e4", "20000.0", "1"])
def test_a_number_written_otherwise_is_taken_not_set_aside(raw, fresh_streamlit_caches):
    """A float input shows 20000.0 for a link's 20000: the same number, so no notice that it was not."""
    at = open_from_link("pages/positional.py", {"pe_base": raw})
    assert not at.exception, [e.value for e in at.exception]
    assert at.number_input(key="pe_base").value == float(raw)
    assert not _set_aside(at) and not at.get("toast")


@pytest.mark.parametrize(
    ("page", "key", "values", "taken", "aside"),
    [
        ("pages/explorer.py", "layer", ["1", "2"], 2, "layer='1'"),
        ("pages/explorer.py", "view", ["grid", "stats"], "stats", "view='grid'"),
        ("pages/mechanics.py", "mech_scale", ["false", "true"], True, "mech_scale='false'"),
    ],
)
def test_a_repeated_parameter_takes_the_last_and_sets_the_others_aside(
    page, key, values, taken, aside, fresh_streamlit_caches
):
    at = open_from_link(page, {key: values})
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state[key] == taken
    assert [f"Set aside from the link (not available here): {aside}."] == _set_aside(at)


@pytest.mark.parametrize(("key", "values", "taken"), [("layer", ["2", "2"], 2), ("view", ["stats", "stats"], "stats")])
def test_a_parameter_repeated_with_the_value_taken_is_not_set_aside(key, values, taken, fresh_streamlit_caches):
    """?layer=2&layer=2 had said "layer='2' cannot be shown here, so another value is shown", showing layer 2."""
    at = open_from_link("pages/explorer.py", {key: values})
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state[key] == taken
    assert not _set_aside(at) and not at.get("toast")
