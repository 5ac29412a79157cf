"""The positional-encoding and linearity pages run, on defaults and after every control changes (AppTest).

Like tests/test_app.py, each test opens app.py and switches page; the page then runs alone and
draws the shared sidebar itself. The loaded-model sections run with the shipped models and with
tiny checkpoints whose positions are learned or absent.
"""

from __future__ import annotations

import pytest
from conftest import open_app, seeded_model, tiny_config
from streamlit.testing.v1 import AppTest

from attnviz.app import CUSTOM_PATH
from attnviz.checkpoints.native import save_checkpoint

POSITIONAL, LINEARITY = "pages/positional.py", "pages/linearity.py"


pytestmark = pytest.mark.usefixtures("fresh_streamlit_caches", "visitor_roots")


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory, tiny_spm) -> dict[str, str]:
    """Checkpoint directories of tiny models (64 positions, d_model 32) with learned and with no positions."""
    dirs = {}
    for kind in ("learned", "none"):
        out = tmp_path_factory.mktemp(kind)
        save_checkpoint(seeded_model(tiny_config(pos_encoding=kind)), out, tiny_spm, {"name": kind}, "# tiny\n")
        dirs[kind] = str(out)
    return dirs


def assert_ok(at: AppTest, errors: bool = False) -> None:
    assert not at.exception, [e.value for e in at.exception]
    if not errors:
        assert not at.error, [e.value for e in at.error]


def texts(at: AppTest) -> str:
    return " ".join(e.value for kind in ("caption", "info", "warning", "markdown") for e in at.get(kind))


def chart_names(at: AppTest) -> str:
    return " ".join(c.proto.spec for c in at.get("plotly_chart"))


def use_checkpoint(at: AppTest, path: str) -> None:
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    at.sidebar.text_input(key="model_path").set_value(path).run()


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
@pytest.mark.parametrize("page", [POSITIONAL, LINEARITY])
def test_page_runs_on_defaults_and_opens_with_an_explanation(page):
    at = open_app(page)
    assert_ok(at)
    assert at.sidebar.selectbox(key="model").value == "en-de"
    first, second = list(at.main.children.values())[:2]
    assert first.type == "title" and second.type == "markdown", "the page opens with its explanation"
    assert 2 <= second.value.count(". ") + 1 <= 4, "two or three sentences"
    assert len(at.get("plotly_chart")) >= 6
    assert len(at.caption) >= len(at.get("plotly_chart")) - 1, "every chart has a caption"


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_positional_defaults_show_the_models_positions():
    at = open_app(POSITIONAL)
    assert "en-de: sinusoidal positions" in texts(at)
    assert "en-de (sinusoidal)" in chart_names(at)
    assert texts(at).count("depends on the offset only") >= 2  # the page's sinusoids and the model's


@pytest.mark.slow
def test_positional_every_control():
    at = open_app(POSITIONAL)
    changes = [
        ("selectbox", "pe_d_model", 1024),
        ("slider", "pe_length", 512),
        ("number_input", "pe_base", 10.0),
        ("radio", "pe_layout", "concat"),
        ("multiselect", "pe_dims", [0, 1, 1023]),
        ("toggle", "pe_cosine", True),
        ("selectbox", "pe_d_model", 16),  # the chosen dimension 1023 no longer exists
        ("slider", "pe_length", 8),
        ("number_input", "pe_base", 1.0),
        ("multiselect", "pe_dims", []),
    ]
    for widget, key, value in changes:
        getattr(at, widget)(key=key).set_value(value).run()
        assert_ok(at)
        assert len(at.get("plotly_chart")) >= 5, (key, value)
    assert at.multiselect(key="pe_dims").value == []
    assert any("at least one dimension" in i.value for i in at.info)
    at.selectbox(key="pe_d_model").set_value(1024).run()
    at.multiselect(key="pe_dims").set_value([1, 1023]).run()
    at.selectbox(key="pe_d_model").set_value(16).run()
    assert_ok(at)
    assert at.multiselect(key="pe_dims").value == [1]


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_linearity_defaults_show_rounding_only_and_the_models_fit():
    at = open_app(LINEARITY)
    assert "Largest residual over every position: **1.19e-07**" in texts(at)  # float32 table by default
    assert "en-de (sinusoidal)" in chart_names(at) and "random table" in chart_names(at)


