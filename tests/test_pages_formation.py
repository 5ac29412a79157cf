"""The page "How attention forms" in AppTest: it opens each history, steps, takes its step from a link, and says so
when a model has no history."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from conftest import open_app, open_from_link
from formation_histories import STEPS, write_history
from streamlit.testing.v1 import AppTest

from attnviz import api
from attnviz.app import CUSTOM_PATH
from attnviz.checkpoints.catalog import pretrained_dir
from attnviz.lessons import formation

PAGE = "pages/formation.py"
SHIPPED = ("reverse", "en-de", "induction")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_streamlit_caches", "visitor_roots")]  # about 7 s a test


@pytest.fixture(scope="module")
def histories(tmp_path_factory) -> dict[str, str]:
    """Copies of reverse and induction, each with a small history (tests/formation_histories.py): name -> folder."""
    into = tmp_path_factory.mktemp("formation")
    return {model: str(write_history(model, into)) for model in ("reverse", "induction")}


def open_history(folder: str, **params) -> AppTest:
    return open_from_link(PAGE, {"model": CUSTOM_PATH, "model_path": folder, **params})


def assert_ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def titles(at: AppTest) -> list[str]:
    return [(json.loads(c.proto.spec)["layout"].get("title") or {}).get("text") or "" for c in at.get("plotly_chart")]


def shown_step(at: AppTest) -> int:
    """The step the maps show, read from the first map's title (", step 300")."""
    first = titles(at)[0]
    assert ", step " in first, titles(at)
    return int(first.rsplit(", step ", 1)[1])


def set_aside(at: AppTest) -> list[str]:
    return [c.value for c in at.caption if c.value.startswith("Set aside from the link")]


@pytest.mark.parametrize("model", ["reverse", "induction"])
def test_the_page_opens_a_history_and_steps_through_it(histories, model):
    at = open_history(histories[model])
    assert_ok(at)
    assert shown_step(at) == STEPS[0]
    names = titles(at)
    assert any(t.endswith(", final") for t in names), names
    assert "Loss over training" in names
    assert any(t.startswith("Every head's") for t in names), names
    assert any("layers x" in t for t in names), "the grid of every head"
    assert any(t.startswith("The phase change") for t in names) == (model == "induction"), names
    at.select_slider(key="step").set_value(STEPS[3]).run()
    assert_ok(at)
    assert shown_step(at) == STEPS[3]
    at.button(key="_formation_next").click().run()
    assert shown_step(at) == STEPS[4]
    at.button(key="_formation_back").click().run()
    at.button(key="_formation_back").click().run()
    assert shown_step(at) == STEPS[2]
    at.button(key="_formation_last").click().run()
    assert shown_step(at) == STEPS[-1]
    at.button(key="_formation_next").click().run()
    assert shown_step(at) == STEPS[-1], "Next stops at the last record"
    at.button(key="_formation_first").click().run()
    assert shown_step(at) == STEPS[0]
    assert_ok(at)


def test_the_opening_head_is_the_one_whose_statistic_formed(histories):
    """Reverse opens on the cross head with the highest anti-diagonal share; the induction model on its card's head."""
    at = open_history(histories["induction"])
    assert at.selectbox(key="formation_head").value == "decoder-L2-H2", "the card's induction head"
    assert at.selectbox(key="formation_statistic").value == "induction"
    at.selectbox(key="formation_head").set_value("decoder-L1-H3").run()
    assert_ok(at)
    assert titles(at)[0] == f"{formation.head_name('decoder', 1, 3, short=True)}, step {STEPS[0]}"


@pytest.mark.parametrize(("raw", "step"), [("300", 300), ("260", 300), ("250", 200), ("-40", 0), ("99999", 600)])
def test_a_link_opens_at_its_step_or_the_nearest_recorded_one(histories, raw, step):
    at = open_history(histories["reverse"], step=raw)
    assert_ok(at)
    assert shown_step(at) == step
    assert at.select_slider(key="step").value == step
    assert not set_aside(at), "a step between records is moved onto one, not set aside"


@pytest.mark.parametrize("raw", ["abc", "1e309", "nan", "3,4"])
def test_a_malformed_step_in_the_link_is_set_aside(histories, raw):
    at = open_history(histories["reverse"], step=raw)
    assert_ok(at)
    assert shown_step(at) == STEPS[0]
    assert any("step=" in c for c in set_aside(at)), [c.value for c in at.caption]


def test_the_head_and_statistic_are_in_the_link(histories):
    at = open_history(histories["reverse"], formation_head="cross-L2-H1", formation_statistic="diagonal", step="400")
    assert_ok(at)
    assert titles(at)[0] == f"{formation.head_name('cross', 2, 1, short=True)}, step 400"
    assert "Every head's diagonal over training" in titles(at)
    assert not set_aside(at)


