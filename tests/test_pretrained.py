"""Acceptance tests on the shipped checkpoints: invariants, snapshots, stated metrics, size."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import attnviz
from attnviz.decoding import greedy_decode
from attnviz.tokenizer import pad_batch
from attnviz.training.data import get_task
from attnviz.training.recipes import RECIPES
from attnviz.training.seq2seq import exact_match

sys.path.insert(0, str(Path(__file__).parent / "golden"))
from regenerate import INPUTS, golden_path  # noqa: E402

SHIPPED = ["en-de", "reverse"]
ATOL = 1e-5  # across CPUs (AVX2 vs AVX-512) results differ around 1e-6 (docs/tolerances.md)


@pytest.fixture(scope="module", params=SHIPPED)
def bundle(request):
    return attnviz.load(request.param, device="cpu")


def test_every_shipped_model_is_listed():
    assert set(SHIPPED) <= set(attnviz.list_models())
    assert attnviz.DEFAULT_MODEL in SHIPPED


def test_checkpoint_files_and_size(bundle):
    names = {p.name for p in bundle.path.iterdir()}
    assert {"config.json", "model.safetensors", "spm.model", "README.md"} <= names
    total = sum(p.stat().st_size for p in bundle.path.iterdir())
    assert total <= 20 * 1024 * 1024, f"{bundle.name} weighs {total / 1e6:.1f} MB, over the 20 MB budget"
    card = (bundle.path / "README.md").read_text()
    assert f"attnviz train {bundle.name} --out pretrained/{bundle.name}" in card
    assert f"{bundle.info['metrics']['exact_match']:.4f}" in card


def test_training_time_within_budget(bundle):
    assert bundle.info["train_minutes"] <= 45


def _sources(bundle, n=6, seed=7):
    return [s for s, _ in get_task(bundle.info["task"]).pairs(n, seed, "heldout")]


def test_invariants_on_a_padded_batch(bundle):
    model, tok = bundle.model, bundle.tokenizer
    sources = _sources(bundle)
    src, src_valid = pad_batch([tok.encode_source(s).ids for s in sources], tok.pad_id)
    outs = greedy_decode(model, src, src_valid, max_len=64)
    tgt, tgt_valid = pad_batch([(tok.bos_id, *o) for o in outs], tok.pad_id)
    assert not src_valid.all() and not tgt_valid.all(), "the batch must actually be padded"
    attn = model(src, tgt, src_valid, tgt_valid, return_attention=True).attention
    S, T = src.shape[1], tgt.shape[1]
    causal_zero = ~torch.ones(T, T, dtype=torch.bool).tril()
    for kind, maps, q_valid, k_valid, shape in (
        ("encoder", attn.encoder, src_valid, src_valid, (S, S)),
        ("decoder", attn.decoder, tgt_valid, tgt_valid, (T, T)),
        ("cross", attn.cross, tgt_valid, src_valid, (T, S)),
    ):
        assert len(maps) == (model.cfg.n_enc_layers if kind == "encoder" else model.cfg.n_dec_layers)
        for w in maps:
            assert w.shape == (len(sources), model.cfg.n_heads, *shape), kind
            assert torch.isfinite(w).all()
            rows = w.sum(-1)  # (B, H, Q)
            real = q_valid[:, None, :].expand_as(rows)
            torch.testing.assert_close(rows[real], torch.ones_like(rows[real]), atol=1e-5, rtol=0)
            padded_keys = ~k_valid[:, None, None, :].expand_as(w)
            assert (w[padded_keys] == 0).all(), f"{kind}: weight on a padded key"
            if kind == "decoder":
                assert (w[..., causal_zero] == 0).all(), "decoder attends to a future position"


def test_shapes_match_token_counts(bundle):
    src = _sources(bundle, 1)[0]
    export = attnviz.attention(bundle, src)
    S, T = len(export.src_tokens), len(export.tgt_tokens)
    L, H = bundle.config.n_dec_layers, bundle.config.n_heads
    assert export.encoder.shape == (bundle.config.n_enc_layers, H, S, S)
    assert export.decoder.shape == (L, H, T, T)
    assert export.cross.shape == (L, H, T, S)  # target rows by source columns
    assert len(export.src_ids) == S and len(export.tgt_ids) == T


@pytest.mark.parametrize("model", SHIPPED)
@pytest.mark.parametrize("index", [0, 1, 2])
def test_snapshot(model, index, attention_snapshot):
    """The plugin's fixture, on golden files kept in tests/golden/ (written by regenerate.py)."""
    golden = attnviz.load_export(golden_path(model, index))
    bundle = attnviz.load(model, device="cpu")
    assert golden.manifest["checkpoint_sha256"] == bundle.sha256, (
        f"pretrained/{model} changed since the golden files were made: "
        "run `python tests/golden/regenerate.py` and review the diff"
    )
    src, tgt = INPUTS[model][index]
    attention_snapshot(attnviz.attention(bundle, src, tgt), path=golden_path(model, index), atol=ATOL)


@pytest.mark.slow
def test_stated_metric_holds(bundle):
    """The exact match written in the model card, recomputed on the same fresh held-out pairs."""
    m = bundle.info["metrics"]
    pairs = get_task(bundle.info["task"]).pairs(m["n"], m["seed"], "heldout")
    em, _ = exact_match(bundle.model, bundle.tokenizer, pairs)
    assert em == pytest.approx(m["exact_match"], abs=2 / m["n"])
    assert em >= RECIPES[bundle.info["task"]].target_exact_match


def test_en_de_cross_attention_shows_the_reordering():
    """German puts the ones before the tens: 'twenty-one' -> 'ein und zwanzig'. Some cross-attention
    head must look from 'ein' to 'one' and from 'zwanzig' to 'twenty'."""
    bundle = attnviz.load("en-de", device="cpu")
    export = attnviz.attention(bundle, "twenty-one", "einundzwanzig")
    src, tgt = list(export.src_tokens), list(export.tgt_tokens)
    # The decoder row that predicts a piece is the position before it.
    q_one, q_twenty = tgt.index("ein") - 1, tgt.index("zwanzig") - 1
    k_one, k_twenty = src.index("one"), src.index("▁twenty")
    cross = export.cross  # (L, H, T, S)
    assert (cross[:, :, q_one, k_one] > 0.5).any()
    assert (cross[:, :, q_twenty, k_twenty] > 0.5).any()


def test_config_json_records_the_recipe(bundle):
    data = json.loads((bundle.path / "config.json").read_text())
    assert data["format"] == "attnviz" and data["task"] == bundle.name
    assert data["recipe"]["label_smoothing"] == 0.1
