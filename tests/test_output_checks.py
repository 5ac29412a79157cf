"""What a picture or an export may show: never non-finite numbers, never an unfinished output unannounced."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import open_app, seeded_model, tiny_config
from safetensors.torch import load_file, save_file

import attnviz
from attnviz.app import CUSTOM_PATH
from attnviz.checkpoints.native import WEIGHTS_FILE, save_checkpoint
from attnviz.cli import main
from attnviz.errors import NonFiniteError

SRC = "a b c"


@pytest.fixture(scope="module")
def rambling(tmp_path_factory, tiny_spm):
    """A random model: it never writes the end token, so greedy decoding runs to the length limit."""
    folder = tmp_path_factory.mktemp("rambling") / "rambling"
    save_checkpoint(seeded_model(tiny_config(), seed=5), folder, tiny_spm, {"name": "rambling"}, "")
    return folder


@pytest.fixture(scope="module")
def overflowing(tmp_path_factory, tiny_spm):
    """Finite weights so large that every attention score overflows: the maps would be NaN."""
    folder = tmp_path_factory.mktemp("overflowing") / "overflowing"
    save_checkpoint(seeded_model(tiny_config(), seed=5), folder, tiny_spm, {"name": "overflowing"}, "")
    tensors = load_file(str(folder / WEIGHTS_FILE))
    for name in tensors:
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            tensors[name] = tensors[name] * 1e30
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "attnviz"})
    return folder


def test_an_output_cut_at_the_length_limit_is_said(rambling, caplog):
    bundle = attnviz.load(str(rambling), device="cpu")
    with caplog.at_level(logging.WARNING, logger="attnviz"):
        attnviz.translate(bundle, SRC)
    assert "stopped at the length limit" in caplog.text
    export = attnviz.attention(bundle, SRC)
    limit = export.manifest["max_output_tokens"]
    assert export.manifest["tgt_truncated"] is True and len(export.tgt_ids) == limit + 1
    assert attnviz.step_through(bundle, SRC, beam=2).truncated
    finished = attnviz.attention(attnviz.load("reverse", device="cpu"), "a b c")
    assert finished.manifest["tgt_truncated"] is False


def test_the_cli_warns_of_a_cut_output_on_stderr(rambling, capsys):
    assert main(["translate", "--model", str(rambling), SRC]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "attnviz: warning: the output stopped at the length limit" in captured.err


def test_non_finite_maps_are_refused_not_drawn(overflowing, capsys):
    bundle = attnviz.load(str(overflowing), device="cpu")
    with torch.no_grad():
        raw = bundle.model(torch.tensor([bundle.tokenizer.encode_source(SRC).ids]), return_attention=True)
    assert torch.isnan(raw.attention.encoder[0]).any(), "the test model must really overflow"
    for call in (attnviz.attention, attnviz.api.attention_scores, attnviz.api.forward_pass):
        with pytest.raises(NonFiniteError, match="NaN or infinite"):
            call(bundle, SRC, "a")
    assert main(["attention", "--model", str(overflowing), "--src", SRC, "--tgt", "a", "--out", "x.npz"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_streamlit_caches", "visitor_roots")
@pytest.mark.parametrize("page", ["app.py", "pages/explorer.py", "pages/decoding.py", "pages/walkthrough.py"])
def test_the_app_says_so_instead_of_drawing(page, rambling, overflowing):
    at = open_app("app.py")
    at.sidebar.selectbox(key="model").set_value(CUSTOM_PATH).run()
    at.sidebar.text_input(key="model_path").set_value(str(rambling)).run()
    at.sidebar.text_area(key="src").set_value(SRC).run()
    if page != "app.py":
        at.switch_page(page).run()
    assert not at.exception
    if page != "pages/walkthrough.py":
        assert any("length limit" in w.value for w in at.warning), page
    at.sidebar.text_input(key="model_path").set_value(str(overflowing)).run()
    at.sidebar.text_area(key="src").set_value(SRC).run()  # a new model starts from its own (here no) example
    assert not at.exception
    assert any("NaN or infinite" in e.value for e in at.error), page
    assert not at.get("plotly_chart"), "no picture of non-finite numbers"
