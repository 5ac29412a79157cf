"""The contribution methods, ablation and head importance: hand-sized numpy examples, invariants, batching.

Parity with an independent implementation on transformers' MarianMTModel is in test_methods_marian.py;
here each method is checked against numpy written from the papers' formulas on a model small enough
to follow by hand, and the numbers every method must satisfy are checked on tiny seeded models
(post-LN and pre-LN, encoder-decoder and encoder-only).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import seeded_model, tiny_config

from attnviz.errors import InputError
from attnviz.hooks import Edit, act_name, attention_site
from attnviz.kinds import causal_mask
from attnviz.methods import METHODS, grad_attention, importance, value_zeroing
from attnviz.methods.ablation import Ablation, ablation_scope, all_heads, head_means, step_comparison
from attnviz.methods.grad_attention import propagate, residual_normalised
from attnviz.methods.importance import head_importance
from attnviz.methods.norm import norm_based
from attnviz.methods.rollout import decoder_rollout

SRC = torch.tensor([[5, 9, 17, 23, 8, 2]])
TGT = torch.tensor([[1, 12, 30, 7, 41]])


@pytest.fixture(scope="module", params=["post-LN", "pre-LN"])
def model(request):
    cfg = tiny_config(norm_first=request.param == "pre-LN", activation="gelu" if request.param == "pre-LN" else "relu")
    return seeded_model(cfg, seed=3)


# ---------------------------------------------------------------------------------------------
# A hand-sized encoder layer in numpy: d_model 4, 2 heads, d_ff 8, 3 tokens, post-LN, ReLU.


@pytest.fixture(scope="module")
def small():
    cfg = tiny_config(n_enc_layers=1, n_dec_layers=0, d_model=4, n_heads=2, d_ff=8, pos_encoding="none")
    model = seeded_model(cfg, seed=5)
    with torch.no_grad():  # biases and LayerNorms away from their defaults, so that they count
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.5)
    return model


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _layer_norm(x, norm):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.eps) * _np(norm.weight) + _np(norm.bias)


def _encoder_layer_numpy(layer, x, zero_value_of=None):
    """One post-LN encoder layer, written from the paper; ``zero_value_of`` zeroes that token's values."""
    attn = layer.self_attn
    H, Dh = attn.n_heads, attn.d_head
    proj = lambda lin, z: z @ _np(lin.weight).T + _np(lin.bias)  # noqa: E731
    q, k, v = (proj(lin, x).reshape(-1, H, Dh).transpose(1, 0, 2) for lin in (attn.q_proj, attn.k_proj, attn.v_proj))
    if zero_value_of is not None:
        v = v.copy()
        v[:, zero_value_of] = 0.0
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(Dh)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads = weights @ v  # (H, S, Dh)
    out = proj(attn.out_proj, heads.transpose(1, 0, 2).reshape(x.shape[0], H * Dh))
    x = _layer_norm(x + out, layer.attn_block.norm)
    hidden = np.maximum(proj(layer.ffn.up, x), 0.0)
    return _layer_norm(x + proj(layer.ffn.down, hidden), layer.ffn_block.norm), weights, v


def test_norm_based_on_a_hand_sized_layer(small):
    src = torch.tensor([[4, 7, 2]])
    x = _np(small.src_embed(src))[0]  # no positions in this config: the layer input is the embedding
    _, weights, v = _encoder_layer_numpy(small.encoder_layers[0], x)
    w_o = _np(small.encoder_layers[0].self_attn.out_proj.weight)  # (D, H * Dh)
    want = np.empty((2, 3, 3))
    for h in range(2):
        f = v[h] @ w_o[:, 2 * h : 2 * h + 2].T  # f_h(x_j) for every j: (S, D)
        for i in range(3):
            for j in range(3):
                want[h, i, j] = np.linalg.norm(weights[h, i, j] * f[j])
    got = norm_based(small, src).maps["encoder"][0]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_value_zeroing_on_a_hand_sized_layer(small):
    src = torch.tensor([[4, 7, 2]])
    x = _np(small.src_embed(src))[0]
    layer = small.encoder_layers[0]
    clean, _, _ = _encoder_layer_numpy(layer, x)
    want = np.empty((3, 3))
    for j in range(3):
        zeroed, _, _ = _encoder_layer_numpy(layer, x, zero_value_of=j)
        for i in range(3):
            cos = clean[i] @ zeroed[i] / (np.linalg.norm(clean[i]) * np.linalg.norm(zeroed[i]))
            want[i, j] = 1 - cos
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(value_zeroing.value_zeroing(small, src).maps["encoder"][0], want, atol=1e-5)


