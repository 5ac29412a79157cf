"""The model: config validation, positions, parity with torch's layers, and invariants of every map."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY_VOCAB, random_padded_batch, seeded_model, tiny_config
from torch import nn

import attnviz.model as model_module
from attnviz.errors import ConfigError, InputError
from attnviz.hooks import Recorder, act_name, attention_site
from attnviz.model import (
    DecoderLayer,
    EncoderLayer,
    MultiHeadAttention,
    Transformer,
    TransformerConfig,
    attention,
    attention_masks,
    fused_attention,
    sinusoidal_table,
)

ATOL = 1e-5  # across CPUs results differ around 1e-6..1e-5 (FACTS.md, "Numbers")
KINDS = ("encoder", "decoder", "cross")
PARTS = ("q", "k", "v", "scores", "weights")


def _lengths(valid: torch.Tensor) -> list[int]:
    return valid.sum(dim=1).tolist()


# ---------------------------------------------------------------------------------------------
# Config


def test_defaults_are_the_papers_base_model():
    cfg = TransformerConfig()
    assert (cfg.n_enc_layers, cfg.n_dec_layers) == (6, 6)  # N
    assert (cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_ff) == (512, 8, 64, 2048)
    assert cfg.dropout == 0.1
    assert cfg.norm_first is False  # post-LN
    assert cfg.activation == "relu"
    assert cfg.pos_encoding == "sinusoidal"
    assert cfg.share_embeddings and cfg.tie_output and cfg.scale_embedding
    assert cfg.src_vocab_size == cfg.tgt_vocab_size == 37000


def test_default_model_has_the_papers_parameter_count():
    # Table 3 gives 65 x 10^6 parameters for "base"; the meta device allocates nothing.
    with torch.device("meta"):
        model = Transformer(TransformerConfig())
    n_params = sum(p.numel() for p in model.parameters())
    assert 60e6 < n_params < 66e6, n_params


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"d_model": 30, "n_heads": 4}, ["d_model (30)", "divisible", "n_heads (4)"]),
        ({"activation": "tanh"}, ["activation", "'tanh'", "relu"]),
        ({"pos_encoding": "alibi"}, ["pos_encoding", "'alibi'", "sinusoidal", "rotary"]),
        ({"n_kv_heads": 3}, ["n_kv_heads (3)", "divide n_heads (4)"]),
        ({"norm": "batchnorm"}, ["norm", "'batchnorm'", "rmsnorm"]),
        ({"rope_scaling": "yarn"}, ["rope_scaling", "'yarn'", "llama3"]),
        ({"n_enc_layers": 0, "n_dec_layers": 0}, ["an encoder, a decoder or both"]),
        ({"share_embeddings": True, "tgt_vocab_size": 60}, ["share_embeddings", "src_vocab_size == tgt_vocab_size"]),
        ({"dropout": 1.0}, ["dropout", "[0, 1)"]),
        ({"n_heads": 0}, ["n_heads", "positive"]),
        ({"n_enc_layers": -1}, ["n_enc_layers", "non-negative"]),
        ({"bos_id": TINY_VOCAB}, ["bos_id", str(TINY_VOCAB)]),
        ({"d_model": 33, "n_heads": 3}, ["even d_model"]),
    ],
)
def test_invalid_config_raises_config_error_naming_the_field(overrides, words):
    with pytest.raises(ConfigError) as info:
        tiny_config(**overrides)
    for word in words:
        assert word in str(info.value)


def test_config_error_lists_every_problem_at_once():
    with pytest.raises(ConfigError) as info:
        tiny_config(activation="tanh", pos_encoding="alibi")
    assert "activation" in str(info.value) and "pos_encoding" in str(info.value)


@pytest.mark.parametrize(
    "overrides", [{"d_model": "32"}, {"pos_encoding": None}, {"dropout": "0.1"}], ids=["str", "none", "str-dropout"]
)
def test_mistyped_config_value_raises_config_error(overrides):
    with pytest.raises(ConfigError):
        tiny_config(**overrides)


def test_from_dict_names_unknown_keys():
    data = {**tiny_config().to_dict(), "n_head": 4, "num_layers": 2}
    with pytest.raises(ConfigError) as info:
        TransformerConfig.from_dict(data)
    assert "n_head" in str(info.value) and "num_layers" in str(info.value)


def test_from_dict_rejects_a_non_object():
    with pytest.raises(ConfigError, match="JSON object"):
        TransformerConfig.from_dict([1, 2])


def test_from_dict_round_trips_to_dict():
    cfg = tiny_config(norm_first=True, activation="gelu", pos_encoding="learned")
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg


# ---------------------------------------------------------------------------------------------
# Positional encoding (3.5)


def _paper_sinusoids(n_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), written out with math."""
    rows = []
    for pos in range(n_positions):
        row = []
        for j in range(d_model):
            angle = pos / 10000 ** (2 * (j // 2) / d_model)
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32)


def test_interleaved_sinusoids_follow_the_papers_formula():
    table = torch.from_numpy(sinusoidal_table(50, 16, "interleaved"))
    assert table.shape == (50, 16)
    torch.testing.assert_close(table, _paper_sinusoids(50, 16), atol=1e-6, rtol=0)


def test_concat_sinusoids_are_the_same_numbers_sines_first():
    interleaved = torch.from_numpy(sinusoidal_table(50, 16, "interleaved"))
    concat = torch.from_numpy(sinusoidal_table(50, 16, "concat"))
    sines_then_cosines = list(range(0, 16, 2)) + list(range(1, 16, 2))
    assert torch.equal(concat, interleaved[:, sines_then_cosines])
    assert not torch.equal(concat, interleaved)


def test_sinusoid_table_rejects_unknown_layout():
    with pytest.raises(ValueError, match="layout"):
        sinusoidal_table(4, 8, "spiral")


@pytest.mark.parametrize(("kind", "columns"), [("sinusoidal", "interleaved"), ("sinusoidal_concat", "concat")])
def test_model_adds_the_configured_sinusoids(kind, columns):
    cfg = tiny_config(pos_encoding=kind)
    model = seeded_model(cfg)
    table = torch.from_numpy(sinusoidal_table(cfg.max_len, cfg.d_model, columns))
    torch.testing.assert_close(model.pos.table, table, atol=0, rtol=0)
    torch.testing.assert_close(model.pos(start=3, length=5), table[3:8], atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# Parity with torch's own layers (an independent implementation)


def _copy_into_torch_mha(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)


def _randomise_norms(module: nn.Module, seed: int) -> None:
    """LayerNorms start as the identity; random ones make a swapped norm visible."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.5 * torch.randn(m.bias.shape, generator=g))


@pytest.mark.parametrize("kind", KINDS)
def test_multi_head_attention_matches_torch(kind, batch):
    cfg = tiny_config()
    torch.manual_seed(3)
    ours = MultiHeadAttention(cfg).eval()
    ref = nn.MultiheadAttention(cfg.d_model, cfg.n_heads, dropout=0.0, bias=True, batch_first=True).eval()
    _copy_into_torch_mha(ours, ref)
    src_valid, tgt_valid = batch["src_valid"], batch["tgt_valid"]
    masks = attention_masks(src_valid, tgt_valid)
    B, S, T = src_valid.shape[0], src_valid.shape[1], tgt_valid.shape[1]
    x_src, x_tgt = torch.randn(B, S, cfg.d_model), torch.randn(B, T, cfg.d_model)
    # nn.MultiheadAttention's boolean masks mean the opposite of ours: True = blocked.
    if kind == "encoder":
        x_q, x_kv, ref_kwargs = x_src, x_src, {"key_padding_mask": ~src_valid}
    elif kind == "decoder":
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        x_q, x_kv, ref_kwargs = x_tgt, x_tgt, {"key_padding_mask": ~tgt_valid, "attn_mask": ~causal}
    else:
        x_q, x_kv, ref_kwargs = x_tgt, x_src, {"key_padding_mask": ~src_valid}

    with torch.no_grad():
        out, weights = ours(x_q, x_kv, masks[kind], return_attention=True)
        fused_out, no_weights = ours(x_q, x_kv, masks[kind])
        ref_out, ref_weights = ref(x_q, x_kv, x_kv, need_weights=True, average_attn_weights=False, **ref_kwargs)

    assert no_weights is None
    assert weights.shape == ref_weights.shape == (B, cfg.n_heads, x_q.shape[1], x_kv.shape[1])
    torch.testing.assert_close(weights, ref_weights, atol=ATOL, rtol=0)
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=0)
    torch.testing.assert_close(fused_out, ref_out, atol=ATOL, rtol=0)


@pytest.mark.parametrize(("norm_first", "activation"), [(False, "relu"), (True, "relu"), (False, "gelu")])
def test_encoder_layer_matches_torch(norm_first, activation, batch):
    cfg = tiny_config(norm_first=norm_first, activation=activation)
    torch.manual_seed(4)
    ours = EncoderLayer(cfg).eval()
    _randomise_norms(ours, seed=5)
    ref = nn.TransformerEncoderLayer(
        cfg.d_model,
        cfg.n_heads,
        cfg.d_ff,
        dropout=0.0,
        activation=activation,
        layer_norm_eps=cfg.ln_eps,
        batch_first=True,
        norm_first=norm_first,
    ).eval()
    _copy_into_torch_mha(ours.self_attn, ref.self_attn)
    with torch.no_grad():
        for ref_mod, our_mod in [
            (ref.linear1, ours.ffn.up),
            (ref.linear2, ours.ffn.down),
            (ref.norm1, ours.attn_block.norm),
            (ref.norm2, ours.ffn_block.norm),
        ]:
            ref_mod.load_state_dict(our_mod.state_dict())
    src_valid = batch["src_valid"]
    x = torch.randn(*src_valid.shape, cfg.d_model)
    mask = attention_masks(src_valid)["encoder"]

    # Gradients stay enabled: that keeps torch on its plain Python path, not its fused fast path.
    expected = ref(x, src_key_padding_mask=~src_valid)
    fused, _ = ours(x, mask)
    explicit, weights = ours(x, mask, return_attention=True)

    torch.testing.assert_close(fused, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(explicit, expected, atol=ATOL, rtol=0)
    assert weights.shape == (src_valid.shape[0], cfg.n_heads, src_valid.shape[1], src_valid.shape[1])


@pytest.mark.parametrize(("norm_first", "activation"), [(False, "relu"), (True, "gelu")])
def test_decoder_layer_matches_torch(norm_first, activation, batch):
    cfg = tiny_config(norm_first=norm_first, activation=activation)
    torch.manual_seed(6)
    ours = DecoderLayer(cfg).eval()
    _randomise_norms(ours, seed=7)
    ref = nn.TransformerDecoderLayer(
        cfg.d_model,
        cfg.n_heads,
        cfg.d_ff,
        dropout=0.0,
        activation=activation,
        layer_norm_eps=cfg.ln_eps,
        batch_first=True,
        norm_first=norm_first,
    ).eval()
    _copy_into_torch_mha(ours.self_attn, ref.self_attn)
    _copy_into_torch_mha(ours.cross_attn, ref.multihead_attn)
    with torch.no_grad():
        for ref_mod, our_mod in [
            (ref.linear1, ours.ffn.up),
            (ref.linear2, ours.ffn.down),
            (ref.norm1, ours.self_block.norm),
            (ref.norm2, ours.cross_block.norm),
            (ref.norm3, ours.ffn_block.norm),
        ]:
            ref_mod.load_state_dict(our_mod.state_dict())
    src_valid, tgt_valid = batch["src_valid"], batch["tgt_valid"]
    T = tgt_valid.shape[1]
    x = torch.randn(*tgt_valid.shape, cfg.d_model)
    memory = torch.randn(*src_valid.shape, cfg.d_model)
    masks = attention_masks(src_valid, tgt_valid)

    expected = ref(
        x,
        memory,
        tgt_mask=~torch.ones(T, T, dtype=torch.bool).tril(),
        tgt_key_padding_mask=~tgt_valid,
        memory_key_padding_mask=~src_valid,
    )
    got, _, _ = ours(x, memory, masks["decoder"], masks["cross"])
    explicit, _, _ = ours(x, memory, masks["decoder"], masks["cross"], return_attention=True)

    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(explicit, expected, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------
# The fused kernel and the explicit path compute the same thing


@pytest.mark.parametrize("pos_encoding", ["sinusoidal", "sinusoidal_concat", "learned", "none"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_fused_path_equals_explicit_path(norm_first, pos_encoding, batch):
    model = seeded_model(tiny_config(norm_first=norm_first, pos_encoding=pos_encoding), seed=8)
    with torch.no_grad():
        fused = model(**batch)
        explicit = model(**batch, return_attention=True)
    assert fused.attention is None
    assert explicit.attention is not None
    torch.testing.assert_close(fused.logits, explicit.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(fused.memory, explicit.memory, atol=ATOL, rtol=0)


def textbook_attention(q, k, v, mask):
    """Equation 1 written plainly, the reference for the model's fewer-pass version."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, scores


def _mask(shape, seed):
    """A random boolean mask in which every query keeps at least one key."""
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.4
    mask[..., 0] = True
    return mask


@pytest.mark.parametrize(
    "mask_shape",
    [None, (4, 6), (2, 1, 1, 6), (1, 1, 4, 6), (2, 1, 4, 6)],
    ids=["none", "2d", "key-padding", "shared", "per-sentence"],
)
@pytest.mark.parametrize("return_scores", [True, False])
def test_attention_equals_equation_1_written_plainly(mask_shape, return_scores):
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 6, 3, 8, generator=g).transpose(1, 2)[:, :, :4]  # (B, H, Q=4, Dh): a strided view
    k = torch.randn(2, 3, 6, 8, generator=g)
    v = torch.randn(2, 3, 6, 5, generator=g)  # d_v != d_k
    mask = None if mask_shape is None else _mask(mask_shape, seed=5)
    expected_out, expected_scores = textbook_attention(q, k, v, mask)

    out, weights, scores = attention(q, k, v, mask, return_scores=return_scores)

    torch.testing.assert_close(out, expected_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(weights, torch.softmax(expected_scores, -1), atol=1e-6, rtol=0)
    if return_scores:
        assert torch.equal(torch.isneginf(scores), torch.isneginf(expected_scores))
        torch.testing.assert_close(scores, expected_scores, atol=1e-6, rtol=0)
    else:
        assert scores is None


@pytest.mark.parametrize("mask_kind", ["none", "causal", "key-padding", "a row with no key", "random per sentence"])
def test_attention_by_blocks_of_queries_equals_equation_1_written_plainly(mask_kind, monkeypatch):
    """Large CPU maps are computed by blocks of queries, skipping keys no query of a block can see;
    here every map is, in blocks of 3 queries, and must still be equation 1."""
    monkeypatch.setattr(model_module, "BLOCKS_FROM", 1)
    monkeypatch.setattr(model_module, "BLOCK_ELEMENTS", 3 * 2 * 3 * 11)  # 3 query rows per block
    g = torch.Generator().manual_seed(9)
    B, H, Q, K = 2, 3, 10, 11
    q, k, v = (
        torch.randn(B, H, Q, 8, generator=g),
        torch.randn(B, H, K, 8, generator=g),
        torch.randn(B, H, K, 5, generator=g),
    )
    causal = torch.ones(Q, K, dtype=torch.bool).tril(K - Q)
    masks = {
        "none": None,
        "causal": causal[None, None],
        "key-padding": torch.ones(B, 1, 1, K, dtype=torch.bool).index_fill_(3, torch.tensor([9, 10]), False),
        "a row with no key": causal.clone().index_fill_(0, torch.tensor([4]), False)[None, None],
        "random per sentence": _mask((B, 1, Q, K), seed=10),
    }
    mask = masks[mask_kind]
    with torch.no_grad():
        out, weights, _ = attention(q, k, v, mask, return_scores=False)
    expected_out, expected_scores = textbook_attention(q, k, v, mask)
    expected_weights = torch.softmax(expected_scores, -1)
    if mask_kind == "a row with no key":  # the rule: zeros, not NaN
        expected_weights[:, :, 4], expected_out[:, :, 4] = 0.0, 0.0
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, expected_out, atol=1e-6, rtol=0)


def test_attention_without_scores_still_has_the_right_gradients():
    """Overwriting the scores in place is only for inference: with autograd the softmax is not in place."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, requires_grad=True) for _ in range(3))
    mask = _mask((1, 1, 5, 5), seed=7)
    out, _, _ = attention(q, k, v, mask, return_scores=False)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    expected = torch.autograd.grad(textbook_attention(q, k, v, mask)[0].square().sum(), (q, k, v))
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("return_scores", [True, False])
def test_under_bf16_autocast_the_products_are_bf16_and_the_softmax_float32(return_scores):
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 3, 7, 16, generator=g) * 2 for _ in range(3))
    mask = _mask((2, 1, 7, 7), seed=9)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out, weights, scores = attention(q, k, v, mask, return_scores=True)
        assert attention(q, k, v, mask, return_scores=return_scores)[1].dtype == torch.float32
    assert out.dtype == scores.dtype == torch.bfloat16 and weights.dtype == torch.float32
    # The softmax of the bfloat16 scores, computed in float32: rows sum to 1 to float32 rounding,
    # where a bfloat16 softmax would miss by about 1e-2.
    assert torch.equal(weights, torch.softmax(scores.float(), -1))
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 7), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------
# Invariants of every map


def test_every_map_has_the_right_shape_rows_and_zeros(tiny_model, tiny_cfg, batch):
    with torch.no_grad():
        attn = tiny_model(**batch, return_attention=True).attention
    B, S = batch["src"].shape
    T = batch["tgt"].shape[1]
    assert S != T  # so that a transposed cross map cannot pass
    H = tiny_cfg.n_heads
    src_len, tgt_len = _lengths(batch["src_valid"]), _lengths(batch["tgt_valid"])
    spec = {
        "encoder": ((B, H, S, S), src_len, src_len, tiny_cfg.n_enc_layers),
        "decoder": ((B, H, T, T), tgt_len, tgt_len, tiny_cfg.n_dec_layers),
        "cross": ((B, H, T, S), tgt_len, src_len, tiny_cfg.n_dec_layers),
    }
    for kind, (shape, query_len, key_len, n_layers) in spec.items():
        maps = getattr(attn, kind)
        assert len(maps) == n_layers, kind
        assert attn.stacked(kind).shape == (n_layers, *shape)
        for layer, weights in enumerate(maps):
            where = f"{kind} layer {layer}"
            assert weights.shape == shape, where
            assert torch.isfinite(weights).all(), where
            assert (weights >= 0).all(), where
            for b in range(B):
                real_rows = weights[b, :, : query_len[b]]
                torch.testing.assert_close(real_rows.sum(-1), torch.ones(H, query_len[b]), atol=1e-5, rtol=0, msg=where)
                assert (weights[b, :, :, key_len[b] :] == 0).all(), f"{where}: a padded key gets weight"
                assert (real_rows[:, :, : key_len[b]] > 0).any(), where
            if kind == "decoder":
                future = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
                assert (weights[:, :, future] == 0).all(), f"{where}: a query sees a later position"


def test_recorded_scores_are_masked_with_minus_infinity(tiny_model, tiny_cfg, batch):
    with torch.no_grad(), Recorder() as rec:
        attn = tiny_model(**batch, return_attention=True).attention
    masks = attention_masks(batch["src_valid"], batch["tgt_valid"])
    B, S = batch["src"].shape
    T = batch["tgt"].shape[1]
    H, Dh = tiny_cfg.n_heads, tiny_cfg.d_head
    lengths = {"encoder": (S, S), "decoder": (T, T), "cross": (T, S)}
    for kind in KINDS:
        Q, K = lengths[kind]
        for layer, returned in enumerate(getattr(attn, kind)):
            where = f"{kind} layer {layer}"
            q, k, v, scores, weights = (rec.tensors[act_name(attention_site(kind, layer), part)] for part in PARTS)
            assert q.shape == (B, H, Q, Dh), where
            assert k.shape == v.shape == (B, H, K, Dh), where
            assert scores.shape == (B, H, Q, K), where
            blocked = ~masks[kind].expand(B, H, Q, K)
            assert torch.equal(torch.isneginf(scores), blocked), where
            assert torch.isfinite(scores[~blocked]).all(), where
            dot = q @ k.transpose(-2, -1) / math.sqrt(Dh)
            torch.testing.assert_close(scores[~blocked], dot[~blocked], atol=1e-5, rtol=0, msg=where)
            torch.testing.assert_close(torch.softmax(scores, -1), weights, atol=1e-6, rtol=0, msg=where)
            assert torch.equal(weights, returned), where


def test_a_query_with_no_key_gets_zeros_not_nan():
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=g) for _ in range(3))  # (B, H, L, Dh)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[0, 0, 1] = False  # query 1 of the first sentence may attend to nothing
    mask[1, 0, :, 2:] = False

    out, weights, scores = attention(q, k, v, mask)
    fused = fused_attention(q, k, v, mask)

    for tensor in (out, weights, fused):
        assert not torch.isnan(tensor).any()
    assert (weights[0, :, 1] == 0).all()
    assert (out[0, :, 1] == 0).all()
    assert (fused[0, :, 1] == 0).all()
    assert torch.isneginf(scores[0, :, 1]).all()
    has_key = mask.any(-1).expand(2, 3, 4)  # (B, H, Q)
    assert int((~has_key).sum()) == 3  # one query, three heads
    row_sums = weights.sum(-1)
    torch.testing.assert_close(row_sums[has_key], torch.ones(21), atol=1e-6, rtol=0)
    torch.testing.assert_close(fused, out, atol=1e-6, rtol=0)


def test_a_sentence_has_the_same_maps_alone_as_in_a_padded_batch(tiny_model, batch):
    with torch.no_grad():
        together = tiny_model(**batch, return_attention=True)
    src_len, tgt_len = _lengths(batch["src_valid"]), _lengths(batch["tgt_valid"])
    for b, (S, T) in enumerate(zip(src_len, tgt_len, strict=True)):
        with torch.no_grad():
            alone = tiny_model(batch["src"][b : b + 1, :S], batch["tgt"][b : b + 1, :T], return_attention=True)
        torch.testing.assert_close(together.logits[b, :T], alone.logits[0], atol=ATOL, rtol=0)
        for kind, (Q, K) in {"encoder": (S, S), "decoder": (T, T), "cross": (T, S)}.items():
            for layer, (w_batch, w_alone) in enumerate(
                zip(getattr(together.attention, kind), getattr(alone.attention, kind), strict=True)
            ):
                assert w_alone.shape[2:] == (Q, K)
                torch.testing.assert_close(
                    w_batch[b, :, :Q, :K], w_alone[0], atol=ATOL, rtol=0, msg=f"sentence {b} {kind} layer {layer}"
                )


# ---------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("side", ["src", "tgt"])
def test_too_long_input_raises_input_error(tiny_model, tiny_cfg, side):
    ids = {"src": torch.full((1, 5), 7), "tgt": torch.full((1, 5), 7)}
    ids[side] = torch.full((1, tiny_cfg.max_len + 1), 7)
    with pytest.raises(InputError, match=str(tiny_cfg.max_len)):
        tiny_model(ids["src"], ids["tgt"])


def test_input_of_exactly_max_len_is_accepted(tiny_model, tiny_cfg):
    full = torch.full((1, tiny_cfg.max_len), 7)
    assert tiny_model(full, full).logits.shape == (1, tiny_cfg.max_len, tiny_cfg.tgt_vocab_size)


@pytest.mark.parametrize(
    ("side", "bad"),
    [("src", TINY_VOCAB), ("src", -1), ("tgt", TINY_VOCAB), ("tgt", -3)],
)
def test_out_of_range_ids_raise_input_error(tiny_model, side, bad):
    ids = {"src": torch.full((1, 4), 7), "tgt": torch.full((1, 3), 7)}
    ids[side][0, 1] = bad
    with pytest.raises(InputError, match=rf"\[0, {TINY_VOCAB}\)"):
        tiny_model(ids["src"], ids["tgt"], return_attention=True)


def test_ids_without_a_batch_axis_raise_input_error(tiny_model):
    with pytest.raises(InputError, match="batch, length"):
        tiny_model(torch.tensor([5, 6, 7]), torch.tensor([[1, 5]]))


# ---------------------------------------------------------------------------------------------
# The cached model is shared: a forward must not change it


def _snapshot(model: nn.Module) -> dict:
    """Every module's attributes (containers copied), so that a write during a forward shows up."""
    return {
        name: {key: dict(value) if isinstance(value, dict) else value for key, value in vars(module).items()}
        for name, module in model.named_modules()
    }


def _same(before: dict, after: dict) -> bool:
    if before.keys() != after.keys():
        return False
    for name in before:
        if before[name].keys() != after[name].keys():
            return False
        for key, old in before[name].items():
            new = after[name][key]
            if isinstance(old, dict):
                if old.keys() != new.keys() or any(old[k] is not new[k] for k in old):
                    return False
            elif old is not new and old != new:
                return False
    return True


def test_a_forward_does_not_mutate_the_model(tiny_model, batch):
    state = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    before = _snapshot(tiny_model)
    with torch.no_grad():
        tiny_model(**batch, return_attention=True)
        with Recorder():
            tiny_model(**batch)
        tiny_model(**batch)
    after_state = tiny_model.state_dict()
    assert after_state.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(after_state[key], value), key
    assert _same(before, _snapshot(tiny_model))
    assert not tiny_model.training


def test_mutation_check_sees_a_stashed_attribute(tiny_model):
    # The check above must be able to fail: the Annotated Transformer's `self.attn = p_attn`.
    before = _snapshot(tiny_model)
    tiny_model.decoder_layers[1].cross_attn.attn = torch.zeros(1)
    assert not _same(before, _snapshot(tiny_model))


# ---------------------------------------------------------------------------------------------
# One mask convention: boolean, True = may attend


def test_attention_masks_say_true_for_may_attend():
    src_valid = torch.tensor([[True, True, False]])
    tgt_valid = torch.tensor([[True, True, True, False]])
    masks = attention_masks(src_valid, tgt_valid)
    assert {m.dtype for m in masks.values()} == {torch.bool}
    assert masks["encoder"].shape == (1, 1, 1, 3)
    assert masks["encoder"][0, 0, 0].tolist() == [True, True, False]
    assert masks["cross"][0, 0, 0].tolist() == [True, True, False]
    assert masks["decoder"][0, 0].int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 0],
    ]
    assert attention_masks(src_valid).keys() == {"encoder", "cross"}
    # No padding: nothing to mask on the source side, and the decoder mask is purely causal.
    unpadded = attention_masks(None, tgt_len=3)
    assert unpadded["encoder"] is None and unpadded["cross"] is None
    assert unpadded["decoder"][0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


@pytest.mark.parametrize("return_attention", [False, True])
def test_ids_at_padded_positions_do_not_change_real_positions(tiny_model, batch, return_attention):
    # If the model read the mask with the opposite polarity, padding would be all it looks at.
    noisy = dict(batch)
    noisy["src"] = batch["src"].masked_fill(~batch["src_valid"], 11)
    noisy["tgt"] = batch["tgt"].masked_fill(~batch["tgt_valid"], 13)
    with torch.no_grad():
        clean_out = tiny_model(**batch, return_attention=return_attention)
        noisy_out = tiny_model(**noisy, return_attention=return_attention)
    for b, T in enumerate(_lengths(batch["tgt_valid"])):
        torch.testing.assert_close(noisy_out.logits[b, :T], clean_out.logits[b, :T], atol=1e-6, rtol=0)


def test_encoder_only_model_runs_its_encoder_and_refuses_to_decode():
    cfg = tiny_config(n_dec_layers=0, pos_encoding="learned", type_vocab_size=2, embed_norm=True, activation="gelu")
    model = seeded_model(cfg)
    params = dict(model.named_parameters())
    assert params["token_type"].shape == (2, cfg.d_model) and "embed_norm.weight" in params
    assert not model.decoder_layers
    src = torch.randint(4, TINY_VOCAB, (2, 7))
    out = model(src, return_attention=True)
    assert out.logits is None and out.attention.decoder == () and out.attention.cross == ()
    assert len(out.attention.encoder) == cfg.n_enc_layers and out.attention.encoder[0].shape == (2, 4, 7, 7)
    with pytest.raises(InputError, match="encoder-only"):
        model(src, torch.ones(2, 3, dtype=torch.long))


def test_token_type_and_embedding_norm_change_the_encoder_input():
    cfg = tiny_config(n_dec_layers=0, type_vocab_size=2, embed_norm=True)
    model = seeded_model(cfg)
    src = torch.randint(4, TINY_VOCAB, (1, 5))
    with torch.no_grad():
        before = model.encode(src)[0]
        model.token_type[0].add_(1.0)
        after = model.encode(src)[0]
    assert not torch.allclose(before, after), "token type 0 must be added to every embedding"


@pytest.mark.parametrize("norm_first", [False, True])
def test_recorder_keeps_the_real_intermediate_tensors_and_they_chain(norm_first):
    model = seeded_model(tiny_config(norm_first=norm_first))
    src = torch.randint(4, TINY_VOCAB, (1, 6))
    tgt = torch.randint(4, TINY_VOCAB, (1, 5))
    with torch.no_grad():
        with Recorder() as rec:
            out = model(src, tgt)
        plain = model(src, tgt)
    t = rec.tensors
    torch.testing.assert_close(out.logits, plain.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(t["src.input"], t["src.embed"] + t["src.pos"], atol=1e-6, rtol=0)
    layer0 = model.encoder_layers[0]
    torch.testing.assert_close(t["encoder.0.attn_block.input"], t["src.input"])
    concat = t["encoder.0.attn.heads"].transpose(1, 2).reshape(1, 6, -1)
    torch.testing.assert_close(t["encoder.0.attn.concat"], concat)
    torch.testing.assert_close(t["encoder.0.attn.out"], layer0.self_attn.out_proj(concat), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        t["encoder.0.attn_block.residual"], t["encoder.0.attn_block.input"] + t["encoder.0.attn.out"]
    )
    norm = layer0.attn_block.norm
    expected = t["encoder.0.attn_block.residual"] if norm_first else norm(t["encoder.0.attn_block.residual"])
    torch.testing.assert_close(t["encoder.0.attn_block.output"], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(t["encoder.0.ffn_block.input"], t["encoder.0.attn_block.output"])
    torch.testing.assert_close(t["encoder.1.attn_block.input"], t["encoder.0.ffn_block.output"])
    torch.testing.assert_close(model.encoder_norm(t["encoder.1.ffn_block.output"]), t["memory"])
    k = model.decoder_layers[0].cross_attn.k_proj(t["memory"]).view(1, 6, 4, -1).transpose(1, 2)
    torch.testing.assert_close(t["decoder.0.cross_attn.k"], k, atol=1e-6, rtol=0)
    torch.testing.assert_close(t["logits"], t["decoder_out"] @ model.tgt_embed.weight.T, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# attention_maps: the maps alone, on the real tokens only

MAPS_LAYOUTS = {
    "paper": {},
    "pre-LN, GELU, learned positions": dict(norm_first=True, activation="gelu", pos_encoding="learned"),
    "concatenated sinusoids": dict(pos_encoding="sinusoidal_concat"),
    "BERT layout (encoder only, segments, embedding norm)": dict(
        n_dec_layers=0, type_vocab_size=2, embed_norm=True, activation="gelu", pos_encoding="learned"
    ),
    "Llama layout (rotary, grouped-query, RMSNorm, SwiGLU)": dict(
        n_enc_layers=0,
        pos_encoding="rotary",
        norm="rmsnorm",
        norm_first=True,
        ffn="gated",
        activation="swish",
        n_kv_heads=2,
        ffn_bias=False,
        attn_bias=False,
        share_embeddings=False,
    ),
}


def _maps_arguments(cfg, padded: bool):
    src, src_valid = random_padded_batch([5, 9, 3, 9], seed=1)
    tgt, tgt_valid = random_padded_batch([7, 2, 7, 4], seed=2, first_id=cfg.bos_id)
    if not padded:
        src, tgt = src[[1, 3]], tgt[[0, 2]]
        src_valid = tgt_valid = None
    if cfg.decoder_only:
        return (None, tgt, None, tgt_valid)
    if cfg.encoder_only:
        return (src, None, src_valid, None)
    return (src, tgt, src_valid, tgt_valid)


def _query_rows(args, kind: str, shape) -> torch.Tensor:
    """(B, H, Q, K) True on the rows of real queries."""
    src, tgt, src_valid, tgt_valid = args
    valid = src_valid if kind == "encoder" else tgt_valid
    if valid is None:
        return torch.ones(shape, dtype=torch.bool)
    return valid[:, None, :, None].expand(shape)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("layout", list(MAPS_LAYOUTS))
def test_attention_maps_equal_the_forward_maps_on_every_real_query(layout, padded):
    cfg = tiny_config(**MAPS_LAYOUTS[layout])
    model = seeded_model(cfg, seed=3)
    args = _maps_arguments(cfg, padded)
    with torch.no_grad():
        expected = model(*args, return_attention=True, return_logits=False).attention
        got = model.attention_maps(*args)
    kinds = [k for k in ("encoder", "decoder", "cross") if getattr(expected, k)]
    assert kinds == [k for k in ("encoder", "decoder", "cross") if getattr(got, k)]
    for kind in kinds:
        assert len(getattr(got, kind)) == len(getattr(expected, kind))
        for want, have in zip(getattr(expected, kind), getattr(got, kind), strict=True):
            assert have.shape == want.shape
            real = _query_rows(args, kind, want.shape)
            torch.testing.assert_close(have[real], want[real], atol=ATOL, rtol=0)
            if not padded:
                torch.testing.assert_close(have, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("layout", ["paper", "BERT layout (encoder only, segments, embedding norm)"])
def test_attention_maps_run_the_linear_layers_on_real_tokens_and_stop_at_the_last_map(layout):
    """Every linear layer sees its side's real tokens only; the last layer's work after its last map never runs."""
    cfg = tiny_config(**MAPS_LAYOUTS[layout])
    model = seeded_model(cfg)
    args = _maps_arguments(cfg, padded=True)
    src, tgt, src_valid, tgt_valid = args
    real = {"src": int(src_valid.sum()), "tgt": None if tgt is None else int(tgt_valid.sum())}
    seen = {}

    def count(name):
        def hook(module, inputs):
            x = inputs[0]
            seen.setdefault(name, []).append(x.numel() // x.shape[-1])

        return hook

    handles = [m.register_forward_pre_hook(count(n)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    try:
        with torch.no_grad():
            model.attention_maps(*args)
    finally:
        for h in handles:
            h.remove()
    last = f"decoder_layers.{cfg.n_dec_layers - 1}" if cfg.n_dec_layers else f"encoder_layers.{cfg.n_enc_layers - 1}"
    for name, rows in seen.items():  # the encoder and cross-attention's keys and values read the source
        reads_source = name.startswith("encoder_layers") or name.endswith(("cross_attn.k_proj", "cross_attn.v_proj"))
        assert rows == [real["src" if reads_source else "tgt"]], (name, rows, real)
    assert not [n for n in seen if n.startswith(f"{last}.ffn")], "the last layer's feed-forward ran"
    assert f"{last}.ffn.up" in dict(model.named_modules())
    assert any(n.startswith(f"{last}.") for n in seen)


def test_attention_maps_inside_a_hook_block_are_the_forward_maps_whole():
    """Recorders document padded tensors: inside a hook block the maps come from `forward`, padding rows too."""
    cfg = tiny_config()
    model = seeded_model(cfg)
    args = _maps_arguments(cfg, padded=True)
    with torch.no_grad():
        expected = model(*args, return_attention=True, return_logits=False).attention
        with Recorder(["decoder.0.ffn.out"]) as rec:
            got = model.attention_maps(*args)
    assert rec.tensors["decoder.0.ffn.out"].shape[:2] == args[1].shape
    for kind in ("encoder", "decoder", "cross"):
        for want, have in zip(getattr(expected, kind), getattr(got, kind), strict=True):
            torch.testing.assert_close(have, want, atol=0, rtol=0)


HOLDING_CONFIGS = {
    "the paper's: sinusoids, shared and tied embeddings": {},
    "concatenated sinusoids, untied, post-LN": {"pos_encoding": "sinusoidal_concat", "share_embeddings": False},
    "learned positions, BERT's types and norm, no decoder": {
        "pos_encoding": "learned",
        "n_dec_layers": 0,
        "type_vocab_size": 2,
        "embed_norm": True,
        "tie_output": False,
        "output_bias": True,
    },
    "Llama's: rotary, RMSNorm, SwiGLU, grouped heads": {
        "pos_encoding": "rotary",
        "n_enc_layers": 0,
        "norm": "rmsnorm",
        "ffn": "gated",
        "n_kv_heads": 2,
        "norm_first": True,
        "tie_output": False,
    },
}


@pytest.mark.parametrize("overrides", HOLDING_CONFIGS.values(), ids=HOLDING_CONFIGS)
def test_a_model_holding_loaded_tensors_is_the_model_built_and_then_given_them(overrides):
    """`Transformer.holding` (a loader's model, built on the meta device, random weights never drawn)
    equals a model built the ordinary way and given the same tensors: parameters, the computed
    sinusoid table, and the output."""
    cfg = tiny_config(**overrides)
    source = seeded_model(cfg, seed=3)
    tensors = {key: p.detach().clone() for key, p in source.named_parameters()}
    held = Transformer.holding(cfg, tensors).eval()
    built = seeded_model(cfg, seed=4)  # other random weights, all overwritten
    with torch.no_grad():
        for key, p in built.named_parameters():
            p.copy_(tensors[key])
    assert [k for k, _ in held.named_parameters()] == [k for k, _ in built.named_parameters()]
    for (key, a), b in zip(held.named_parameters(), built.parameters(), strict=True):
        assert a.device.type == "cpu" and torch.equal(a, b), key
    for (key, a), b in zip(held.named_buffers(), built.buffers(), strict=True):
        assert torch.equal(a, b), key
    if cfg.share_embeddings:
        assert held.tgt_embed.weight is held.src_embed.weight, "a shared embedding stays one tensor"
    ids = torch.randint(4, TINY_VOCAB, (2, 7))
    src, tgt = (None, ids) if cfg.decoder_only else (ids, None) if cfg.encoder_only else (ids, ids)
    a, b = held(src, tgt, return_attention=True), built(src, tgt, return_attention=True)
    assert torch.equal(a.memory if cfg.encoder_only else a.logits, b.memory if cfg.encoder_only else b.logits)
