"""Every page opens a language model with no error: the shipped induction model, and random GPT-2,
Llama and Qwen2 folders opened as a visitor opens a folder (AppTest)."""

from __future__ import annotations

import pytest

from attnviz.app import CUSTOM_PATH, registry

pytest.importorskip("transformers")

from conftest import open_app  # noqa: E402
from lm_models import build  # noqa: E402

pytestmark = pytest.mark.slow  # every page, several models: the full suite

# Pages that say in one line why they do not show a language model yet (the rest must show it).
NOT_YET: dict[str, str] = {}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lms")
    for family in ("gpt2", "llama", "qwen2"):
        build(family, root / family)
    return root


def _errors(at) -> list[str]:
    return [e.value for e in at.exception] + [e.value for e in at.error]


@pytest.mark.parametrize("page", [page.path for page in registry.PAGES])
def test_every_page_opens_the_shipped_language_model(page, visitor_roots):
    at = open_app(page, "induction")
    assert not _errors(at), _errors(at)
    assert any("decoder-only" in c.value for c in at.sidebar.caption), "the model opened"
    assert at.sidebar.text_area(key="src").label == "Prompt", "the sidebar speaks of a prompt"
    assert not at.sidebar.get("text_input") or all(w.key != "tgt" for w in at.sidebar.text_input), "no target box"
    if page in NOT_YET:
        assert any(NOT_YET[page] in i.value for i in at.info), "it says why not, in one line"


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("page", [page.path for page in registry.PAGES])
def test_every_page_opens_a_hugging_face_language_model(page, family, folders, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(folders))
    at = open_app("app.py")
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    at.sidebar.text_input(key="model_path").set_value(str(folders / family)).run()
    at.sidebar.text_area(key="src").set_value("the cat sat on the mat").run()
    if page != "app.py":
        at.switch_page(page).run()
    assert not _errors(at), _errors(at)
    assert any("decoder-only" in c.value and family in c.value for c in at.sidebar.caption), "the model opened"


def test_the_linearity_page_shows_rope_on_a_rotary_model(folders, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(folders))
    at = open_app("app.py")
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    at.sidebar.text_input(key="model_path").set_value(str(folders / "llama")).run()
    at.switch_page("pages/linearity.py").run()
    assert not _errors(at), _errors(at)
    assert "Rotary positions: the rotation inside attention" in [h.value for h in at.header]
    table = next(d.value for d in at.dataframe if "shift" in d.value.columns)
    assert list(table["shift"]) == [1, 10, 100, 1000] and float(table["relative"].max()) < 1e-5
    charts = [c for c in at.get("plotly_chart") if "pair at every offset" in c.proto.spec]
    assert charts, "the score-by-offset chart is drawn"


def test_the_linearity_page_says_why_not_on_a_model_without_rope(visitor_roots):
    at = open_app("pages/linearity.py", "induction")
    assert not _errors(at), _errors(at)
    assert any("needs a model with rotary positions" in i.value for i in at.info)


def test_the_explorer_offers_queries_and_keys_before_and_after_the_rotation(folders, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(folders))
    at = open_app("app.py")
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    at.sidebar.text_input(key="model_path").set_value(str(folders / "qwen2")).run()
    at.switch_page("pages/explorer.py").run()
    at.selectbox(key="view").set_value("qk").run()
    assert not _errors(at), _errors(at)
    for which in ("after", "before"):
        at.radio(key="qk_rotation").set_value(which).run()
        assert not _errors(at), _errors(at)
        assert any("Q-K embedding" in c.proto.spec for c in at.get("plotly_chart"))
    assert any("content alone" in c.value or "without its" in c.value for c in at.caption)


@pytest.mark.parametrize(("family", "rotary"), [("llama", True), ("gpt2", False)])
def test_the_walkthrough_takes_a_language_model_through_every_stage(family, rotary, folders, monkeypatch):
    from attnviz.lessons import walkthrough as wk

    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(folders))
    at = open_app("app.py")
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    at.sidebar.text_input(key="model_path").set_value(str(folders / family)).run()
    at.switch_page("pages/walkthrough.py").run()
    stages = wk.stage_list(False, decoder_only=True, rotary=rotary)
    assert list(at.selectbox(key="wt_stage").options) == [title for _, title in stages]
    assert ("rope" in dict(stages)) == rotary, "the rotation is a stage of its own where positions are rotary"
    for key, title in stages:
        at.selectbox(key="wt_stage").set_value(key).run()
        assert not _errors(at), (key, _errors(at))
        assert at.subheader[0].value == title


def test_home_speaks_of_the_model_in_front_of_it(visitor_roots):
    """A translation model's home speaks of encoder, decoder and source; a language model's of its prompt."""

    def prose(at) -> str:
        return " ".join(m.value for m in at.markdown)

    at = open_app("app.py")
    assert "encoder-decoder Transformer" in prose(at) and "target rows by source columns" in prose(at)
    at.sidebar.selectbox(key="model").set_value("induction").run()
    assert not _errors(at), _errors(at)
    text = prose(at)
    assert "a language model" in text and "prompt rows by prompt columns" in text
    for wrong in ("encoder-decoder", "source columns", "the decoder, about to write"):
        assert wrong not in text, wrong


def test_the_explorers_introduction_speaks_of_the_model_in_front_of_it(visitor_roots):
    """en-de's introduction speaks of cross-attention and the source; a language model's of its causal rows."""

    def intro(at) -> str:
        return " ".join(c.value for c in at.caption)

    at = open_app("pages/explorer.py")
    assert "Cross-attention has target rows and source columns" in intro(at)
    at.sidebar.selectbox(key="model").set_value("induction").run()
    assert not _errors(at), _errors(at)
    text = intro(at)
    assert "never see a later token" in text, text
    for wrong in ("Cross-attention", "in the source"):
        assert wrong not in text, wrong


