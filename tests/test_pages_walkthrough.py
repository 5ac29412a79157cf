"""The walkthrough page runs on defaults, through every stage and with every control (AppTest)."""

from __future__ import annotations

import json

import pytest
from conftest import open_app
from streamlit.testing.v1 import AppTest

from attnviz import api
from attnviz.lessons.walkthrough import stage_list

PAGE = "pages/walkthrough.py"


pytestmark = pytest.mark.usefixtures("fresh_streamlit_caches")


def open_page(model: str | None = None) -> AppTest:
    return open_app(PAGE, model)


def assert_ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def test_defaults_show_the_first_stage():
    at = open_page()
    assert_ok(at)
    assert at.selectbox(key="wt_stage").value == "tokens"
    assert at.dataframe, "the tokens and their ids"
    assert [b.key for b in at.button][:2] == ["_wt_prev", "_wt_next"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["en-de", "reverse", "minilm"])
def test_next_through_every_stage_then_jump_and_change_controls(model):
    if model not in api.list_models():
        pytest.skip(f"{model} is not installed")
    at = open_page(model)
    assert_ok(at)
    encoder_only = model == "minilm"
    keys = [k for k, _ in stage_list(encoder_only)]
    assert at.selectbox(key="wt_stage").options == [t for _, t in stage_list(encoder_only)]
    seen = []
    for _ in keys:
        seen.append(at.selectbox(key="wt_stage").value)
        assert_ok(at)
        if seen[-1] != "tokens":
            assert at.get("plotly_chart"), seen[-1]
            assert at.get("download_button"), seen[-1]
        at.button(key="_wt_next").click().run()
    assert seen == keys
    assert at.selectbox(key="wt_stage").value == keys[-1], "Next stops at the last stage"
    at.button(key="_wt_prev").click().run()
    assert at.selectbox(key="wt_stage").value == keys[-2]
    if encoder_only:
        assert any("stops after the encoder" in i.value for i in at.info)
    for key in reversed(keys):  # jump with the stage list, changing every control on the way
        at.selectbox(key="wt_stage").set_value(key).run()
        for picker in ("wt_layer", "wt_head", "wt_step"):
            box = at.selectbox(key=picker)
            if not box.disabled:
                box.set_value(box.options[-1]).run()
                assert_ok(at)
        at.number_input(key="wt_k").set_value(5).run()
        assert_ok(at)
    assert at.selectbox(key="wt_stage").value == "tokens"


@pytest.mark.slow
@pytest.mark.parametrize(("stage", "stack"), [("enc_qkv", "encoder"), ("dec_cross", "decoder")])
def test_captions_count_layers_and_heads_from_1_like_every_other_label(stage, stack):
    """A tensor recorded as encoder.1.… is layer 2 in the app's count, and its shape never reads as "head 4"."""
    import re

    at = open_page("en-de")
    at.selectbox(key="wt_stage").set_value(stage).run()
    at.selectbox(key="wt_layer").set_value(2).run()
    at.selectbox(key="wt_head").set_value(3).run()
    assert_ok(at)
    named = [c.value for c in at.caption if c.value.startswith(f"`{stack}.")]
    assert named, [c.value for c in at.caption]
    for caption in named:
        index = int(re.match(rf"`{stack}\.(\d+)\.", caption)[1])
        assert index == 1 and f"({stack} layer {index + 1};" in caption, caption
        assert not re.search(r"\bhead \d", caption), f"a size that reads as a head's number: {caption}"
    titles = [(json.loads(c.proto.spec)["layout"].get("title") or {}).get("text") or "" for c in at.get("plotly_chart")]
    assert any("head 3" in t for t in titles) and not any(re.search(r"head [0-24-9]\b", t) for t in titles), titles
