"""What a lecture needs from the core: the head a page opens on, the out-of-domain notice, whole layers off."""

from __future__ import annotations

import numpy as np
import pytest

from attnviz import analysis, api
from attnviz.methods.ablation import Ablation, all_heads, expand_layers, whole_layers


def softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def reference_clearest(sentences: list[np.ndarray]) -> tuple[int, int]:
    """The rule written out with loops over heads: mean normalised row entropy, sinks passed over."""
    L, H = sentences[0].shape[:2]
    best, best_entropy, fallback, fallback_entropy = None, np.inf, None, np.inf
    for layer in range(L):
        for head in range(H):
            entropies, firsts, ends = [], [], []
            for maps in sentences:
                rows = maps[layer, head].astype(np.float64)
                K = rows.shape[-1]
                h = [-sum(p * np.log(p) for p in row if p > 0) / np.log(K) for row in rows]
                entropies.append(np.mean(h))
                firsts.append(rows[:, 0].mean())
                ends.append(rows[:, -1].mean())
            entropy, sink = np.mean(entropies), max(np.mean(firsts), np.mean(ends)) >= analysis.SINK_SHARE
            if entropy < fallback_entropy:
                fallback, fallback_entropy = (layer + 1, head + 1), entropy
            if not sink and entropy < best_entropy:
                best, best_entropy = (layer + 1, head + 1), entropy
    return best or fallback


def cross_tables(sentences: list[np.ndarray]) -> list:
    tables = []
    for maps in sentences:
        T, S = maps.shape[-2:]
        tables.append(analysis.head_statistics(maps, [f"t{i}" for i in range(T)], [f"s{j}" for j in range(S)], "cross"))
    return tables


@pytest.mark.parametrize("seed", range(6))
def test_the_clearest_head_is_the_sharpest_that_is_not_a_sink(seed):
    rng = np.random.default_rng(seed)
    sentences = []
    for T, S in ((5, 7), (3, 4), (8, 9)):
        scores = rng.standard_normal((3, 4, T, S)) * rng.uniform(0.5, 3.0, (3, 4, 1, 1))
        scores[2, 1, :, -1] += 12.0  # layer 3, head 2: the sharpest of all, but it rests on the end token
        sentences.append(softmax(scores).astype(np.float32))
    expected = reference_clearest(sentences)
    assert analysis.clearest_head(cross_tables(sentences)) == expected
    assert expected != (3, 2), "the sink is passed over"


def test_when_every_head_is_a_sink_the_sharpest_is_chosen():
    scores = np.zeros((2, 2, 4, 5))
    scores[..., 0] = np.array([[6.0, 4.0], [9.0, 5.0]])[:, :, None]  # all rest on the first token; L2 H1 most
    maps = softmax(scores).astype(np.float32)
    assert analysis.clearest_head(cross_tables([maps])) == reference_clearest([maps]) == (2, 1)


def test_shipped_models_open_on_a_head_that_shows_their_task():
    """en-de's alignments are in layer 3 (the lecture's point); reverse's chosen head is its anti-diagonal."""
    kind, layer, _ = api.clearest_head(api.load("en-de"))
    assert (kind, layer) == ("cross", 3), "the lecture's alignments are in layer 3"
    kind, layer, head = api.clearest_head(api.load("reverse"))
    export = api.attention(api.load("reverse"), "a b c d e f")
    n = len(export.src_tokens) - 1  # letters, without </s>
    # the row writing the t-th letter from the end looks one position after it: an anti-diagonal
    looks_at = export.cross[layer - 1, head - 1][:n].argmax(-1)
    assert kind == "cross" and looks_at.tolist() == [n - t for t in range(n)]


def test_the_induction_model_opens_on_the_induction_head_its_card_names():
    """The card (README) names the induction head in prose; the app opens there, not on the clearest by rule."""
    import re
    import types

    from attnviz.checkpoints.catalog import pretrained_dir

    card = (pretrained_dir() / "induction" / "README.md").read_text()
    said = re.search(r"induction head is \*\*layer (\d+) head (\d+)\*\*", card)
    assert said, "the card names its induction head"
    bundle = api.load("induction")
    chosen = api.clearest_head(bundle)
    assert chosen == ("decoder", int(said[1]), int(said[2])) and chosen.named == "induction"
    kind, layer, head = chosen  # still a plain (kind, layer, head) to every caller
    assert api.clearest_head(api.load("en-de")).named is None, "a card without heads: the rule decides"
    # entries that do not read "layer L head H", or name a head the model lacks, are left out
    fake = types.SimpleNamespace(
        config=bundle.config, info={"heads": {"a": "layer 9 head 1", "b": "layer two head 1", "c": "layer 1 head 4"}}
    )
    assert api.named_heads(fake) == {"c": (1, 4)}


@pytest.mark.parametrize(
    ("model", "sentence", "flagged"),
    [
        ("en-de", "The cat sat on the mat.", "single letters"),
        ("en-de", "Thursday, July 2, 1998", None),
        ("en-de", "three thousand, four hundred and fifty-six", None),
        ("en-de", "Grüße", "cannot read"),
        ("reverse", "h e l l o", None),  # a model of letters is not flagged for letters
        ("reverse", "Hello", "cannot read"),
    ],
)
def test_out_of_domain_sentences_are_named_with_the_cards_domain(model, sentence, flagged):
    bundle = api.load(model)
    notice = api.out_of_domain(bundle, sentence)
    if flagged is None:
        assert notice is None
    else:
        assert flagged in notice and bundle.info["description"] in notice


def test_a_whole_layer_is_every_head_of_it():
    from conftest import tiny_config

    cfg = tiny_config(n_enc_layers=2, n_dec_layers=3, n_heads=4)
    assert whole_layers(cfg, ["encoder", "cross"]) == ["encoder:1", "encoder:2", "cross:1", "cross:2", "cross:3"]
    expanded = expand_layers(["cross:2", "cross:2.3", "encoder:1.1"], cfg.n_heads)
    assert expanded == ["cross:2.1", "cross:2.2", "cross:2.3", "cross:2.4", "encoder:1.1"]
    assert set(expanded) <= set(all_heads(cfg))
    heads = Ablation.parse(",".join(expanded)).heads
    assert {(k, layer, h) for k, layer, h in heads if k == "cross"} == {("cross", 1, h) for h in range(4)}
