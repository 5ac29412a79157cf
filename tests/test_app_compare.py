"""The Compare page on two models that differ in kind, and on a side B whose text its model cannot read (AppTest)."""

from __future__ import annotations

import pytest
from conftest import open_app
from streamlit.testing.v1 import AppTest

from attnviz.checkpoints.catalog import list_models

pytestmark = pytest.mark.usefixtures("fresh_streamlit_caches")


def assert_ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def compare_models(a: str) -> AppTest:
    """The Compare page with ``a`` in the sidebar, comparing it with another model."""
    at = open_app("pages/compare.py", model=a)
    at.radio(key="cmp_what").set_value("model").run()
    return at


def no_common_kind(at: AppTest) -> list[str]:
    return [i.value for i in at.info if "no kind of attention in common" in i.value]


def test_two_models_with_no_kind_of_attention_in_common_say_so():
    """A decoder-only model against an encoder-only one: a message naming each side's kinds, no IndexError."""
    if "minilm" not in list_models():
        pytest.skip("MiniLM is not installed")
    at = compare_models("induction")
    at.selectbox(key="cmp_model").set_value("minilm").run()
    assert_ok(at)
    said = no_common_kind(at)
    assert said, [i.value for i in at.info]
    assert "A: decoder self-attention" in said[0] and "B: encoder self-attention" in said[0], said
    assert not at.get("plotly_chart"), "nothing to draw side by side"


def test_a_link_to_two_models_with_no_kind_in_common_says_so():
    """A fresh session (no kind chosen before): the same message, not a radio with nothing to choose."""
    if "minilm" not in list_models():
        pytest.skip("MiniLM is not installed")
    at = AppTest.from_file("../app.py", default_timeout=120)
    at.query_params.update({"model": "induction", "cmp_what": "another model", "cmp_model": "minilm"})
    at.run()
    at.switch_page("pages/compare.py").run()
    assert_ok(at)
    assert no_common_kind(at), [i.value for i in at.info]


@pytest.mark.slow
@pytest.mark.parametrize("a", list_models())
def test_every_pair_of_shipped_models_compares_or_says_why_not(a):
    at = compare_models(a)
    for b in list_models():
        at.selectbox(key="cmp_model").set_value(b).run()
        assert_ok(at)
        assert at.get("plotly_chart") or no_common_kind(at), (a, b, [i.value for i in at.info])


def side_notices(at: AppTest, side: str) -> list[str]:
    return [w.value for w in at.warning if w.value.startswith(f"Side {side}: ")]


def test_side_b_text_its_model_cannot_read_gets_a_notice():
    """Sentence B with characters the reverse model never saw: a notice for B, as A would get one."""
    at = open_app("pages/compare.py", model="reverse")
    assert_ok(at)
    assert not side_notices(at, "B"), "the model's next example is its own kind of text"
    at.text_area(key="cmp_src").set_value("A B C").run()
    assert_ok(at)
    said = side_notices(at, "B")
    assert said and "cannot read" in said[0], [w.value for w in at.warning]
    assert not side_notices(at, "A"), "A's sentence is one of the model's examples"


def test_side_b_model_that_cannot_read_a_s_sentence_gets_a_notice():
    """The same sentence on another model: B's notice is about B's model reading it."""
    at = compare_models("en-de")
    at.selectbox(key="cmp_model").set_value("reverse").run()
    assert_ok(at)
    assert side_notices(at, "B"), [w.value for w in at.warning]
    assert not side_notices(at, "A"), [w.value for w in at.warning]


def test_a_targets_model_a_against_a_model_that_reads_none_compares_the_sentence():
    """A translation model with a target in the sidebar against a language model: B takes the sentence alone
    and says so, where side B had failed with "a language model reads one text ...: there is no target"."""
    at = open_app("pages/compare.py", model="reverse")
    at.text_input(key="tgt").set_value("o l l e h").run()
    at.radio(key="cmp_what").set_value("model").run()
    at.selectbox(key="cmp_model").set_value("induction").run()
    assert_ok(at)
    assert not at.error, [e.value for e in at.error]
    said = [c.value for c in at.caption if "reads no target" in c.value]
    assert len(said) == 1 and "o l l e h" not in said[0], [c.value for c in at.caption]
    assert at.get("plotly_chart"), "both sides drawn: the decoder's self-attention is in both"
    at.selectbox(key="cmp_model").set_value("reverse").run()  # a model that reads the target takes it again
    assert_ok(at)
    assert not [c.value for c in at.caption if "reads no target" in c.value]


@pytest.mark.parametrize("model", ["induction", "reverse"])
def test_another_sentence_offers_a_target_b_only_to_a_model_that_reads_one(model):
    """A language model's Compare page had a box "Target B (optional)": whatever was typed there failed side B."""
    at = open_app("pages/compare.py", model=model)
    assert_ok(at)
    boxes = [t for t in at.text_input if t.key == "cmp_tgt"]
    assert len(boxes) == (model == "reverse"), [t.label for t in at.text_input]
    assert at.get("plotly_chart")
