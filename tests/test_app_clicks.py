"""What a person clicks, in AppTest: the sidebar's examples, and steps that must raise no false notice."""

from __future__ import annotations

import pytest
from conftest import open_app, open_from_link
from streamlit.testing.v1 import AppTest

from attnviz import api
from attnviz.app import registry

pytestmark = pytest.mark.usefixtures("fresh_streamlit_caches")

SET_ASIDE = "Set aside from the link"


def notices(at: AppTest) -> list[str]:
    """The toasts and the set-aside captions of the last run."""
    return [t.proto.body for t in at.get("toast")] + [c.value for c in at.caption if SET_ASIDE in c.value]


def assert_ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["en-de", "reverse"])
@pytest.mark.parametrize("page", [page.path for page in registry.PAGES])
def test_an_example_click_sets_the_sentence_and_analyses_it(page, model):
    at = open_app(page, model=model)
    examples = api.load(model).info["examples"]
    pills = at.sidebar.pills(key="_example")
    for example in (examples[1], examples[-1], examples[1]):  # the same pill twice in a row works too
        at.sidebar.text_area(key="src").set_value("something typed").run()
        pills.set_value(example).run()
        assert_ok(at)
        assert at.sidebar.text_area(key="src").value == example
        assert at.sidebar.text_input(key="tgt").value == ""
        assert not notices(at), notices(at)
        pills = at.sidebar.pills(key="_example")
        assert pills.value is None, "the pill is cleared once its example is in the text box"


def test_the_home_page_analyses_the_example_clicked():
    at = open_app("app.py")
    example = api.load("en-de").info["examples"][2]
    at.sidebar.pills(key="_example").set_value(example).run()
    assert_ok(at)
    assert any(example in m.value for m in at.markdown), "the map's heading names the example's sentence"


@pytest.mark.slow
def test_steps_taken_by_the_page_raise_no_notice():
    """Buttons change bound widgets in callbacks: the page's own changes, never a link's values set aside."""
    at = AppTest.from_file("../app.py", default_timeout=120)
    at.query_params.update({"step": "2", "model": "en-de"})  # opened from a link that names a step
    at.run()
    at.switch_page("pages/decoding.py").run()
    assert_ok(at)
    for key in ("_step_next", "_step_next", "_step_prev", "_step_last", "_step_first"):
        at.button(key=key).click().run()
        assert_ok(at)
        assert not notices(at), (key, notices(at))


def test_a_link_value_the_page_cannot_take_is_still_set_aside_once():
    at = AppTest.from_file("../app.py", default_timeout=120)
    at.query_params.update({"layer": "99"})
    at.run()
    at.switch_page("pages/explorer.py").run()
    assert any("layer='99'" in n for n in notices(at)), notices(at)
    at.selectbox(key="head").set_value(2).run()
    assert not notices(at), "said once, when the link is opened, not on every later click"


@pytest.mark.slow
@pytest.mark.parametrize("page", [page.path for page in registry.PAGES])
def test_presenter_mode_from_a_link_draws_every_figure_for_the_room(page):
    import json

    at = AppTest.from_file("../app.py", default_timeout=120)
    at.query_params.update({"present": "1"})
    at.run()
    if page != "app.py":
        at.switch_page(page).run()
    assert_ok(at)
    assert at.sidebar.toggle(key="present").value, "the link's present=1 turns the toggle on"
    charts = at.get("plotly_chart")
    assert charts or at.dataframe, "every page draws a figure (the walkthrough's first stage: a table)"
    for chart in charts:
        layout = json.loads(chart.proto.spec)["layout"]
        for axis in (name for name in layout if name.startswith(("xaxis", "yaxis"))):
            assert layout[axis]["tickfont"]["size"] >= 18, (page, axis)
    at.sidebar.toggle(key="present").set_value(False).run()
    assert_ok(at)
    sizes = [
        json.loads(c.proto.spec)["layout"].get("xaxis", {}).get("tickfont", {}).get("size")
        for c in at.get("plotly_chart")
    ]
    assert all(size is None or size < 18 for size in sizes), "off again: the figures as they are"


@pytest.mark.slow
@pytest.mark.parametrize(("page", "key"), [("pages/mechanics.py", "mech_tab"), ("pages/variants.py", "var_tab")])
def test_the_teaching_tabs_step_with_their_buttons(page, key):
    at = open_app(page)
    first = at.session_state[key] if key in at.session_state else None
    at.button(key=f"_{key}_next").click().run()
    assert_ok(at)
    second = at.session_state[key]
    assert second != first
    at.button(key=f"_{key}_previous").click().run()
    assert_ok(at)
    assert at.session_state[key] != second and not notices(at)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "params"),
    [
        ("pages/walkthrough.py", {"wt_k": "1e309"}),
        ("pages/variants.py", {"var_tab": "Complexity (section 4)", "var_cx_n": "1e309"}),
        ("pages/variants.py", {"var_tab": "Synthesizer", "var_syn_seed": "-1e400"}),
        ("pages/mechanics.py", {"mech_tab": "Why √d_k", "mech_n_keys": "nan"}),
    ],
)
def test_whole_numbers_out_of_range_in_a_link_are_set_aside(page, params):
    """Streamlit's own reading of 1e309 for a whole-number box raised OverflowError: the page crashed."""
    at = open_from_link(page, params)
    assert_ok(at)
    key, value = list(params.items())[-1]
    assert any(f"{key}='{value}'" in n for n in notices(at)), notices(at)
