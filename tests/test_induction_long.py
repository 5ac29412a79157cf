"""The shipped long-context language model, pretrained/induction-long: what its card says at 4,095 tokens holds.

The card states each head's previous-token, induction and first-token scores on its shipped probe
(2,047 distinct random words, then the same again), measured as the explorer's long view measures
them: tile by tile (`attnviz.tiled_attention`). Here they are measured again, the named heads are
checked to do what the card says at that length, and some rows are recomputed without attnviz's
attention at all: the queries and keys before the rotation, turned by numpy (float64), softmax by hand.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re

import numpy as np
import pytest
import torch

import attnviz
from attnviz.checkpoints.catalog import pretrained_dir
from attnviz.lessons import rotary
from attnviz.tiles import scan
from attnviz.training.data import LONG_WORDS, get_task, long_probe
from attnviz.training.lm import LONG_SCORES, repeat_accuracy
from attnviz.training.recipes import RECIPES

NAME = "induction-long"
FOLDER = pretrained_dir() / NAME
SCORE_TOL = 2e-3  # the card's scores were measured on the machine that trained it (CUDA); here on the CPU


@pytest.fixture(scope="module")
def info() -> dict:
    return json.loads((FOLDER / "config.json").read_text())


@pytest.fixture(scope="module")
def card() -> str:
    return (FOLDER / "README.md").read_text()


@pytest.fixture(scope="module")
def bundle():
    return attnviz.load(NAME, device="cpu")


@pytest.fixture(scope="module")
def probe() -> str:
    return (FOLDER / "probe.txt").read_text().strip()


@pytest.fixture(scope="module")
def tiled(bundle, probe):
    return attnviz.tiled_attention(bundle, probe)


def named(info: dict, role: str) -> tuple[int, int]:
    layer, head = re.fullmatch(r"layer (\d+) head (\d+)", info["heads"][role]).groups()
    return int(layer), int(head)


def card_long_table(card: str) -> dict[str, np.ndarray]:
    """The card's table of scores on the long probe, parsed: {previous, induction, bos: (L, H)}."""
    section = card.split("**Long texts.**")[1].split("**Data.**")[0]
    rows = re.findall(r"\| layer (\d+) head (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", section)
    L, H = max(int(r[0]) for r in rows), max(int(r[1]) for r in rows)
    out = {name: np.full((L, H), np.nan) for name in LONG_SCORES}
    for layer, head, *values in rows:
        for name, value in zip(LONG_SCORES, values, strict=True):
            out[name][int(layer) - 1, int(head) - 1] = float(value)
    return out


def numpy_rotation(x: np.ndarray, theta: float) -> np.ndarray:
    """x (H, T, D) turned by each position's angles, dimension i paired with i + D/2 (float64, no torch)."""
    D = x.shape[-1]
    half = D // 2
    angle = np.arange(x.shape[1], dtype=np.float64)[:, None] * theta ** (-np.arange(half) * 2.0 / D)[None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * np.cos(angle) - b * np.sin(angle), b * np.cos(angle) + a * np.sin(angle)], axis=-1)


def test_the_model_takes_4096_tokens_with_rotary_positions_and_is_small(info):
    model = info["model"]
    assert model["pos_encoding"] == "rotary" and model["max_len"] >= 4096
    assert model["n_enc_layers"] == 0 and model["n_dec_layers"] == 2 and model["n_heads"] == 4
    assert model["tgt_vocab_size"] == 4 + len(LONG_WORDS), "one piece per made-up word, after the 4 special ids"
    weights = (FOLDER / "model.safetensors").stat().st_size
    assert weights < 5e6, f"{weights / 1e6:.1f} MB of weights: a few MB at most"
    assert NAME in attnviz.list_models()


def test_the_config_records_the_recipe_and_the_card_the_command(info, card):
    assert info["recipe"] == dataclasses.asdict(RECIPES[NAME]), "the shipped model is the recipe's"
    assert f"attnviz train {NAME} --out pretrained/{NAME} --seed {info['seed']}\n" in card
    for role in ("previous-token", "induction"):
        assert f"**{info['heads'][role]}**" in card, f"the card names the {role} head"
    assert f"**{info['metrics']['repeat_accuracy']:.4f}**" in card
    assert f"**{info['long_text']['repeat_accuracy']:.4f}**" in card


@pytest.mark.slow
def test_the_shipped_probe_is_the_generators_and_repeats_no_word_by_chance(info, probe, bundle):
    assert probe == long_probe(0), "probe.txt is long_probe(0), the text the card was measured on"
    words = probe.split()
    half = len(words) // 2
    assert words[:half] == words[half:] and len(set(words[:half])) == half == 2047
    ids = bundle.tokenizer.encode_source(probe).ids
    assert len(ids) == info["long_text"]["tokens"] == 4095 and bundle.tokenizer.unk_id not in ids


