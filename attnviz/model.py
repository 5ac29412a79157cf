"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), returning its attention.

Read top to bottom, smallest part first, in the order of the paper's Figure 1: masks, embeddings
and positional encoding (3.4, 3.5), scaled dot-product attention (eq. 1), multi-head
attention (3.2.2), the position-wise feed-forward network (3.3), encoder and decoder layers (3.1),
and the whole model.

Attention is returned, not hooked: every attention module returns ``(out, weights or None)`` and
the model gathers the weights into a frozen [`Attention`][attnviz.model.Attention] when ``return_attention=True``.
Without the flag the fused ``F.scaled_dot_product_attention`` kernel runs and no map is
materialised. Every intermediate tensor also passes a named point (`attnviz.hooks`), where a
``with`` block can record or edit it; outside such a block a point costs one variable read.

Where the paper is silent this file chooses, and says so: biases on the attention projections
(``attn_bias``, as in tensor2tensor and Marian), LayerNorm epsilon 1e-5, Xavier-uniform
initialisation of the linear layers, positions counted from 0, and a query with no key to attend
to (only possible with an all-padding row) giving zeros instead of NaN. Options beyond the paper
(pre-LN, GELU/swish, learned or concatenated positions, an output bias) exist for real checkpoints;
the defaults are the paper's. The decoder-only language models that came later (GPT-2, the Llama
family) are this file's decoder with no encoder and no cross-attention (``n_enc_layers=0``); the
parts they add (RMSNorm, rotary positions, SwiGLU, grouped-query attention) live in
`attnviz.later`, and each class here takes one only where its config asks for it.

Shape letters, used in comments throughout: B batch, S source length, T target length, Q query
length, K key length, H heads, Dh d_head, D d_model, F d_ff, V vocabulary size, L layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnviz import buffers
from attnviz.config import TransformerConfig
from attnviz.errors import InputError
from attnviz.hooks import act_name, observe, point, wants
from attnviz.hooks import active as hooks_active
from attnviz.kinds import causal_mask
from attnviz.kvcache import KVCache, LayerCache
from attnviz.later import GatedFeedForward, RopeSpec, Rotary, make_norm, repeat_kv
from attnviz.linear import Linear, linear

PAPER_BASE = 10000.0  # the sinusoids' base (3.5)


# ---------------------------------------------------------------------------------------------
# Masks (3.2.3): one convention everywhere, boolean, True = this query may attend to this key.


def attention_masks(
    src_valid: Tensor | None, tgt_valid: Tensor | None = None, tgt_len: int = 0, device=None, start: int = 0
) -> dict[str, Tensor | None]:
    """Boolean masks (True = may attend) for encoder self, decoder self and cross-attention.

    ``src_valid`` (B, S) and ``tgt_valid`` (B, T) say which positions hold real tokens; None means
    no padding, and then the encoder and cross masks are None (nothing to mask, nothing to pay).
    Padding is never inferred from ids: Marian's decoder starts with the pad id, so
    ``ids != pad`` would be wrong. The decoder mask (B or 1, 1, T - start, T) is always causal;
    ``start`` > 0 keeps the rows of positions start.. only (decoding with a key/value cache).
    """
    if src_valid is not None and bool(src_valid.all()):
        src_valid = None  # nothing is padded: skip the mask (one pass less over every score)
    if tgt_valid is not None and bool(tgt_valid.all()):
        tgt_len, device, tgt_valid = tgt_valid.shape[1], tgt_valid.device, None
    key_padding = None if src_valid is None else src_valid[:, None, None, :]  # (B, 1, 1, S)
    masks = {"encoder": key_padding, "cross": key_padding}
    T = tgt_valid.shape[1] if tgt_valid is not None else tgt_len
    if T:
        device = tgt_valid.device if tgt_valid is not None else device
        causal = torch.from_numpy(causal_mask(T - start, T, start)).to(device)[None, None]  # subsequent mask
        masks["decoder"] = causal if tgt_valid is None else causal & tgt_valid[:, None, None, :]
    return masks


