"""The two teaching pages (mechanics, variants) run on defaults and after every control changes (AppTest).

Controls are changed a tab at a time, then the page is rerun once: every widget is exercised
without a rerun per widget. The loaded model's parts use the shipped "en-de" and "reverse" models.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import open_app
from streamlit.testing.v1 import AppTest

from attnviz.app import CUSTOM_PATH

MECHANICS, VARIANTS = "pages/mechanics.py", "pages/variants.py"


pytestmark = pytest.mark.usefixtures("fresh_streamlit_caches")


def assert_ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def texts(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def numbers(table: pd.DataFrame) -> pd.DataFrame:
    """A shown table with its formatted number columns ("1.0000", "12,288") read back as numbers."""
    out = table.copy()
    for column in out.columns:
        try:
            out[column] = pd.to_numeric(out[column].astype(str).str.replace(",", ""))
        except (ValueError, TypeError):
            pass
    return out


def table(at: AppTest, first_column: str):
    """The st.table whose first column is named ``first_column`` (tables are found by content, not order)."""
    return numbers(next(t.value for t in at.table if list(t.value.columns)[:1] == [first_column]))


def open_tab(at: AppTest, key: str, label: str) -> AppTest:
    """Open one of a page's tabs (they are lazy: only the open one runs), as a click or a link would."""
    at.session_state[key] = label
    return at.run()


MECHANICS_TABS = ["Worked example", "Why √d_k", "Masks", "Multi-head", "Permutation", "Learning rate"]
VARIANTS_TABS = ["Mask patterns", "Pattern on the model", "Synthesizer", "Complexity (section 4)"]


def charts_in_every_tab(at: AppTest, key: str, labels: list[str]) -> int:
    count = 0
    for label in labels:
        open_tab(at, key, label)
        assert not at.exception, (label, [e.value for e in at.exception])
        count += len(at.get("plotly_chart"))
    return count


def frame(at: AppTest, column: str):
    """The read-only st.dataframe that has a column named ``column``."""
    return next(d.value for d in at.dataframe if d.editing_mode == "read_only" and column in d.value.columns)


@pytest.mark.slow
def test_mechanics_on_defaults_shows_the_worked_example_and_every_part():
    at = open_app(MECHANICS)
    assert_ok(at)
    assert [e.key for e in at.data_editor] == ["_mech_X", "_mech_WQ", "_mech_WK", "_mech_WV"]
    scores = numbers(next(t.value for t in at.table if list(t.value.index) == ["query 0", "query 1", "query 2"]))
    np.testing.assert_allclose(
        scores.to_numpy(), np.array([[2, 4, 4], [4, 16, 12], [4, 12, 10]]) / np.sqrt(3), atol=5e-5, rtol=0
    )
    assert "What the scaling changes" in [h.value for h in at.subheader]
    assert not at.get("plotly_chart"), "the tabs are lazy: only the open one ran"
    open_tab(at, "mech_tab", "Permutation")
    body = texts(at)
    assert "exact up to float64 rounding" in body, "the permutation property holds on the shipped model"
    assert "order matters" in body
    # scaling and one query's weights, masks, row, head cost, 2 permutation maps, learning rate
    assert charts_in_every_tab(at, "mech_tab", MECHANICS_TABS) == 8
    assert at.caption and all(c.value for c in at.caption)


def _query_bars(at: AppTest) -> np.ndarray:
    """The weights drawn by the Why √d_k tab's one-query chart (plotly's base64 arrays decoded)."""
    import base64
    import json

    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if "One query" in c.proto.spec)
    y = spec["data"][0]["y"]
    return np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]) if isinstance(y, dict) else np.array(y)


def assert_scaling_toggle_on_its_own_tab(at: AppTest) -> None:
    """The lecture plan's step: on the Why √d_k tab, toggling the scaling off saturates one query's softmax."""
    from attnviz.lessons import mechanics

    label = "Divide the scores by √d_k (the paper)"
    lecture = (Path(__file__).resolve().parent.parent / "docs" / "lecture.md").read_text()
    assert label in " ".join(lecture.split()), "the plan names the toggle as the page shows it"
    toggle = at.toggle(key="mech_dk_scale")
    assert toggle.label == label and toggle.value
    scaled = _query_bars(at)
    toggle.set_value(False).run()
    assert_ok(at)
    unscaled = _query_bars(at)
    n_keys, seed = at.slider(key="mech_n_keys").value, int(at.number_input(key="mech_seed").value)
    np.testing.assert_allclose(unscaled, mechanics.one_query_weights(64, n_keys, seed, scale=False), rtol=1e-6)
    assert unscaled.max() > 0.9 > scaled.max(), (scaled.max(), unscaled.max())
    at.toggle(key="mech_dk_scale").set_value(True).run()