def test_the_cards_long_table_is_the_configs(info, card):
    table = card_long_table(card)
    for name in LONG_SCORES:
        written = np.vectorize(lambda v: float(f"{v:.3f}"))(np.array(info["long_text"]["heads"][name]))
        np.testing.assert_allclose(table[name], written, atol=1e-9, err_msg=name)


@pytest.mark.slow
def test_the_cards_scores_at_4095_tokens_are_what_the_long_view_measures(info, tiled):
    stats = tiled.statistics("decoder")
    assert tiled.shape("decoder") == (2, 4, 4095, 4095)
    for name in LONG_SCORES:
        measured = stats[name].to_numpy().reshape(2, 4)
        np.testing.assert_allclose(measured, info["long_text"]["heads"][name], atol=SCORE_TOL, err_msg=name)


@pytest.mark.slow
def test_the_named_heads_keep_their_roles_at_4095_tokens(info, tiled):
    """Uniform weight over 4,000 keys would be 0.00025: the named heads are far above any chance."""
    stats = tiled.statistics("decoder").set_index(["layer", "head"])
    previous, induction = named(info, "previous-token"), named(info, "induction")
    assert previous[0] == 1 and induction[0] == 2
    assert stats.loc[previous, "previous"] > 0.9
    assert stats.loc[previous, "previous"] == stats.xs(1, level="layer")["previous"].max()
    assert stats.loc[induction, "induction"] > 0.5
    assert stats.xs(1, level="layer")["induction"].max() < 0.01, "layer 1 cannot do induction"
    assert (stats["bos"] < 0.1).all(), "no head parks its weight on <s>"


@pytest.mark.slow
def test_rows_recomputed_by_hand_from_the_unrotated_vectors(info, bundle, probe, tiled):
    """Per-row weights of the named heads, from the queries and keys before the rotation, turned and
    normalised in numpy (float64), against the tile-by-tile scan's per-row values."""
    ids = torch.tensor([bundle.tokenizer.encode_source(probe).ids])
    tokens = tiled.tokens("decoder")[0]
    period = 2047
    rows = np.linspace(period + 1, 4094, 24).astype(int)  # queries of the repeated half
    for role, statistic, target in (
        ("previous-token", "previous", rows - 1),
        ("induction", "induction", rows - period + 1),
    ):
        layer, head = named(info, role)
        q, k = (x[head - 1 : head].double().numpy() for x in rotary.unrotated(bundle, ids, layer - 1))
        q, k = numpy_rotation(q, bundle.config.rope_theta)[0], numpy_rotation(k, bundle.config.rope_theta)[0]
        scanned = scan(tiled.head("decoder", layer, head), "decoder", tokens=tokens)
        for row, key in zip(rows, target, strict=True):
            scores = k[: row + 1] @ q[row] / np.sqrt(q.shape[-1])
            weights = np.exp(scores - scores.max())
            weights /= weights.sum()
            # the scan keeps each row's normaliser in float32: a sharp head's scores near 100 leave ~1e-5
            assert scanned.rows[statistic][row] == pytest.approx(weights[key], abs=3e-5)
            assert scanned.rows["bos"][row] == pytest.approx(weights[0], abs=3e-5)
        mean = float(np.mean([scanned.rows[statistic][r] for r in rows]))
        assert mean > 0.5, f"the {role} head on sampled rows"


@pytest.mark.slow
def test_the_repeated_half_of_the_probe_is_predicted_as_the_card_says(info, bundle, probe):
    accuracy = repeat_accuracy(bundle.model, bundle.tokenizer, [probe])
    assert accuracy == pytest.approx(info["long_text"]["repeat_accuracy"], abs=2 / 2047)
    words = probe.split()
    cut = 2047 + 1000  # inside the repeated half: the next words are those 2,046 positions back
    assert attnviz.generate(bundle, " ".join(words[:cut]), max_new=3).split() == words[cut : cut + 3]


@pytest.mark.slow
def test_the_stated_held_out_accuracy_holds(info, bundle):
    m = info["metrics"]
    texts = [t for t, _ in get_task(NAME).pairs(m["n"], m["seed"], "heldout")]
    accuracy = repeat_accuracy(bundle.model, bundle.tokenizer, texts)
    assert accuracy == pytest.approx(m["repeat_accuracy"], abs=2 / m["n"])
    assert accuracy >= RECIPES[NAME].target_exact_match