@pytest.mark.slow
def test_linearity_every_control():
    at = open_app(LINEARITY)
    changes = [
        ("selectbox", "lin_d_model", 1024),
        ("selectbox", "lin_dim", 1023),
        ("slider", "lin_pair", 511),
        ("selectbox", "lin_d_model", 64),  # dimension 1023 and pair 511 no longer exist
        ("number_input", "lin_base", 1e8),
        ("radio", "lin_layout", "concat"),
        ("slider", "lin_length", 512),
        ("slider", "lin_k", 256),
        ("radio", "lin_precision", "float64"),
        ("select_slider", "lin_start", 10_000_000),
        ("radio", "lin_precision", "float32 angles"),
        ("slider", "lin_k_max", 128),
        ("slider", "lin_length", 32),  # k = 256 no longer fits
        ("slider", "lin_k_max", 1),
        ("number_input", "lin_base", 1.0),
        ("selectbox", "lin_d_model", 16),
    ]
    for widget, key, value in changes:
        getattr(at, widget)(key=key).set_value(value).run()
        assert_ok(at)
        assert len(at.get("plotly_chart")) >= 6, (key, value)
        if key == "lin_d_model" and value == 64:  # the largest pair (31), not the default (16)
            assert at.selectbox(key="lin_dim").value == 0 and at.slider(key="lin_pair").value == 31
    assert at.slider(key="lin_k").value == 31


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_linearity_float32_angles_at_large_positions_break_the_shift():
    at = open_app(LINEARITY)
    at.radio(key="lin_precision").set_value("float64").run()
    assert "Largest residual over every position: **" in texts(at)
    small = float(texts(at).split("Largest residual over every position: **")[1].split("**")[0])
    at.radio(key="lin_precision").set_value("float32 angles").run()
    at.select_slider(key="lin_start").set_value(10_000_000).run()
    assert_ok(at)
    large = float(texts(at).split("Largest residual over every position: **")[1].split("**")[0])
    assert small < 1e-12 and large > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("page", [POSITIONAL, LINEARITY])
def test_pages_with_the_reverse_model(page):
    at = open_app(page)
    at.sidebar.selectbox(key="model").set_value("reverse").run()
    assert_ok(at)
    assert "reverse (sinusoidal)" in chart_names(at)


@pytest.mark.slow
def test_two_models_of_one_name_each_get_their_own_fit(tmp_path_factory, tiny_spm):
    """The fit chart is shared between sessions by what it shows: two folders whose cards give one name (two
    students' trainings of one task) must not share a curve (an audit: the second got the first's)."""
    import json

    curves = []
    for seed in (0, 1):
        out = tmp_path_factory.mktemp("twin")
        save_checkpoint(
            seeded_model(tiny_config(pos_encoding="learned"), seed=seed), out, tiny_spm, {"name": "twin"}, ""
        )
        at = open_app(LINEARITY)
        use_checkpoint(at, str(out))
        at.slider(key="lin_k_max").set_value(16).run()
        assert_ok(at)
        traces = [t for c in at.get("plotly_chart") for t in json.loads(c.proto.spec)["data"]]
        curves.append(next(t["y"] for t in traces if t.get("name") == "twin (learned)"))
    assert curves[0] != curves[1]


@pytest.mark.slow
@pytest.mark.parametrize("page", [POSITIONAL, LINEARITY])
def test_a_rotary_model_is_not_said_to_see_a_set(page):
    """induction-long adds no table, yet its attention depends on positions: said so, not 'sees a set'."""
    at = open_app(page, "induction-long")
    assert_ok(at)
    said = texts(at)
    assert "uses rotary positions" in said and "as a set" not in said and "no positional encoding" not in said


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_positional_with_learned_and_without_positions(tiny_checkpoints):
    at = open_app(POSITIONAL)
    use_checkpoint(at, tiny_checkpoints["learned"])
    assert_ok(at)
    assert "learned positions, a table of 64 × 32" in texts(at)
    assert "(it depends on p too)" in texts(at)
    assert "(learned)" in chart_names(at)
    use_checkpoint(at, tiny_checkpoints["none"])
    assert_ok(at)
    assert "adds no positional encoding" in texts(at)
    assert len(at.get("plotly_chart")) >= 5, "the sinusoid sections still show"


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_linearity_with_learned_and_without_positions(tiny_checkpoints):
    at = open_app(LINEARITY)
    use_checkpoint(at, tiny_checkpoints["learned"])
    assert_ok(at)
    assert "any table would fit exactly" in texts(at), "64 positions minus k = 64 leave too few pairs"
    at.slider(key="lin_k_max").set_value(16).run()
    assert_ok(at)
    assert "(learned)" in chart_names(at)
    use_checkpoint(at, tiny_checkpoints["none"])
    assert_ok(at)
    assert "has no positional encoding" in texts(at)


@pytest.mark.slow
@pytest.mark.parametrize("page", [POSITIONAL, LINEARITY])
def test_pages_without_a_usable_model_still_teach(page):
    at = open_app(page)
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    assert_ok(at)
    assert "Choose a model in the sidebar" in texts(at)
    at.sidebar.text_input(key="model_path").set_value("/no/such/dir").run()
    assert_ok(at, errors=True)
    assert at.error and "not a model folder this server lets visitors open" in at.error[0].value
    assert len(at.get("plotly_chart")) >= 5