class Rows:
    """The real tokens of a padded (B, L) batch, for a forward pass that skips the padding.

    Linear layers, norms and the feed-forward network work on each position alone, so they can run
    on the real tokens only, packed as (N, D) rows: `Transformer.attention_maps` does, and the
    padding's share of the batch (19% of the tokens in ``benchmarks/bench_atlas.py``'s batches) is
    not computed. Attention needs the padded layout: `heads` puts the packed rows there as
    (B, H, L, Dh), zeros at the padding, and `packed` takes a head output's real rows back.
    """

    def __init__(self, valid: Tensor | None, shape: tuple[int, int], device=None):
        if valid is None:  # nothing padded: every position is a real token
            valid = torch.ones(shape, dtype=torch.bool, device=device)
        self.shape = tuple(valid.shape)
        self.batch, self.position = valid.nonzero(as_tuple=True)  # (N,) each, row-major: as x[valid]

    def pack(self, x: Tensor) -> Tensor:
        """(B, L, ...) -> (N, ...): the real tokens' entries."""
        return x[self.batch, self.position]

    def heads(self, x: Tensor, d_head: int) -> Tensor:
        """(N, H * Dh) projections -> (B, H, L, Dh), contiguous, zeros at the padding."""
        B, L = self.shape
        out = x.new_zeros(B, x.shape[-1] // d_head, L, d_head)
        out.transpose(1, 2)[self.batch, self.position] = x.view(len(self.batch), -1, d_head)
        return out

    def packed(self, heads: Tensor) -> Tensor:
        """(B, H, L, Dv) heads -> (N, H * Dv) concatenated, the real tokens only."""
        return heads.transpose(1, 2)[self.batch, self.position].reshape(len(self.batch), -1)


# ---------------------------------------------------------------------------------------------
# Embeddings and positional encoding (3.4, 3.5)


def sinusoid_frequencies(d_model: int, base: float = PAPER_BASE) -> np.ndarray:
    """The D/2 angular frequencies omega_i = base^(-2i/d_model) of section 3.5, float64."""
    return base ** (-np.arange(0, d_model, 2, dtype=np.float64) / d_model)


def sinusoidal_table(
    n_positions: int,
    d_model: int,
    layout: str = "interleaved",
    base: float = PAPER_BASE,
    start: int = 0,
    dtype=np.float32,
    angle_dtype=np.float64,
) -> np.ndarray:
    """The (n_positions, d_model) sinusoid table of section 3.5 for positions start.., as numpy.

    PE(pos, 2i) = sin(pos / base^(2i/d_model)), PE(pos, 2i+1) = cos(pos / base^(2i/d_model)), with
    base 10000 in the paper. ``layout="interleaved"`` is the paper's; ``"concat"`` puts every sine
    first and every cosine after (tensor2tensor and Marian): the same numbers in another column
    order. The angles pos * omega_i are computed in ``angle_dtype`` (float64: exact to rounding; the
    positional-encoding lesson shows what float32 angles lose) and the table is rounded to ``dtype``.
    """
    if layout not in ("interleaved", "concat"):
        raise ValueError(f"layout must be 'interleaved' or 'concat', got {layout!r}")
    omega = sinusoid_frequencies(d_model, base)  # (D/2,)
    pos = (start + np.arange(n_positions, dtype=np.float64)).astype(angle_dtype)[:, None]  # (P, 1)
    angles = pos * omega.astype(angle_dtype)  # (P, D/2)
    sin, cos = np.sin(angles), np.cos(angles)
    if layout == "interleaved":
        table = np.stack([sin, cos], axis=-1).reshape(n_positions, d_model)  # (P, D/2, 2) -> (P, D)
    else:
        table = np.concatenate([sin, cos], axis=-1)
    return table.astype(dtype)


def building_on_meta() -> bool:
    """Whether new tensors go to the meta device (a loader building a model for its shapes alone)."""
    return torch.empty(0).device.type == "meta"


def normal_weights(*shape: int, std: float) -> Tensor:
    """Weights drawn from N(0, std^2); on the meta device (a loader checking shapes) the shape alone.

    On the meta device ``torch.randn`` imports sympy, and an out-of-place product torch._dynamo, the
    first time in a process: about 1 CPU s that every process loading a checkpoint paid, for values
    nobody reads (`attnviz.checkpoints.bundle.expected_shapes`).
    """
    if building_on_meta():
        return torch.empty(*shape)
    return torch.randn(*shape) * std


class TokenEmbedding(nn.Module):
    """Token ids -> vectors, scaled by sqrt(d_model) as in section 3.4."""

    def __init__(self, vocab_size: int, d_model: int, scale: bool):
        super().__init__()
        self.weight = nn.Parameter(normal_weights(vocab_size, d_model, std=d_model**-0.5))
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight) * self.scale  # (B, L, D)