def test_rollout_by_hand():
    # One head, one layer each. Encoder: token 0 attends to itself, token 1 half to each.
    # Rollout A = 0.5 W + 0.5 I = [[1, 0], [0.25, 0.75]].
    enc = np.array([[[[1.0, 0.0], [0.5, 0.5]]]])
    r_enc = 0.5 * enc[0, 0] + 0.5 * np.eye(2)
    # Decoder: position 1 attends to position 0 only; cross: every target position on source token 1.
    dec = np.array([[[[1.0, 0.0], [1.0, 0.0]]]])
    cross = np.array([[[[0.0, 1.0], [0.0, 1.0]]]])
    target, source = decoder_rollout(dec, cross, r_enc)
    # Self: P = (0.5 W + 0.5 I) [0 | I] = [0 | [[1, 0], [0.5, 0.5]]].
    # Cross: P <- 0.5 P + 0.5 [W_cross R_enc | 0]; W_cross R_enc = [[0.25, 0.75], [0.25, 0.75]].
    np.testing.assert_allclose(target[0], [[0.5, 0.0], [0.25, 0.25]])
    np.testing.assert_allclose(source[0], [[0.125, 0.375], [0.125, 0.375]])
    np.testing.assert_allclose(target[0].sum(-1) + source[0].sum(-1), 1.0)


def test_relevance_rules_by_hand():
    # S = 2 source tokens, T = 2 target tokens, one layer each.
    enc = np.array([[[0.0, 1.0], [0.0, 0.0]]])  # R_ss = I + A = [[1, 1], [0, 1]]
    dec = np.array([[[0.0, 0.0], [0.5, 0.0]]])  # R_tt = I + A = [[1, 0], [0.5, 1]]; R_ts stays 0
    cross = np.array([[[0.0, 0.0], [1.0, 0.0]]])
    r_ss, r_tt, r_ts = propagate(enc, dec, cross)
    np.testing.assert_allclose(r_ss, [[1, 1], [0, 1]])
    np.testing.assert_allclose(r_tt, [[1, 0], [0.5, 1]])
    # norm(R_tt): row 0 has nothing besides I (stays [1, 0]); row 1: [0.5, 0] / 0.5 + I = [1, 1].
    # norm(R_ss): row 0: [0, 1] / 1 + I = [1, 1]; row 1 stays [0, 1].
    np.testing.assert_allclose(residual_normalised(r_tt), [[1, 0], [1, 1]])
    np.testing.assert_allclose(residual_normalised(r_ss), [[1, 1], [0, 1]])
    # R_ts = norm(R_tt)^T A norm(R_ss) = [[1, 1], [0, 1]] @ [[0, 0], [1, 0]] @ [[1, 1], [0, 1]] = [[1, 1], [1, 1]].
    np.testing.assert_allclose(r_ts, [[1, 1], [1, 1]])