@pytest.mark.slow
def test_mechanics_every_control():
    at = open_app(MECHANICS)
    # Worked example: edit a cell and add a token, blank a cell, reset, switch off scaling.
    at.session_state["_mech_X"] = {
        "edited_rows": {0: {"dim 0": 2.0}},
        "added_rows": [{"dim 0": 1, "dim 1": 1, "dim 2": 0, "dim 3": 0}],
        "deleted_rows": [],
    }
    at.run()
    assert_ok(at)
    np.testing.assert_array_equal(table(at, "dim 0").to_numpy()[[0, 3]], [[2, 0, 3], [2, 0, 1]])
    at.session_state["_mech_WQ"] = {"edited_rows": {1: {"q 0": None}}, "added_rows": [], "deleted_rows": []}
    at.run()
    assert not at.exception
    assert at.error and "fill every cell" in at.error[0].value
    at.button(key="_mech_reset").click().run()
    assert_ok(at)
    np.testing.assert_array_equal(table(at, "dim 0").to_numpy()[0], [1, 0, 2])
    at.toggle(key="mech_scale").set_value(False).run()
    assert_ok(at)
    unscaled = next(t.value for t in at.table if list(t.value.index) == ["query 0", "query 1", "query 2"])
    np.testing.assert_array_equal(numbers(unscaled).to_numpy(), [[2, 4, 4], [4, 16, 12], [4, 12, 10]])
    # Why sqrt(d_k).
    open_tab(at, "mech_tab", "Why √d_k")
    at.select_slider(key="mech_dk_max").set_value(64)
    at.slider(key="mech_n_keys").set_value(20)
    at.number_input(key="mech_seed").set_value(3).run()
    assert_ok(at)
    assert list(frame(at, "d_k")["d_k"]) == [1, 4, 16, 64]
    assert_scaling_toggle_on_its_own_tab(at)
    # Masks: shrinking n clamps the padded length and the row.
    open_tab(at, "mech_tab", "Masks")
    at.slider(key="mech_mask_n").set_value(3).run()
    assert_ok(at)
    assert at.slider(key="mech_pad_len").value == 3 and at.slider(key="mech_mask_row").value == 2
    at.slider(key="mech_pad_len").set_value(2)
    at.slider(key="mech_mask_row").set_value(2)
    at.radio(key="mech_mask_kind").set_value("both").run()
    assert_ok(at)
    row = table(at, "key")
    assert list(row["may attend"]) == [True, True, False] and row["weight with mask"].iloc[2] == 0
    # Multi-head.
    open_tab(at, "mech_tab", "Multi-head")
    at.slider(key="mech_n").set_value(5)
    at.select_slider(key="mech_d_model").set_value(64)
    at.select_slider(key="mech_h").set_value(16).run()
    assert_ok(at)
    assert "(16, 5, 4)" in list(table(at, "step")["shape"])
    # Permutation.
    open_tab(at, "mech_tab", "Permutation")
    at.radio(key="mech_perm_order").set_value("shuffle").run()  # enables the seed
    at.number_input(key="mech_perm_seed").set_value(5)
    at.selectbox(key="mech_perm_layer").set_value(at.selectbox(key="mech_perm_layer").options[-1])
    at.selectbox(key="mech_perm_head").set_value(at.selectbox(key="mech_perm_head").options[-1]).run()
    assert_ok(at)
    assert "exact up to float64 rounding" in texts(at)
    # Learning rate.
    open_tab(at, "mech_tab", "Learning rate")
    at.select_slider(key="mech_lr_d_model").set_value(256)
    at.slider(key="mech_lr_warmup").set_value(1000)
    at.slider(key="mech_lr_steps").set_value(5000).run()
    assert_ok(at)
    assert any(f"{256**-0.5 * 1000**-0.5:.3e}" in c.value for c in at.caption), "the peak at the end of warm-up"