def test_a_model_without_a_history_gets_one_line():
    name = next(m for m in api.list_models() if not (pretrained_dir() / m / "history").is_dir())
    at = open_app(PAGE, name)
    assert_ok(at)
    said = [i.value for i in at.info]
    assert len(said) == 1 and "has no training history" in said[0], said
    assert not at.get("plotly_chart")


def test_a_history_without_a_record_gets_one_line_that_names_no_server_path(tmp_path):
    """A training killed before its first record leaves a manifest and no record: the page says so, and a
    visitor does not learn where the folder is on the server."""
    folder = write_history("reverse", tmp_path)
    for record in (folder / "history" / "records").iterdir():
        shutil.rmtree(record)
    at = open_history(str(folder.relative_to(tmp_path.parent)))
    assert not at.exception, [e.value for e in at.exception]
    said = [e.value for e in at.error]
    assert len(said) == 1 and "training history holds no record yet" in said[0], said
    assert str(tmp_path.parent) not in said[0], said


def test_another_models_history_beside_the_weights_is_one_line_and_nothing_drawn(tmp_path):
    """reverse's history in a copy of induction had been drawn as induction's, its maps under induction's name."""
    into = write_history("reverse", tmp_path / "histories")
    folder = tmp_path / "induction"
    shutil.copytree(pretrained_dir() / "induction", folder, ignore=shutil.ignore_patterns("history"))
    shutil.copytree(into / "history", folder / "history")
    at = open_history(str(folder.relative_to(tmp_path.parent)))
    assert not at.exception, [e.value for e in at.exception]
    said = [e.value for e in at.error]
    assert len(said) == 1 and "holds another model's training history: its history is an encoder-decoder's" in said[0]
    assert not at.get("plotly_chart") or not any(", step " in t for t in titles(at)), titles(at)


def test_a_history_with_no_value_of_any_statistic_draws_its_maps_and_says_why_there_is_no_chart(tmp_path):
    """A heads table of NaN alone had been offered statistic by statistic, each drawn as an empty chart."""
    folder = write_history("reverse", tmp_path)
    for table in (folder / "history" / "records").glob("*/heads.parquet"):
        heads = pd.read_parquet(table)
        pd.concat(
            [heads[list(formation.INDEX_COLUMNS)], heads.drop(columns=list(formation.INDEX_COLUMNS)) * np.nan], axis=1
        ).to_parquet(table)
    at = open_history(str(folder))
    assert_ok(at)
    assert "Statistic" not in [box.label for box in at.selectbox]
    said = [i.value for i in at.info]
    assert len(said) == 1 and "records no value of any statistic, so there is no chart of them" in said[0], said
    assert not any("over training" in t and "Loss" not in t for t in titles(at)), titles(at)
    assert shown_step(at) == STEPS[0] and "Loss over training" in titles(at), "its maps and losses are drawn"
    assert [c.value for c in at.caption if c.value.startswith("Not offered")] == [
        r"Not offered, with no value recorded at any step: diagonal, induction, mean\_distance, previous."  # markdown
    ]


@pytest.mark.slow
@pytest.mark.parametrize("model", SHIPPED)
def test_every_shipped_history_opens_and_steps(model):
    if not (pretrained_dir() / model / "history").is_dir():
        pytest.skip(f"{model} ships no history")
    at = open_app(PAGE, model)
    assert_ok(at)
    steps = at.select_slider(key="step").options
    assert len(steps) >= 3
    assert shown_step(at) == int(steps[0])
    middle = int(steps[len(steps) // 2])
    at.select_slider(key="step").set_value(middle).run()
    assert_ok(at)
    assert shown_step(at) == middle
    at.button(key="_formation_next").click().run()
    assert shown_step(at) == int(steps[len(steps) // 2 + 1])
    link = open_from_link(PAGE, {"model": model, "step": str(middle + 1)})
    assert_ok(link)
    assert shown_step(link) == middle, "a step just past a record opens on it"


def test_a_moved_step_survives_another_model_and_another_pages_step():
    """The step slider is bound to the link's step: a run within the visit never rewrites that parameter (Streamlit
    refuses it), the page moves the slider onto the new history's nearest record instead."""
    at = open_app(PAGE, "en-de")
    steps = [int(s) for s in at.select_slider(key="step").options]
    at.select_slider(key="step").set_value(str(steps[1])).run()
    assert_ok(at)
    at.sidebar.selectbox(key="model").set_value("induction").run()
    assert_ok(at)
    induction = [int(s) for s in at.select_slider(key="step").options]
    assert shown_step(at) == min(induction, key=lambda s: (abs(s - steps[1]), s))
    # the decoding page's step (the same parameter), then this page's slider moved
    at.switch_page("pages/decoding.py").run()
    at.slider(key="step").set_value(3).run()
    at.switch_page(PAGE).run()
    assert_ok(at)
    at.select_slider(key="step").set_value(str(induction[-1])).run()
    assert_ok(at)
    assert shown_step(at) == induction[-1]