# ---------------------------------------------------------------------------------------------
# Invariants on tiny models


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_gives_the_documented_shapes_and_zeros(model, name):
    spec = METHODS[name]
    result = spec.function(model, SRC, TGT)
    cfg, S, T = model.cfg, SRC.shape[1], TGT.shape[1]
    lead = (cfg.n_heads,) if spec.per_head else ()
    want = {"encoder": (cfg.n_enc_layers, *lead, S, S), "decoder": (cfg.n_dec_layers, *lead, T, T)}
    want["cross"] = (cfg.n_dec_layers, *lead, T, S)
    assert {k: v.shape for k, v in result.maps.items()} == want
    for kind, maps in result.maps.items():
        assert maps.dtype == np.float32 and np.isfinite(maps).all() and (maps >= 0).all(), kind
    # Decoder self-attention: a later token never reaches an earlier query.
    assert (result.maps["decoder"][..., ~causal_mask(T)] == 0).all()


@pytest.mark.parametrize("name", ["value-zeroing", "rollout"])
def test_rows_are_shares(model, name):
    result = METHODS[name].function(model, SRC, TGT)
    np.testing.assert_allclose(result.maps["encoder"].sum(-1), 1.0, atol=1e-5)
    if name == "value-zeroing":
        for kind in ("decoder", "cross"):
            np.testing.assert_allclose(result.maps[kind].sum(-1), 1.0, atol=1e-5)
    else:  # a decoder position is part source, part target
        np.testing.assert_allclose(result.maps["decoder"].sum(-1) + result.maps["cross"].sum(-1), 1.0, atol=1e-5)


def test_norm_based_reads_what_w_v_multiplies_in_a_pre_ln_model():
    model = seeded_model(tiny_config(norm_first=True), seed=4)
    result = norm_based(model, SRC, TGT).maps
    with torch.no_grad():
        out = model(SRC, TGT, return_attention=True)
        layer = model.decoder_layers[1]
        # The cross-attention's values come from the (normed) encoder output, projected by W_V.
        v = layer.cross_attn.v_proj(out.memory)[0].view(SRC.shape[1], model.cfg.n_heads, -1)  # (S, H, Dh)
        w_o = layer.cross_attn.out_proj.weight.view(model.cfg.d_model, model.cfg.n_heads, -1)  # (D, H, Dh)
        f = torch.einsum("shd,ehd->hse", v, w_o).norm(dim=-1)  # (H, S)
        want = out.attention.cross[1][0] * f[:, None, :]
    np.testing.assert_allclose(result["cross"][1], want.numpy(), atol=1e-5, rtol=1e-5)


def test_value_zeroing_in_chunks_equals_one_pass(model, monkeypatch):
    whole = value_zeroing.value_zeroing(model, SRC, TGT).maps
    monkeypatch.setattr(value_zeroing, "MAX_ELEMENTS", 3 * SRC.shape[1] * model.cfg.d_ff)  # two keys per pass
    chunked = value_zeroing.value_zeroing(model, SRC, TGT).maps
    for kind in whole:
        np.testing.assert_allclose(chunked[kind], whole[kind], atol=1e-6)


def test_methods_on_an_encoder_only_model():
    model = seeded_model(tiny_config(n_dec_layers=0, type_vocab_size=2, embed_norm=True, pos_encoding="learned"))
    for name in ("norm", "value-zeroing", "rollout"):
        maps = METHODS[name].function(model, SRC).maps
        assert list(maps) == ["encoder"], name
    with pytest.raises(InputError, match="encoder-only"):
        grad_attention.grad_attention(model, SRC)
    with pytest.raises(InputError, match="encoder-only"):
        norm_based(model, SRC, TGT)


def test_gradient_weighted_attention_explains_one_position(model):
    position = 2
    result = grad_attention.grad_attention(model, SRC, TGT, position=position)
    assert result.notes["position"] == position
    with torch.no_grad():
        assert result.notes["predicted_token_id"] == int(model(SRC, TGT).logits[0, position].argmax())
    for kind in ("decoder", "cross"):  # later queries cannot reach the logit at `position`
        assert (result.maps[kind][:, position + 1 :] == 0).all()
        assert result.maps[kind][:, position].any()
    assert result.extras["source_relevance"].shape == (SRC.shape[1],)
    assert result.extras["target_relevance"].shape == (TGT.shape[1],)
    assert (result.extras["target_relevance"][position + 1 :] == 0).all()
    assert result.extras["target_relevance"][position] >= 1.0  # the identity start
    for bad in (-1, TGT.shape[1], 1.5, True):
        with pytest.raises(InputError, match="position"):
            grad_attention.grad_attention(model, SRC, TGT, position=bad)


