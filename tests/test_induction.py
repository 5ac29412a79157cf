"""The shipped language model, pretrained/induction: its card's heads are what its maps show.

As the reverse model's cross-attention is tested to be the anti-diagonal, this model's named heads
are tested on fresh probes (repeated random letters, drawn here): the previous-token head puts its
weight on the token before, and the induction head on the token after the current token's earlier
occurrence. The scores are computed here with plain loops over the exported maps.
"""

from __future__ import annotations

import json
import random
import re
import string

import numpy as np
import pytest
import torch

import attnviz
from attnviz.analysis import repeat_scores
from attnviz.checkpoints.catalog import pretrained_dir

FOLDER = pretrained_dir() / "induction"


@pytest.fixture(scope="module")
def bundle():
    return attnviz.load(str(FOLDER), device="cpu")


@pytest.fixture(scope="module")
def heads() -> dict[str, tuple[int, int]]:
    """The card's heads, read from config.json and checked against the README's sentence."""
    named = json.loads((FOLDER / "config.json").read_text())["heads"]
    card = (FOLDER / "README.md").read_text()
    out = {}
    for role, text in named.items():
        layer, head = (int(n) for n in re.fullmatch(r"layer (\d+) head (\d+)", text).groups())
        out[role] = (layer, head)
        assert f"**{text}**" in card, f"the card names the {role} head"
    return out


def probes(n: int, period: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(letters + letters) for letters in (rng.choices(string.ascii_lowercase, k=period) for _ in range(n))
    ]


def plain_scores(decoder: np.ndarray, period: int) -> tuple[np.ndarray, np.ndarray]:
    """(previous, induction) per layer and head, by loops: <s> at 0, the letters at 1..2*period."""
    L, H = decoder.shape[:2]
    previous, induction = np.zeros((L, H)), np.zeros((L, H))
    for layer in range(L):
        for head in range(H):
            for i in range(1 + period, 1 + 2 * period):
                previous[layer, head] += decoder[layer, head, i, i - 1] / period
                induction[layer, head] += decoder[layer, head, i, i - period + 1] / period
    return previous, induction


def test_the_model_is_a_decoder_only_model_of_letters(bundle):
    cfg = bundle.config
    assert cfg.decoder_only and cfg.n_dec_layers == 2 and not cfg.encoder_only
    encoded = bundle.tokenizer.encode_source("q w e r t y q w e r t y")
    assert encoded.tokens[0] == "<s>" and len(encoded.ids) == 13, "one token per letter after <s>"


def test_the_named_heads_do_what_the_card_says_on_fresh_probes(bundle, heads):
    period = 8
    previous, induction = np.zeros((2, bundle.config.n_heads)), np.zeros((2, bundle.config.n_heads))
    texts = probes(40, period, seed=2024)
    for text in texts:
        p, i = plain_scores(attnviz.attention(bundle, text).decoder, period)
        previous += p / len(texts)
        induction += i / len(texts)
    (pl, ph), (il, ih) = heads["previous-token"], heads["induction"]
    assert pl == 1 and il == 2, "a previous-token head in layer 1 and an induction head in layer 2"
    assert previous[pl - 1, ph - 1] > 0.35 and previous[pl - 1, ph - 1] == previous[0].max()  # uniform: about 0.1
    assert induction[il - 1, ih - 1] > 0.5 and induction[il - 1, ih - 1] == induction[1].max()
    assert induction[0].max() < 0.3, "no head of layer 1 can do induction: it needs the previous token first"


def test_the_repeated_half_is_continued(bundle):
    assert attnviz.generate(bundle, "q w e r t y q w e", max_new=3).split() == ["r", "t", "y"]
    assert attnviz.generate(bundle, "m a r k o v m a", max_new=3).split() == ["r", "k", "o"]


def test_repeat_scores_are_the_plain_loops(bundle):
    export = attnviz.attention(bundle, probes(1, 6, seed=7)[0])
    scores = repeat_scores(export.decoder, start=1, period=6)
    previous, induction = plain_scores(export.decoder, 6)
    np.testing.assert_allclose(scores["previous"], previous, atol=1e-6)
    np.testing.assert_allclose(scores["induction"], induction, atol=1e-6)
    np.testing.assert_allclose(scores["bos"], export.decoder[:, :, 7:13, 0].mean(-1), atol=1e-6)