class PositionalEncoding(nn.Module):
    """What is added for position: fixed sinusoids (3.5), a learned table, or nothing (also for rotary
    positions, which rotate queries and keys inside attention instead: `attnviz.later.Rotary`)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.kind = cfg.pos_encoding
        self.max_len = cfg.max_len
        if self.kind == "learned":
            self.table = nn.Parameter(normal_weights(cfg.max_len, cfg.d_model, std=0.02))
        elif self.kind.startswith("sinusoidal"):
            self.d_model = cfg.d_model
            # Not saved with the weights: it is a function of the config, rebuilt on load (and not
            # computed at all on the meta device, where a loader only wants the shapes).
            table = torch.empty(cfg.max_len, cfg.d_model) if building_on_meta() else self.sinusoids()
            self.register_buffer("table", table, persistent=False)
        else:
            self.table = None

    def sinusoids(self) -> Tensor:
        """The fixed table of a sinusoidal kind (max_len, D), computed from the config."""
        layout = "concat" if self.kind == "sinusoidal_concat" else "interleaved"
        return torch.as_tensor(sinusoidal_table(self.max_len, self.d_model, layout))

    def forward(self, start: int, length: int) -> Tensor | None:
        """The (length, D) rows of positions start.., or None when this model adds no positions."""
        if start + length > self.max_len:
            raise InputError(
                f"sequence of {start + length} tokens is longer than this model's maximum of {self.max_len}; "
                "shorten the input"
            )
        return None if self.table is None else self.table[start : start + length]


# ---------------------------------------------------------------------------------------------
# Scaled dot-product attention (3.2.1, equation 1)


def attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, return_scores: bool = True
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Equation 1, softmax(Q K^T / sqrt(d_k)) V, explicitly: returns (output, weights, scores).

    ``q``, ``k`` (B, H, Q or K, Dh), ``v`` (B, H, K, Dv); ``mask`` (True = may attend) broadcasts to
    (B, H, Q, K). Blocked scores are -inf; a query whose every key is blocked gets zero weights, not
    NaN. The scale and the mask (a 0 / -inf bias) go into one batched matrix multiply, and without
    ``return_scores`` (scores None) the CPU softmax overwrites the scores when no gradient is recorded:
    returning the maps then costs a few per cent over the fused kernel, where equation 1 written
    plainly cost 2.5x at 256 tokens (``benchmarks/bench_forward.py``).

    Under ``torch.autocast`` to bfloat16 or float16 the matrix products run in that precision but
    the softmax runs in float32, and the weights returned are float32; the product with V takes
    them rounded to V's precision. (Autocast on the CPU would otherwise leave the softmax in
    bfloat16: about 3 significant digits per weight.)
    """
    B, H, Q, Dh = q.shape
    K = k.shape[2]
    q3, kT3 = q.reshape(B * H, Q, Dh), k.reshape(B * H, K, Dh).transpose(1, 2)  # (BH, Q, Dh), (BH, Dh, K)
    if _by_blocks(q, return_scores, B * H * Q * K):
        weights, out = _attention_by_blocks(q3, kT3, v.reshape(B * H, K, v.shape[-1]), mask, B, H)
        return out.view(B, H, Q, -1), weights.view(B, H, Q, K), None
    if mask is None:  # beta=0: the first argument only gives the shape; its values are never read
        scores = torch.baddbmm(q3.new_empty(1, 1, 1).expand(B * H, Q, K), q3, kT3, beta=0, alpha=Dh**-0.5)
    else:
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        scores = torch.baddbmm(bias.expand(B, H, Q, K).reshape(B * H, Q, K), q3, kT3, alpha=Dh**-0.5)
    if scores.dtype in (torch.float16, torch.bfloat16):  # products in reduced precision (autocast)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32)  # the softmax stays in float32
    elif return_scores or scores.device.type != "cpu" or (torch.is_grad_enabled() and scores.requires_grad):
        weights = torch.softmax(scores, dim=-1)
    else:  # torch's CPU kernel reads each element of a row before it overwrites it: safe in place
        weights = torch.ops.aten._softmax.out(scores, -1, False, out=scores)
    weights = weights.view(B, H, Q, K)
    if mask is not None and not bool(mask.any(dim=-1).all()):
        weights = weights.masked_fill(~mask, 0.0)  # rows that were all -inf are NaN: zero them
    Dv = v.shape[-1]  # d_v, which the paper lets differ from d_k
    out = torch.bmm(weights.reshape(B * H, Q, K).to(v.dtype), v.reshape(B * H, K, Dv)).view(B, H, Q, Dv)
    return out, weights, scores.view(B, H, Q, K) if return_scores else None


BLOCK_ELEMENTS = 1 << 20  # scores per block of queries (4 MB of float32): a block stays in the CPU's cache
BLOCKS_FROM = 1 << 22  # maps at least this large (16 MB of float32) are computed by blocks of queries


def _by_blocks(q: Tensor, return_scores: bool, n_scores: int) -> bool:
    """Whether equation 1 runs by blocks of queries: a large float32 map on the CPU, with no gradient
    and no scores asked for (the same conditions as the in-place softmax)."""
    return (
        n_scores >= BLOCKS_FROM
        and q.device.type == "cpu"
        and q.dtype == torch.float32
        and not return_scores
        and not (torch.is_grad_enabled() and q.requires_grad)
        and not torch.is_autocast_enabled("cpu")
    )