def test_gradient_weighted_attention_leaves_the_model_as_it_was():
    model = seeded_model(tiny_config(), seed=2).requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grad_attention.grad_attention(model, SRC, TGT)
    assert all(not p.requires_grad and p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_methods_refuse_a_batch(model):
    with pytest.raises(InputError, match="one sentence"):
        norm_based(model, SRC.repeat(2, 1), TGT.repeat(2, 1))


def test_methods_refuse_no_source_on_a_model_that_reads_one(model):
    with pytest.raises(InputError, match="reads a source sentence"):
        norm_based(model, None, TGT)


# ---------------------------------------------------------------------------------------------
# Ablation


def test_ablation_text_round_trip_and_errors():
    ablation = Ablation.parse(" cross:2.1, encoder:1.3,cross:1.4 ")
    assert ablation.heads == {("cross", 1, 0), ("encoder", 0, 2), ("cross", 0, 3)}
    assert str(ablation) == "encoder:1.3,cross:1.4,cross:2.1"
    assert Ablation.parse(str(ablation)) == ablation
    assert not Ablation.parse("") and not Ablation.of(None)
    for bad in ("cross:0.1", "cross:1", "self:1.1", "cross:1.1.1", "cross:a.b"):
        with pytest.raises(InputError, match="KIND:LAYER.HEAD"):
            Ablation.parse(bad)
    with pytest.raises(InputError, match="mode"):
        Ablation(frozenset(), "half")
    cfg = tiny_config()
    for too_big in ("cross:3.1", "decoder:1.5", "encoder:3.1"):
        with pytest.raises(InputError, match="2 encoder and 2 decoder layers.*4 heads"):
            Ablation.parse(too_big).check(cfg)
    with pytest.raises(InputError, match="encoder-only"):
        Ablation.parse("cross:1.1").check(tiny_config(n_dec_layers=0))
    assert len(all_heads(cfg)) == 3 * 2 * 4 and all_heads(cfg)[0] == "encoder:1.1"


def test_ablating_no_head_changes_nothing(model):
    with torch.no_grad():
        intact = model(SRC, TGT, return_attention=True)
        for mode in ("zero", "mean"):
            with ablation_scope(model, Ablation(frozenset(), mode), SRC, TGT):
                same = model(SRC, TGT, return_attention=True)
            assert torch.equal(same.logits, intact.logits)
            assert all(torch.equal(a, b) for a, b in zip(same.attention.cross, intact.attention.cross, strict=True))


def test_zero_ablation_is_the_head_switched_off_as_written_plainly(model):
    site = attention_site("cross", 1)
    with torch.no_grad():
        manual = {act_name(site, "heads"): lambda h: torch.cat([h[:, :2], torch.zeros_like(h[:, 2:3]), h[:, 3:]], 1)}
        with Edit(manual):
            want = model(SRC, TGT).logits
        with ablation_scope(model, Ablation.parse("cross:2.3"), SRC, TGT):
            got = model(SRC, TGT).logits
        intact = model(SRC, TGT).logits
    assert torch.equal(got, want) and not torch.equal(got, intact)


def test_mean_ablation_gives_the_head_its_mean_at_every_position(model):
    site = attention_site("decoder", 0)
    means = head_means(model, SRC, TGT, [site])[site]  # (1, H, 1, Dh)
    from attnviz.hooks import Recorder

    with (
        torch.no_grad(),
        ablation_scope(model, Ablation.parse("decoder:1.2", "mean"), SRC, TGT),
        Recorder({act_name(site, "heads")}) as rec,
    ):
        model(SRC, TGT)
    heads = rec.tensors[act_name(site, "heads")][0]  # (H, T, Dh)
    assert torch.equal(heads[1], means[0, 1].expand_as(heads[1]))
    assert not torch.equal(heads[0], means[0, 0].expand_as(heads[0]))


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablated_decoding_step_by_step_equals_a_teacher_forced_pass(model, mode):
    from attnviz.decoding import step_through

    ablation = Ablation.parse("encoder:1.1,decoder:2.3,cross:1.2", mode)
    forced = TGT[0, 1:].tolist() + [model.cfg.eos_id]
    with ablation_scope(model, ablation, SRC, TGT):
        steps = step_through(model, SRC, forced=forced).steps
        with torch.no_grad():
            logp = torch.log_softmax(model(SRC, TGT).logits[0], -1)
    for t, step in enumerate(steps):
        assert step.prob == pytest.approx(float(logp[t, forced[t]].exp()), abs=1e-5)


def test_step_comparison_lines_up_two_teacher_forced_decodings(model):
    from attnviz.decoding import step_through

    forced = TGT[0, 1:].tolist() + [model.cfg.eos_id]
    intact = step_through(model, SRC, forced=forced)
    with ablation_scope(model, Ablation.parse("cross:1.1,cross:1.2,cross:2.1"), SRC, TGT):
        ablated = step_through(model, SRC, forced=forced)
    table = step_comparison(intact, ablated, str)
    assert table["step"].tolist() == list(range(1, len(forced) + 1))
    assert table["token"].tolist() == [str(i) for i in forced]
    np.testing.assert_allclose(table["change"], table["p ablated"] - table["p intact"])
    assert (table["change"] != 0).any()


# ---------------------------------------------------------------------------------------------
# Head importance


def _pairs(seed: int, n: int = 3):
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(n):
        src = torch.randint(4, 50, (3 + 2 * i,), generator=g).tolist() + [2]
        out = torch.randint(4, 50, (5 - i,), generator=g).tolist() + [2]
        pairs.append((src, out))
    return pairs


def test_head_importance_equals_one_head_at_a_time(model):
    pairs = _pairs(1)
    result = head_importance(model, pairs)

    def logprob(src, out):
        tgt = torch.tensor([[model.cfg.bos_id, *out[:-1]]])
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([src]), tgt).logits[0], -1)
        return float(logp[torch.arange(len(out)), out].sum())

    n_tokens = sum(len(out) for _, out in pairs)
    intact = [logprob(*p) for p in pairs]
    assert result.intact_logprob == pytest.approx(sum(intact) / n_tokens, abs=1e-5)
    assert result.n_tokens == n_tokens and result.n_sentences == 3
    for kind in ("encoder", "decoder", "cross"):
        assert result.scores[kind].shape == (2, 4)
        for layer in range(2):
            for head in range(4):
                with ablation_scope(model, Ablation(frozenset({(kind, layer, head)}))):
                    drop = sum(a - logprob(*p) for a, p in zip(intact, pairs, strict=True)) / n_tokens
                assert result.scores[kind][layer, head] == pytest.approx(drop, abs=1e-5), (kind, layer, head)


def test_head_importance_in_chunks_equals_one_pass(model, monkeypatch):
    pairs = _pairs(2)
    whole = head_importance(model, pairs)
    monkeypatch.setattr(importance, "MAX_ELEMENTS", 2 * 10 * 64)  # a couple of rows per pass
    chunked = head_importance(model, pairs)
    for kind in whole.scores:
        np.testing.assert_allclose(chunked.scores[kind], whole.scores[kind], atol=1e-6)


def test_head_importance_refuses_what_it_cannot_measure():
    with pytest.raises(InputError, match="encoder-only"):
        head_importance(seeded_model(tiny_config(n_dec_layers=0)), _pairs(0))
    with pytest.raises(InputError, match="at least one sentence"):
        head_importance(seeded_model(tiny_config()), [])