@pytest.mark.parametrize("page", ["pages/explorer.py", "app.py"])
def test_the_induction_model_opens_on_the_head_its_card_names(page, visitor_roots):
    from attnviz import api

    named = api.named_heads(api.load("induction"))["induction"]  # (layer, head) from the model's card
    at = open_app(page, "induction")
    assert not _errors(at), _errors(at)
    said = " ".join(c.value for c in at.caption)
    assert f"Layer {named[0]}, head {named[1]}: the induction head that this model's card names" in said, said
    if page == "pages/explorer.py":
        assert (at.selectbox(key="layer").value, at.selectbox(key="head").value) == named


@pytest.mark.parametrize(("model", "kind"), [("induction", "decoder"), ("en-de", "cross")])
def test_beyond_the_weights_hints_heads_the_model_has(model, kind, visitor_roots):
    """The empty ablation box names a layer and a head that are options of it: no cross:3 for a language model."""
    import re

    at = open_app("pages/beyond.py", model)
    assert not _errors(at), _errors(at)
    box = at.multiselect(key="bw_ablate")
    hinted = re.findall(r"\((\w+:[\d.]+)\)", box.proto.placeholder)
    assert len(hinted) == 2 and all(h.startswith(f"{kind}:") for h in hinted), box.proto.placeholder
    assert set(hinted) <= {shown.split()[0] for shown in box.options}, (hinted, box.options)  # "cross:3 (the whole…"


def test_beyond_the_weights_draws_every_method_for_a_language_model(visitor_roots):
    """Each contribution method, and grad-attention's relevance of a language model's tokens (it has no source)."""
    from attnviz.methods import METHODS

    at = open_app("pages/beyond.py", "induction")
    for method, spec in METHODS.items():
        at.radio(key="bw_method").set_value(method).run()
        assert not _errors(at), (method, _errors(at))
        if spec.uses_position:
            (bars,) = [c for c in at.get("plotly_chart") if "Relevance for" in c.proto.spec]
            assert '"tokens"' in bars.proto.spec and "source tokens" not in bars.proto.spec


def test_the_walkthrough_opens_a_language_model_on_its_last_position(visitor_roots):
    """Step 1 of a prompt reads one token (1x1 maps); the last position reads the whole prompt."""
    at = open_app("pages/walkthrough.py")  # en-de first: a model chosen later opens on its own step
    at.selectbox(key="wt_stage").set_value("dec_self").run()
    assert at.selectbox(key="wt_step").value == 1, "a translation opens on its first output step"
    at.sidebar.selectbox(key="model").set_value("induction").run()
    assert not _errors(at), _errors(at)
    step = at.selectbox(key="wt_step")
    n = len(step.options)
    assert n > 1 and step.value == n, (step.value, n)
    captions = " ".join(c.value for c in at.caption)
    assert f"shown: query: decoder input position x key: decoder input position = {n} x {n}" in captions, captions


@pytest.mark.parametrize(
    ("page", "key", "tab", "why"),
    [
        ("pages/mechanics.py", "mech_tab", "Permutation", "has no encoder"),
        ("pages/variants.py", "var_tab", "Pattern on the model", "has no encoder"),
    ],
)
def test_teaching_tabs_on_the_loaded_model_say_why_not_for_a_language_model(page, key, tab, why, visitor_roots):
    at = open_app(page, "induction")
    at.session_state[key] = tab  # as a click on the tab would
    at.run()
    assert not _errors(at), _errors(at)
    assert any(why in i.value for i in at.info)


@pytest.mark.parametrize(("model", "measured"), [(None, None), ("induction", "sinusoidal"), ("llama", "rotary")])
def test_the_linearity_page_measures_three_kinds_of_positions_alike(model, measured, folders, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(folders))
    at = open_app("app.py")
    if model == "llama":
        at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
        at.sidebar.text_input(key="model_path").set_value(str(folders / "llama")).run()
    elif model is not None:
        at.sidebar.selectbox(key="model").set_value(model).run()
    at.switch_page("pages/linearity.py").run()
    assert not _errors(at), _errors(at)
    assert "Three kinds of positions, measured alike" in [h.value for h in at.header]
    table = next(d.value for d in at.dataframe if "kind" in d.value.columns)
    assert list(table["kind"]) == ["sinusoidal", "learned", "rotary"]
    change = table.set_index("kind").iloc[:, 1]
    assert change.notna().sum() == (0 if measured is None else 1)
    if measured == "rotary":
        assert change["rotary"] < 1e-5
    if measured == "sinusoidal":
        assert change["sinusoidal"] > 0.1


def test_compare_puts_the_en_de_decoder_beside_a_language_model(folders, monkeypatch):
    """Two models on one text: en-de's decoder self-attention beside a GPT-2's, the kind both have."""
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(folders))
    at = open_app("pages/compare.py")
    at.radio(key="cmp_what").set_value("model").run()
    at.selectbox(key="cmp_model").set_value(CUSTOM_PATH).run()
    at.text_input(key="cmp_model_path").set_value(str(folders / "gpt2")).run()
    assert not _errors(at), _errors(at)
    assert at.radio(key="cmp_kind").options == ["decoder"], "the one kind both models have"
    titles = " ".join(c.proto.spec for c in at.get("plotly_chart"))
    assert titles.count("Decoder self-attention") >= 2, "a map for each side"