def _attention_by_blocks(
    q3: Tensor, kT3: Tensor, v3: Tensor, mask: Tensor | None, B: int, H: int
) -> tuple[Tensor, Tensor]:
    """Equation 1 on (B*H, Q, Dh) queries, one block of queries at a time: (weights (BH, Q, K), out (BH, Q, Dv)).

    The same numbers as the one-pass path, in less memory traffic. Each block's scores, softmax and
    product with V stay in the cache, and the weights are written once into the returned maps, in
    memory of earlier maps that nobody holds any more where there is some (`attnviz.buffers`:
    new memory costs a page fault per 4 KB written). A block also skips the keys after the last one
    any of its queries may see, whose weights are exactly 0: a causal map costs half its products.
    """
    BH, Q, Dh = q3.shape
    K, Dv = kT3.shape[2], v3.shape[2]
    weights = buffers.MAPS.empty((BH, Q, K))  # every element is written below
    out = q3.new_empty(BH, Q, Dv)
    rows = max(1, BLOCK_ELEMENTS // (BH * K))
    if mask is not None:  # per query, one past the last key it may see (0 when it sees none)
        mask = mask.expand(mask.shape[0], mask.shape[1], Q, K)  # a padding mask (B, 1, 1, K) has one row
        seen = mask.any(dim=1).any(dim=0)  # (Q, K)
        reach = torch.where(seen, torch.arange(1, K + 1, device=seen.device), 0).amax(dim=-1)
    for start in range(0, Q, rows):
        stop = min(Q, start + rows)
        hi = K if mask is None else int(reach[start:stop].max())
        if hi < K:
            weights[:, start:stop, hi:] = 0.0
        if hi == 0:  # no query of the block sees any key: zero weights and zero output, not NaN
            out[:, start:stop] = 0.0
            continue
        if mask is None:
            base, beta = q3.new_empty(1, 1, 1).expand(BH, stop - start, hi), 0
        else:
            block = mask[..., start:stop, :hi]
            bias = torch.zeros(block.shape, dtype=q3.dtype, device=q3.device).masked_fill_(~block, float("-inf"))
            base, beta = bias.expand(B, H, stop - start, hi).reshape(BH, stop - start, hi), 1
        scores = torch.baddbmm(base, q3[:, start:stop], kT3[:, :, :hi], beta=beta, alpha=Dh**-0.5)
        torch.ops.aten._softmax.out(scores, -1, False, out=scores)
        if mask is not None and bool((reach[start:stop] == 0).any() or not block.any(dim=-1).all()):
            scores.nan_to_num_(nan=0.0)  # a row that sees no key: zeros, as in the one-pass path
        weights[:, start:stop, :hi] = scores
        torch.bmm(scores, v3[:, :hi], out=out[:, start:stop])
    return weights, out


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Equation 1 through the fused kernel; no weights are materialised."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if mask is not None:
        has_key = mask.any(dim=-1, keepdim=True)  # (B, 1, Q, 1)
        if not bool(has_key.all()):
            out = out.masked_fill(~has_key, 0.0)  # the same rule as `attention`
    return out


class MultiHeadAttention(nn.Module):
    """Multi-head attention (3.2.2): h heads of d_k = d_model / h, concatenated, then W^O."""

    def __init__(self, cfg: TransformerConfig, site: str = "attn", rotary: bool = False):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.site = site  # the name of its points (attnviz.hooks), e.g. "decoder.0.cross_attn"
        d_kv = cfg.kv_heads * cfg.d_head  # d_model, unless keys and values have fewer heads (grouped-query, later)
        self.q_proj = Linear(cfg.d_model, cfg.d_model, bias=cfg.attn_bias)  # W^Q for all heads
        self.k_proj = Linear(cfg.d_model, d_kv, bias=cfg.attn_bias)  # W^K
        self.v_proj = Linear(cfg.d_model, d_kv, bias=cfg.attn_bias)  # W^V
        self.out_proj = Linear(cfg.d_model, cfg.d_model, bias=cfg.attn_bias and cfg.attn_out_bias)  # W^O
        # Later: rotary positions rotate each query and key by its position's angles (attnviz.later).
        self.rotary = Rotary(rope_spec(cfg)) if rotary else None

    def split_heads(self, x: Tensor) -> Tensor:
        B, L, D = x.shape
        return x.view(B, L, D // self.d_head, self.d_head).transpose(1, 2)  # (B, L, D) -> (B, H, L, Dh)

    def forward(
        self,
        x_q: Tensor,
        x_kv: Tensor,
        mask: Tensor | None,
        return_attention: bool = False,
        cache: KVCache | None = None,
        start: int = 0,
        rows: tuple[Rows, Rows] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Queries from ``x_q`` (B, Q, D) attend to keys and values from ``x_kv`` (B, K, D): (out, weights).

        ``weights`` (B, H, Q, K) only with ``return_attention`` (the explicit path); otherwise the fused
        kernel runs and it is None. With ``cache``, ``x_q`` holds the new positions only, the first
        of them at position ``start`` (rotary positions need it). With ``rows`` (the queries' and the
        keys' `Rows`), ``x_q`` and ``x_kv`` are packed real tokens (N, D) and so is ``out``.
        """
        site = self.site
        mask = point(mask, site, "mask")
        split = self.split_heads if rows is None else partial(rows[0].heads, d_head=self.d_head)
        q = split(self.q_proj(x_q))  # (B, H, Q, Dh)
        if cache is not None and not cache.grows and cache.k is not None:
            k, v = cache.k, cache.v  # cross-attention: the encoder output's keys and values, projected once
        else:
            split = self.split_heads if rows is None else partial(rows[1].heads, d_head=self.d_head)
            k, v = split(self.k_proj(x_kv)), split(self.v_proj(x_kv))  # (B, Hkv, K, Dh)
            if self.rotary is not None:  # later: keys rotated before they are cached, as queries below
                observe(k, site, "k_unrotated")
                k = self.rotary(k, start)
            if cache is not None:
                k, v = cache.update(k, v)
        if self.rotary is not None:
            observe(q, site, "q_unrotated")
            q = self.rotary(q, start)
        q = point(q, site, "q")
        # Later: with grouped-query attention each key/value head serves a group of query heads.
        k, v = point(repeat_kv(k, self.n_heads), site, "k"), point(repeat_kv(v, self.n_heads), site, "v")
        return_scores = wants(site, "scores")
        if return_attention or return_scores or wants(site, "weights"):
            heads, weights, scores = attention(q, k, v, mask, return_scores=return_scores)
            observe(scores, site, "scores")
            observe(weights, site, "weights")
        else:
            heads, weights = fused_attention(q, k, v, mask), None
        heads = point(heads, site, "heads")  # (B, H, Q, Dh): each head's weighted sum of values
        B, H, Q, Dh = heads.shape
        concat = heads.transpose(1, 2).reshape(B, Q, H * Dh) if rows is None else rows[0].packed(heads)
        concat = point(concat, site, "concat")  # (B, Q, D), or (N, D) with rows
        return point(self.out_proj(concat), site, "out"), weights if return_attention else None


# ---------------------------------------------------------------------------------------------
# Position-wise feed-forward network (3.3)


class FeedForward(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, applied to each position alone (eq. 2; act = ReLU)."""

    def __init__(self, cfg: TransformerConfig, site: str = "ffn"):
        super().__init__()
        self.site = site
        self.up = Linear(cfg.d_model, cfg.d_ff, bias=cfg.ffn_bias)  # W_1: D -> F
        self.down = Linear(cfg.d_ff, cfg.d_model, bias=cfg.ffn_bias)  # W_2: F -> D
        self.activation = cfg.activation

    def forward(self, x: Tensor) -> Tensor:
        hidden = point(self.up(x, activation=self.activation), self.site, "hidden")  # (B, L, F)
        return point(self.down(hidden), self.site, "out")


def feed_forward(cfg: TransformerConfig, site: str) -> nn.Module:
    """The paper's feed-forward network, or (later) the gated one a config asks for."""
    if cfg.ffn == "gated":
        return GatedFeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.ffn_bias, site)
    return FeedForward(cfg, site)


def rope_spec(cfg: TransformerConfig) -> RopeSpec:
    """The rotary angles' parameters of ``cfg`` (attnviz.later)."""
    return RopeSpec(
        cfg.d_head,
        cfg.rope_theta,
        cfg.rope_scaling,
        cfg.rope_factor,
        cfg.rope_low_freq_factor,
        cfg.rope_high_freq_factor,
        cfg.rope_original_max_len,
    )


# ---------------------------------------------------------------------------------------------
# Encoder and decoder layers (3.1)


class SublayerConnection(nn.Module):
    """Residual + LayerNorm around a sub-layer: LN(x + Dropout(Sublayer(x))) in the paper (post-LN).

    With ``norm_first`` (pre-LN, a later variant) it is x + Dropout(Sublayer(LN(x))). A layer asks
    for the sub-layer's input, runs the sub-layer, then calls the block with both.
    """

    def __init__(self, cfg: TransformerConfig, site: str = "block"):
        super().__init__()
        self.site = site
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.ln_eps)  # LayerNorm; RMSNorm in later models
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def sublayer_input(self, x: Tensor) -> Tensor:
        """What the sub-layer reads: x itself (post-LN) or LN(x) (pre-LN)."""
        observe(x, self.site, "input")
        return self.norm(x) if self.norm_first else x

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        residual = point(x + self.dropout(sublayer_out), self.site, "residual")
        return point(residual if self.norm_first else self.norm(residual), self.site, "output")


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each wrapped in residual + LayerNorm."""

    def __init__(self, cfg: TransformerConfig, site: str = "encoder.0"):
        super().__init__()
        rotary = cfg.pos_encoding == "rotary"  # later: rotary positions live in self-attention
        self.self_attn = MultiHeadAttention(cfg, act_name(site, "attn"), rotary=rotary)
        self.ffn = feed_forward(cfg, act_name(site, "ffn"))
        self.attn_block = SublayerConnection(cfg, act_name(site, "attn_block"))
        self.ffn_block = SublayerConnection(cfg, act_name(site, "ffn_block"))

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        return_attention: bool = False,
        rows: Rows | None = None,
        stop_at_map: bool = False,
    ) -> tuple[Tensor | None, Tensor | None]:
        """(output, weights). With ``rows`` ``x`` holds the real tokens only (`Rows`); with
        ``stop_at_map`` the layer stops once its map is made and returns no output."""
        h = self.attn_block.sublayer_input(x)
        out, weights = self.self_attn(h, h, mask, return_attention, rows=None if rows is None else (rows, rows))
        if stop_at_map:
            return None, weights
        x = self.attn_block(x, out)
        x = self.ffn_block(x, self.ffn(self.ffn_block.sublayer_input(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder (cross) attention, feed-forward (3.1).

    A decoder-only model (later: GPT-2, Llama) has no encoder, so its layers have no cross-attention.
    """

    def __init__(self, cfg: TransformerConfig, site: str = "decoder.0"):
        super().__init__()
        rotary = cfg.pos_encoding == "rotary"
        self.self_attn = MultiHeadAttention(cfg, act_name(site, "self_attn"), rotary=rotary)
        self.self_block = SublayerConnection(cfg, act_name(site, "self_block"))
        if not cfg.decoder_only:
            self.cross_attn = MultiHeadAttention(cfg, act_name(site, "cross_attn"))
            self.cross_block = SublayerConnection(cfg, act_name(site, "cross_block"))
        self.ffn = feed_forward(cfg, act_name(site, "ffn"))
        self.ffn_block = SublayerConnection(cfg, act_name(site, "ffn_block"))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        self_mask: Tensor,
        cross_mask: Tensor | None,
        return_attention: bool = False,
        cache: LayerCache | None = None,
        start: int = 0,
        rows: tuple[Rows, Rows | None] | None = None,
        stop_at_map: bool = False,
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """Returns the layer's output and its self- and cross-attention weights (None without ``return_attention``).

        ``memory`` is None in a decoder-only model; ``start`` is the position of ``x``'s first row.
        With ``rows`` (the target's and the source's `Rows`) ``x`` and ``memory`` hold real tokens
        only; with ``stop_at_map`` the layer stops once its last map is made and returns no output.
        """
        h = self.self_block.sublayer_input(x)
        self_cache = None if cache is None else cache.self_attn
        self_rows = None if rows is None else (rows[0], rows[0])
        out, self_weights = self.self_attn(h, h, self_mask, return_attention, self_cache, start, self_rows)
        if stop_at_map and memory is None:
            return None, self_weights, None
        x = self.self_block(x, out)
        cross_weights = None
        if memory is not None:
            h = self.cross_block.sublayer_input(x)  # queries from the decoder, keys and values from the encoder
            out, cross_weights = self.cross_attn(
                h, memory, cross_mask, return_attention, None if cache is None else cache.cross_attn, rows=rows
            )
            if stop_at_map:
                return None, self_weights, cross_weights
            x = self.cross_block(x, out)
        x = self.ffn_block(x, self.ffn(self.ffn_block.sublayer_input(x)))
        return x, self_weights, cross_weights


# ---------------------------------------------------------------------------------------------
# The whole model


@dataclass(frozen=True)
class Attention:
    """Every attention map of one forward pass: per layer, tensors shaped (B, H, query, key).

    Rows are queries, columns are keys. ``cross`` is target rows by source columns.
    """

    encoder: tuple[Tensor, ...]  # L_enc x (B, H, S, S); empty for a decoder-only model
    decoder: tuple[Tensor, ...]  # L_dec x (B, H, T, T), causal
    cross: tuple[Tensor, ...]  # L_dec x (B, H, T, S); empty without an encoder

    def stacked(self, kind: str) -> Tensor:
        """All layers of one kind as one tensor (L, B, H, Q, K); large CPU maps in reused memory (attnviz.buffers)."""
        maps = getattr(self, kind)
        first = maps[0]
        if first.device.type == "cpu" and first.dtype == torch.float32 and not first.requires_grad:
            if len(maps) * first.numel() >= BLOCKS_FROM:
                return torch.stack(maps, out=buffers.MAPS.empty((len(maps), *first.shape)))
        return torch.stack(maps)


@dataclass(frozen=True)
class Seq2SeqOutput:
    logits: Tensor | None  # (B, T, V): scores for the token after each target position
    memory: Tensor | None  # (B, S, D): the encoder output; None for a decoder-only model
    attention: Attention | None = None


class Transformer(nn.Module):
    """The encoder-decoder of Figure 1, or its encoder alone (``n_dec_layers=0``: BERT), or its decoder
    alone (``n_enc_layers=0``: a language model such as GPT-2 or Llama)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.src_embed = TokenEmbedding(cfg.src_vocab_size, cfg.d_model, cfg.scale_embedding)
        self.tgt_embed = (
            self.src_embed
            if cfg.share_embeddings
            else TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model, cfg.scale_embedding)
        )
        self.pos = PositionalEncoding(cfg)
        if cfg.type_vocab_size:
            self.token_type = nn.Parameter(torch.zeros(cfg.type_vocab_size, cfg.d_model))
        self.embed_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) if cfg.embed_norm else nn.Identity()
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg, act_name("encoder", i)) for i in range(cfg.n_enc_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg, act_name("decoder", i)) for i in range(cfg.n_dec_layers))
        # Pre-LN stacks end with a LayerNorm; the paper's post-LN stacks already end normalised.
        final_norm = cfg.norm_first and cfg.n_enc_layers > 0
        self.encoder_norm = make_norm(cfg.norm, cfg.d_model, cfg.ln_eps) if final_norm else nn.Identity()
        self.decoder_norm = make_norm(cfg.norm, cfg.d_model, cfg.ln_eps) if cfg.norm_first else nn.Identity()
        if not cfg.tie_output:
            self.out_proj = nn.Parameter(normal_weights(cfg.tgt_vocab_size, cfg.d_model, std=cfg.d_model**-0.5))
        if cfg.output_bias:
            self.out_bias = nn.Parameter(torch.zeros(cfg.tgt_vocab_size))
        self._init_weights()

    @classmethod
    def holding(cls, cfg: TransformerConfig, tensors: dict[str, Tensor]) -> Transformer:
        """A model of ``cfg`` on the CPU holding ``tensors``, one for each of its parameters, by name.

        It is built on the meta device and then given memory, so the random initial weights that
        ``tensors`` would overwrite are never drawn: drawing GPT-2 small's took 0.95 s of each load.
        The one thing computed rather than loaded, a sinusoidal position table, is computed after.
        """
        with torch.device("meta"):
            model = cls(cfg)
        # Memory for each meta tensor, as Module.to_empty gives it, but made by torch.empty: to_empty's
        # empty_like on the meta device runs torch's Python reference, which imports sympy: 0.3 CPU s
        # in every process that loads a model. A tensor two modules share is given memory once.
        given: dict[int, Tensor] = {}
        for module in model.modules():
            for name, meta in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                if id(meta) not in given:
                    real = torch.empty(meta.shape, dtype=meta.dtype)
                    given[id(meta)] = nn.Parameter(real, meta.requires_grad) if isinstance(meta, nn.Parameter) else real
                setattr(module, name, given[id(meta)])
        with torch.no_grad():
            for key, p in model.named_parameters():
                p.copy_(tensors[key])
            if model.pos.kind.startswith("sinusoidal"):
                model.pos.table.copy_(model.pos.sinusoids())
        return model

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() == 2 and "embed" not in name and name not in ("pos.table", "token_type"):
                nn.init.xavier_uniform_(p)

    @property
    def device(self) -> torch.device:
        return self.src_embed.weight.device

    def _check_ids(self, ids: Tensor, vocab_size: int, side: str) -> None:
        if ids.dim() != 2:
            raise InputError(f"{side} ids must be shaped (batch, length), got {tuple(ids.shape)}")
        if ids.numel() and bool(((ids < 0) | (ids >= vocab_size)).any()):
            raise InputError(f"{side} ids must lie in [0, {vocab_size}); got {int(ids.min())}..{int(ids.max())}")

    def encode(
        self,
        src: Tensor,
        src_valid: Tensor | None = None,
        return_attention: bool = False,
        *,
        rows: Rows | None = None,
        stop_at_map: bool = False,
    ) -> tuple[Tensor | None, list[Tensor | None]]:
        """Source ids (B, S) -> memory (B, S, D) and each layer's self-attention weights (or Nones).

        With ``rows`` (`Rows` of ``src``) the work runs on the real tokens only and memory is packed
        (N, D); with ``stop_at_map`` the last layer stops at its map and memory is None.
        """
        self._check_ids(src, self.cfg.src_vocab_size, "source")
        mask = attention_masks(src_valid)["encoder"]
        ids = src if rows is None else rows.pack(src)
        x = point(self.src_embed(ids), "src", "embed")  # already scaled by sqrt(d_model) when the config says so
        pos = self.pos(0, src.shape[1])
        if pos is not None:
            x = x + point(pos if rows is None else pos[rows.position], "src", "pos")
        if self.cfg.type_vocab_size:
            x = x + self.token_type[0]  # one segment: every token has type 0
        x = point(self.dropout(self.embed_norm(x)), "src", "input")
        weights = []
        for i, layer in enumerate(self.encoder_layers):
            x, w = layer(x, mask, return_attention, rows, stop_at_map and i == len(self.encoder_layers) - 1)
            weights.append(w)
        return (None if stop_at_map else point(self.encoder_norm(x), "memory")), weights

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_valid: Tensor | None = None,
        tgt_valid: Tensor | None = None,
        return_attention: bool = False,
        cache: list[LayerCache] | None = None,
        return_logits: bool = True,
        *,
        rows: tuple[Rows, Rows | None] | None = None,
        stop_at_map: bool = False,
    ) -> tuple[Tensor | None, list, list]:
        """Target ids (B, T) and memory -> logits (B, T, V), self- and cross-attention weights per layer.

        With ``cache`` (one `LayerCache` per layer), ``tgt`` holds only the new positions;
        earlier keys and values come from the cache, which is updated in place. Without
        ``return_logits`` the output projection (a large matmul over the vocabulary) is skipped and
        None is returned in its place: attention maps do not need it. With ``rows`` (the target's
        and the source's `Rows`) the work runs on real tokens only, from a packed memory; with
        ``stop_at_map`` the last layer stops at its last map (no logits).
        """
        if self.cfg.encoder_only:
            raise InputError("this model is encoder-only: it has no decoder to translate or decode with")
        if (memory is None) != self.cfg.decoder_only:
            raise InputError("a decoder-only model reads no encoder output; an encoder-decoder needs one")
        self._check_ids(tgt, self.cfg.tgt_vocab_size, "target")
        T = tgt.shape[1]
        start = 0 if cache is None else cache[0].length
        masks = attention_masks(src_valid, tgt_valid, tgt_len=start + T, device=tgt.device, start=start)
        x = point(self.tgt_embed(tgt if rows is None else rows[0].pack(tgt)), "tgt", "embed")
        pos = self.pos(start, T)
        if pos is not None:
            x = x + point(pos if rows is None else pos[rows[0].position], "tgt", "pos")
        x = point(self.dropout(x), "tgt", "input")
        self_weights, cross_weights = [], []
        for i, layer in enumerate(self.decoder_layers):
            x, s, c = layer(
                x,
                memory,
                masks["decoder"],
                masks["cross"],
                return_attention,
                None if cache is None else cache[i],
                start,
                rows,
                stop_at_map and i == len(self.decoder_layers) - 1,
            )
            self_weights.append(s)
            cross_weights.append(c)
        if stop_at_map:
            return None, self_weights, cross_weights
        x = point(self.decoder_norm(x), "decoder_out")
        logits = point(self.logits(x), "logits") if return_logits else None
        return logits, self_weights, cross_weights

    def logits(self, x: Tensor) -> Tensor:
        """The pre-softmax linear transformation, tied to the target embedding (3.4)."""
        weight = self.tgt_embed.weight if self.cfg.tie_output else self.out_proj
        return linear(x, weight, self.out_bias if self.cfg.output_bias else None)  # (B, T, D) -> (B, T, V)

    def forward(
        self,
        src: Tensor | None,
        tgt: Tensor | None = None,
        src_valid: Tensor | None = None,
        tgt_valid: Tensor | None = None,
        *,
        return_attention: bool = False,
        return_logits: bool = True,
    ) -> Seq2SeqOutput:
        """Teacher-forced forward pass.

        ``src`` (B, S) and ``tgt`` (B, T) are token ids; ``tgt`` starts with the start token.
        ``src_valid`` / ``tgt_valid`` (bool, True = real token) mark padding. With
        ``return_attention`` every map is returned. ``return_logits=False`` skips the output
        projection (``logits`` is then None). Without ``tgt`` (the only way for an encoder-only
        model) just the encoder runs. A decoder-only model takes ``src=None`` and its sequence as
        ``tgt`` (from its first token, a BOS where the tokenizer adds one). Intermediate tensors:
        `attnviz.hooks.Recorder`.
        """
        return self._teacher_forced(src, tgt, src_valid, tgt_valid, return_attention, return_logits)

    def attention_maps(
        self,
        src: Tensor | None,
        tgt: Tensor | None = None,
        src_valid: Tensor | None = None,
        tgt_valid: Tensor | None = None,
    ) -> Attention:
        """Every attention map of the teacher-forced pass, computing only what the maps need.

        The same maps as ``forward(..., return_attention=True).attention`` (to float32 rounding) on
        every real query's row, from the same arguments; the rows of padding hold other numbers
        (their query is zeros here), which nothing should read. What it leaves out: the padding's
        share of every linear layer, norm and feed-forward network (those run on the real tokens
        only, `Rows`), the last layer's work after its last map, and the logits. The head atlas runs
        on it (``attnviz.atlas.engine``). Inside a hook block (`attnviz.hooks`) it is ``forward``, so
        that every point sees the padded tensors it documents.
        """
        if hooks_active():
            return self.forward(src, tgt, src_valid, tgt_valid, return_attention=True, return_logits=False).attention
        return self._teacher_forced(src, tgt, src_valid, tgt_valid, True, False, maps_only=True).attention

    def _teacher_forced(
        self,
        src: Tensor | None,
        tgt: Tensor | None,
        src_valid: Tensor | None,
        tgt_valid: Tensor | None,
        return_attention: bool,
        return_logits: bool,
        maps_only: bool = False,
    ) -> Seq2SeqOutput:
        """`forward`, or with ``maps_only`` `attention_maps`' pass (``memory`` is then None)."""
        rows_src = None  # the source's `Rows` under maps_only
        if self.cfg.decoder_only:  # a language model: the decoder reads ``tgt`` (the prompt) alone
            if src is not None or tgt is None:
                raise InputError("a decoder-only model reads one sequence: pass it as tgt, with src None")
            memory, enc = None, []
        else:  # with maps_only, the encoder's last layer goes on only when the decoder reads its output
            rows_src = Rows(src_valid, tuple(src.shape), src.device) if maps_only and src is not None else None
            memory, enc = self.encode(
                src, src_valid, return_attention, rows=rows_src, stop_at_map=maps_only and tgt is None
            )
        logits, dec, cross = None, [], []
        if tgt is not None:
            rows = (Rows(tgt_valid, tuple(tgt.shape), tgt.device), rows_src) if maps_only else None
            logits, dec, cross = self.decode(
                tgt,
                memory,
                src_valid,
                tgt_valid,
                return_attention,
                return_logits=return_logits,
                rows=rows,
                stop_at_map=maps_only,
            )
        cross = [c for c in cross if c is not None] if self.cfg.decoder_only else cross
        attn = Attention(tuple(enc), tuple(dec), tuple(cross)) if return_attention else None
        return Seq2SeqOutput(logits=logits, memory=None if maps_only else memory, attention=attn)