@pytest.mark.slow
def test_variants_on_defaults():
    at = open_app(VARIANTS)
    assert_ok(at)
    pairs = table(at, "pattern").set_index("pattern")["computed pairs"]
    assert pairs["full"] == 16 * 16 and pairs["causal"] == 16 * 17 // 2 and pairs["local"] == 16 + 2 * (15 + 14 + 13)
    open_tab(at, "var_tab", "Pattern on the model")
    assert "**As trained:**" in texts(at)
    open_tab(at, "var_tab", "Complexity (section 4)")
    assert table(at, "layer type")["layer type"].tolist()[0] == "Self-Attention"
    assert set(frame(at, "median ms")["layer"]) == {"self-attention", "recurrent (GRU)"}
    assert charts_in_every_tab(at, "var_tab", VARIANTS_TABS) == 7  # patterns, cost, 2 maps, 2 synthesizer, timing


@pytest.mark.slow
def test_variants_every_control():
    at = open_app(VARIANTS)
    at.slider(key="var_n").set_value(9)
    at.slider(key="var_k").set_value(3)
    at.toggle(key="var_causal").set_value(True).run()
    assert_ok(at)
    pairs = table(at, "pattern").set_index("pattern")["computed pairs"]
    assert pairs["full"] == pairs["causal"] == 45 and pairs["local"] == 9 + 8 + 7
    open_tab(at, "var_tab", "Pattern on the model")
    for name in ("causal", "dilated", "sparse", "local"):
        at.selectbox(key="var_pattern").set_value(name).run()
        assert_ok(at)
        assert f"With the {name} pattern" in texts(at)
    at.slider(key="var_model_k").set_value(1)
    at.selectbox(key="var_layer").set_value(at.selectbox(key="var_layer").options[-1])
    at.selectbox(key="var_head").set_value(at.selectbox(key="var_head").options[-1]).run()
    assert_ok(at)
    open_tab(at, "var_tab", "Synthesizer")
    at.slider(key="var_syn_token").set_value(3).run()
    at.slider(key="var_syn_n").set_value(4).run()
    assert at.slider(key="var_syn_token").value == 3, "a token that still exists stays chosen"
    at.slider(key="var_syn_d").set_value(3)
    at.number_input(key="var_syn_seed").set_value(7)
    at.slider(key="var_syn_token").set_value(3).run()
    assert_ok(at)
    assert any("token 3 is replaced" in c.value for c in at.caption)
    at.slider(key="var_syn_n").set_value(3).run()  # now token 3 is gone: clamped, not an error
    assert_ok(at)
    assert at.slider(key="var_syn_token").value == 2
    open_tab(at, "var_tab", "Complexity (section 4)")
    at.number_input(key="var_cx_n").set_value(1000)
    at.number_input(key="var_cx_d").set_value(64)
    at.number_input(key="var_cx_k").set_value(5)
    at.number_input(key="var_cx_r").set_value(10)
    at.select_slider(key="var_time_d").set_value(32).run()
    assert_ok(at)
    assert "operations at n=1000, d=64" in table(at, "layer type").columns
    at.button(key="_var_measure").click().run()
    assert_ok(at)


@pytest.mark.slow
@pytest.mark.parametrize("page", [MECHANICS, VARIANTS])
def test_pages_with_the_reverse_model(page):
    at = open_app(page)
    at.sidebar.selectbox(key="model").set_value("reverse").run()
    assert_ok(at)
    key, labels = ("mech_tab", MECHANICS_TABS) if page == MECHANICS else ("var_tab", VARIANTS_TABS)
    assert charts_in_every_tab(at, key, labels) == (8 if page == MECHANICS else 7)  # as on en-de (above)


@pytest.mark.slow
@pytest.mark.parametrize("page", [MECHANICS, VARIANTS])
def test_pages_without_a_model_still_teach_and_say_what_to_do(page):
    at = open_app(page)
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    assert not at.exception
    key, labels = ("mech_tab", MECHANICS_TABS) if page == MECHANICS else ("var_tab", VARIANTS_TABS)
    open_tab(at, key, labels[4 if page == MECHANICS else 1])  # the tab that runs the loaded model
    assert any("Choose a model in the sidebar" in i.value for i in at.info)
    assert charts_in_every_tab(at, key, labels) >= 4, "the parts that need no model still draw"


@pytest.mark.parametrize("page", [MECHANICS, VARIANTS])
def test_bad_sentence_gives_a_message_not_a_traceback(page):
    at = open_app(page)
    at.sidebar.text_area(key="src").set_value("").run()
    open_tab(at, *(("mech_tab", "Permutation") if page == MECHANICS else ("var_tab", "Pattern on the model")))
    assert not at.exception
    assert at.error and "empty" in at.error[0].value