def test_the_atlas_of_a_language_model_names_its_induction_head(bundle, heads, tmp_path):
    """role_table against plain loops over the same probes; the atlas's heads table carries it, on disk too."""
    from attnviz.atlas.roles import PERIOD, probe_ids, probe_prefix, role_table

    start = len(probe_prefix(bundle))
    assert start == 1, "the induction model's tokenizer puts <s> first"
    table = role_table(bundle).set_index(["layer", "head"])
    L, H = bundle.config.n_dec_layers, bundle.config.n_heads
    induction, bos = np.zeros((L, H)), np.zeros((L, H))
    probes_ = probe_ids(bundle)
    for ids in probes_:
        assert ids[start : start + PERIOD] == ids[start + PERIOD :], "the second half repeats the first"
        maps = bundle.model(None, torch.tensor([ids]), return_attention=True).attention
        decoder = maps.stacked("decoder")[:, 0].detach().numpy()
        for i in range(start + PERIOD, start + 2 * PERIOD):
            induction += decoder[:, :, i, i - PERIOD + 1] / PERIOD / len(probes_)
            bos += decoder[:, :, i, 0] / PERIOD / len(probes_)
    for layer in range(L):
        for head in range(H):
            assert table.loc[(layer + 1, head + 1), "induction"] == pytest.approx(induction[layer, head], abs=1e-6)
            assert table.loc[(layer + 1, head + 1), "bos"] == pytest.approx(bos[layer, head], abs=1e-6)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("q w e r t y q w e r t y\na b c d a b c d\n")
    atlas = attnviz.build_atlas(bundle, corpus, tmp_path / "atlas")
    again = attnviz.load_atlas(tmp_path / "atlas")
    il, ih = heads["induction"]
    best = again.heads.sort_values("induction").iloc[-1]
    assert (best["layer"], best["head"]) == (il, ih), "the atlas finds the card's induction head"
    assert again.manifest["roles"]["columns"] == ["induction", "bos"]
    assert atlas.heads["induction"].notna().all()


def test_the_explorers_induction_statistic_is_the_plain_loop_on_a_clean_repeat(bundle, heads):
    """On a text whose first half repeats no letter, every repeated query's target is i - period + 1."""
    from attnviz.analysis import head_statistics

    text = "q w e r t y u i q w e r t y u i"
    export = attnviz.attention(bundle, text)
    table = head_statistics(export.decoder, *export.tokens("decoder"), "decoder")
    _, induction = plain_scores(export.decoder, 8)
    np.testing.assert_allclose(table["induction"].to_numpy().reshape(induction.shape), induction, atol=1e-6)
    layer, head = heads["induction"]
    assert induction[layer - 1, head - 1] > 0.5, "the card's induction head does it on this text too"


def test_an_unknown_piece_of_a_prompt_keeps_its_text_in_the_maps_labels(bundle):
    """The labels of a prompt's maps are the tokens its tokenizer read: an unknown piece says what it stood for,
    as the decoding page says it, and as its own word (an audit found '<unk>', and '☃' folded into 'b')."""
    read = bundle.tokenizer.encode_source("a b ☃ c")
    unknown = next(t for t in read.tokens if t.startswith("<unk:"))
    queries, keys = attnviz.attention(bundle, "a b ☃ c").tokens("decoder")
    assert queries == keys == read.tokens and unknown in queries
    words, _ = attnviz.attention(bundle, "a b ☃ c", words=True).tokens("decoder")
    assert words == ("<s>", "a", "b", "☃", "c"), words
    generated, _ = attnviz.attention(bundle, "a b ☃ c", generate=2).tokens("decoder")
    assert generated[: len(read.tokens)] == read.tokens and len(generated) == len(read.tokens) + 2
    words, _ = attnviz.attention(bundle, "a b ☃ c", generate=2, words=True).tokens("decoder")
    assert words[:5] == ("<s>", "a", "b", "☃", "c") and len(words) == 7, words  # the model wrote two more