def _errors(at) -> list[str]:
    return [e.value for e in at.exception] + [e.value for e in at.error]


@pytest.mark.slow
def test_the_linearity_pages_rope_section_runs_on_the_shipped_model(fresh_streamlit_caches):
    """The section no other shipped model can show: a shift of both positions changes the scores by rounding."""
    from conftest import open_app

    at = open_app("pages/linearity.py", NAME)
    assert not _errors(at), _errors(at)
    assert "Rotary positions: the rotation inside attention" in [h.value for h in at.header]
    assert not any("needs a model with rotary positions" in i.value for i in at.info)
    table = next(d.value for d in at.dataframe if "shift" in d.value.columns)
    assert list(table["shift"]) == [1, 10, 100, 1000] and float(table["relative"].max()) < 1e-5
    assert any("pair at every offset" in c.proto.spec for c in at.get("plotly_chart"))
    kinds = next(d.value for d in at.dataframe if "kind" in d.value.columns).set_index("kind")
    moved = next(c for c in kinds.columns if c.startswith("every position moved"))
    assert kinds.loc["rotary", moved] < 1e-5 and np.isnan(kinds.loc["sinusoidal", moved])
    at.selectbox(key="lin_rope_layer").set_value(2).run()
    assert not _errors(at), _errors(at)


@pytest.mark.slow
def test_the_walkthrough_shows_the_rotation_on_the_shipped_model(fresh_streamlit_caches):
    from conftest import open_app

    from attnviz.lessons import walkthrough as wk

    at = open_app("pages/walkthrough.py", NAME)
    stages = wk.stage_list(False, decoder_only=True, rotary=True)
    assert "rope" in dict(stages)
    assert list(at.selectbox(key="wt_stage").options) == [title for _, title in stages]
    for key, title in stages:
        at.selectbox(key="wt_stage").set_value(key).run()
        assert not _errors(at), (key, _errors(at))
        assert at.subheader[0].value == title


def test_batches_are_cut_where_their_padding_would_pass_the_token_budget():
    from attnviz.training.lm import text_batches

    texts = [" ".join(["w"] * n) for n in (3, 3, 10, 3, 3, 3, 50, 3)]
    sizes = [[len(t.split()) for t in batch] for batch in text_batches(iter(texts), 4, 30)]
    assert sizes == [[3, 3, 10], [3, 3, 3], [50], [3]], "3 x 10 fits 30, 4 x 10 does not; 50 goes alone"
    plain = [[len(t.split()) for t in batch] for batch in text_batches(iter(texts), 3)]
    assert plain == [[3, 3, 10], [3, 3, 3], [50, 3]], "without a budget: batches of `size` texts in stream order"


def test_the_long_stream_draws_long_repeats_from_its_own_split():
    from attnviz.training.data import LONG_INDUCTION_LENGTHS, LONG_INDUCTION_LONGEST, is_heldout

    task = get_task(NAME)
    for long, (lo, hi) in ((False, LONG_INDUCTION_LENGTHS), (True, LONG_INDUCTION_LONGEST)):
        for split in ("train", "heldout"):
            for text, _ in task.pairs(20, 0, split) if not long else itertools.islice(task.stream(0, split, True), 20):
                words = text.split()
                half = len(words) // 2
                assert lo <= half <= hi and words[:half] == words[half:] and len(set(words[:half])) == half
                assert set(words) <= set(LONG_WORDS) and is_heldout(text) == (split == "heldout")
    with pytest.raises(ValueError, match="no long pairs"):
        next(get_task("induction").stream(0, "train", long=True))


@pytest.mark.slow
def test_a_short_training_run_writes_the_long_card_and_its_probe(tmp_path):
    """`attnviz train induction-long` end to end, a few steps: the card's long table is the config's."""
    from attnviz.cli import main

    out = tmp_path / "model"
    assert main(["train", NAME, "--out", str(out), "--steps", "3", "--batch-size", "4", "--eval-n", "5"]) == 0
    written = json.loads((out / "config.json").read_text())
    assert (out / "probe.txt").read_text().strip() == long_probe(0)
    assert written["long_text"]["tokens"] == 4095 and written["recipe"]["steps"] == 3
    table = card_long_table((out / "README.md").read_text())
    for name in LONG_SCORES:
        written_values = np.vectorize(lambda v: float(f"{v:.3f}"))(np.array(written["long_text"]["heads"][name]))
        np.testing.assert_allclose(table[name], written_values, atol=1e-9)
    reloaded = attnviz.load(str(out), device="cpu")
    assert reloaded.config.pos_encoding == "rotary" and reloaded.config.max_len == 4096
