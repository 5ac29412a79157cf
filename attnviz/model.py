"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), returning its attention.

Read top to bottom, smallest part first, in the order of the paper's Figure 1: the config, masks,
embeddings and positional encoding (3.4, 3.5), scaled dot-product attention (eq. 1), multi-head
attention (3.2.2), the position-wise feed-forward network (3.3), encoder and decoder layers (3.1),
and the whole model.

Attention is returned, not hooked: every attention module returns ``(out, record or None)`` and the
model gathers the records into a frozen :class:`Attention` when ``return_attention=True``. Without
the flag the fused ``F.scaled_dot_product_attention`` kernel runs and no map is materialised.

Where the paper is silent this file chooses, and says so: biases on the attention projections
(``attn_bias``, as in tensor2tensor and Marian), LayerNorm epsilon 1e-5, Xavier-uniform
initialisation of the linear layers, positions counted from 0, and a query with no key to attend
to (only possible with an all-padding row) giving zeros instead of NaN. Options beyond the paper
(pre-LN, GELU/swish, learned or concatenated positions, an output bias) exist for real checkpoints;
the defaults are the paper's.

Shape letters, used in comments throughout: B batch, S source length, T target length, Q query
length, K key length, H heads, Dh d_head, D d_model, F d_ff, V vocabulary size, L layers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnviz.errors import ConfigError, InputError
from attnviz.linear import ACTIVATIONS as LINEAR_ACTIVATIONS
from attnviz.linear import Linear, linear

ACTIVATIONS = tuple(name for name in LINEAR_ACTIVATIONS if name)  # ("relu", "gelu", "swish")
POS_ENCODINGS = ("sinusoidal", "sinusoidal_concat", "learned", "none")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters; the defaults are the paper's base model (Table 3, row "base")."""

    src_vocab_size: int = 37000  # the paper's shared byte-pair vocabulary (5.1)
    tgt_vocab_size: int = 37000
    n_enc_layers: int = 6  # N
    n_dec_layers: int = 6  # N
    d_model: int = 512  # d_model
    n_heads: int = 8  # h
    d_ff: int = 2048  # d_ff
    dropout: float = 0.1  # P_drop, on sub-layer outputs and on embedding + position sums (5.4)
    norm_first: bool = False  # False: post-LN, LN(x + Sublayer(x)) as in the paper; True: pre-LN
    activation: str = "relu"  # relu (paper) | gelu | swish
    pos_encoding: str = "sinusoidal"  # sinusoidal (interleaved, paper) | sinusoidal_concat | ...
    max_len: int = 1024  # longest sequence the positional encoding is built for
    share_embeddings: bool = True  # one matrix for source and target embeddings (3.4)
    tie_output: bool = True  # pre-softmax linear = target embedding matrix (3.4)
    output_bias: bool = False  # a bias on the logits (Marian's final_logits_bias)
    attn_bias: bool = True  # biases on the Q, K, V and output projections
    scale_embedding: bool = True  # multiply embeddings by sqrt(d_model) (3.4)
    ln_eps: float = 1e-5  # LayerNorm epsilon
    type_vocab_size: int = 0  # BERT's token-type (segment) embeddings, type 0 used; 0: none, as in the paper
    embed_norm: bool = False  # a LayerNorm on the encoder's embedding sum (BERT); the paper has none
    pad_id: int = 0
    bos_id: int = 1  # the decoder's start token
    eos_id: int = 2
    unk_id: int = 3

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            value = getattr(self, f.name)
            kind = {"int": int, "float": (int, float), "bool": bool, "str": str}[f.type]
            if not isinstance(value, kind) or (f.type != "bool" and isinstance(value, bool)):
                problems.append(f"{f.name} must be of type {f.type}, got {value!r}")
        if problems:  # the checks below compare values, which needs the right types
            raise ConfigError("invalid model config: " + "; ".join(problems))
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("n_enc_layers", "n_dec_layers", "type_vocab_size"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")
        if not problems and self.d_model % self.n_heads:
            problems.append(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.activation not in ACTIVATIONS:
            problems.append(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.pos_encoding not in POS_ENCODINGS:
            problems.append(f"pos_encoding must be one of {POS_ENCODINGS}, got {self.pos_encoding!r}")
        if self.pos_encoding.startswith("sinusoidal") and self.d_model % 2:
            problems.append("sinusoidal positions need an even d_model")
        if not 0.0 <= self.dropout < 1.0:
            problems.append(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            problems.append("share_embeddings needs src_vocab_size == tgt_vocab_size")
        if not self.ln_eps > 0:
            problems.append(f"ln_eps must be positive, got {self.ln_eps!r}")
        for name in ("pad_id", "bos_id", "eos_id", "unk_id"):
            value = getattr(self, name)
            if not 0 <= value < min(self.src_vocab_size, self.tgt_vocab_size):
                problems.append(f"{name} must be a token id inside both vocabularies, got {value!r}")
        if problems:
            raise ConfigError("invalid model config: " + "; ".join(problems))

    @property
    def encoder_only(self) -> bool:
        """True for a model with no decoder (BERT-style): it has encoder self-attention only."""
        return self.n_dec_layers == 0

    @property
    def d_head(self) -> int:
        """d_k = d_v = d_model / h (3.2.2)."""
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TransformerConfig:
        """Build a config from JSON data, naming unknown or mistyped keys."""
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; expected a subset of {sorted(known)}")
        return cls(**data)


# ---------------------------------------------------------------------------------------------
# Masks: one convention everywhere, boolean, True = this query may attend to this key.


def attention_masks(
    src_valid: Tensor | None, tgt_valid: Tensor | None = None, tgt_len: int = 0, device=None
) -> dict[str, Tensor | None]:
    """Boolean masks (True = may attend) for encoder self, decoder self and cross-attention.

    ``src_valid`` (B, S) and ``tgt_valid`` (B, T) say which positions hold real tokens; None means
    no padding, and then the encoder and cross masks are None (nothing to mask, nothing to pay).
    Padding is never inferred from ids: Marian's decoder starts with the pad id, so
    ``ids != pad`` would be wrong. The decoder mask (B or 1, 1, T, T) is always causal.
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
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()[None, None]  # subsequent mask
        masks["decoder"] = causal if tgt_valid is None else causal & tgt_valid[:, None, None, :]
    return masks


# ---------------------------------------------------------------------------------------------
# Embeddings and positional encoding (3.4, 3.5)


def sinusoidal_table(n_positions: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """The (n_positions, d_model) sinusoid table of section 3.5, positions from 0.

    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).
    ``layout="interleaved"`` is the paper's; ``"concat"`` puts every sine first and every cosine
    after (tensor2tensor and Marian). Both hold the same numbers in a different column order.
    """
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
    angles = pos * inv_freq  # (P, D/2)
    sin, cos = torch.sin(angles), torch.cos(angles)
    if layout == "interleaved":
        table = torch.stack([sin, cos], dim=-1).reshape(n_positions, d_model)
    elif layout == "concat":
        table = torch.cat([sin, cos], dim=-1)
    else:
        raise ValueError(f"layout must be 'interleaved' or 'concat', got {layout!r}")
    return table.float()


class TokenEmbedding(nn.Module):
    """Token ids -> vectors, scaled by sqrt(d_model) as in section 3.4."""

    def __init__(self, vocab_size: int, d_model: int, scale: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab_size, d_model) * d_model**-0.5)
        self.scale = math.sqrt(d_model) if scale else 1.0

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight) * self.scale  # (B, L, D)


class PositionalEncoding(nn.Module):
    """Adds position information: fixed sinusoids (3.5), a learned table, or nothing."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.kind = cfg.pos_encoding
        self.max_len = cfg.max_len
        if self.kind == "learned":
            self.table = nn.Parameter(torch.randn(cfg.max_len, cfg.d_model) * 0.02)
        elif self.kind.startswith("sinusoidal"):
            layout = "concat" if self.kind == "sinusoidal_concat" else "interleaved"
            # Not saved with the weights: it is a function of the config, rebuilt on load.
            self.register_buffer("table", sinusoidal_table(cfg.max_len, cfg.d_model, layout), persistent=False)
        else:
            self.table = None

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        L = x.shape[1]
        if start + L > self.max_len:
            raise InputError(
                f"sequence of {start + L} tokens is longer than this model's maximum of {self.max_len}; "
                "shorten the input"
            )
        if self.table is None:
            return x
        return x + self.table[start : start + L]  # (B, L, D) + (L, D)


# ---------------------------------------------------------------------------------------------
# Scaled dot-product attention (3.2.1, equation 1)


@dataclass(frozen=True)
class AttentionRecord:
    """What one attention module computed, per head. Masked score entries are -inf."""

    weights: Tensor  # (B, H, Q, K) post-softmax, pre-dropout
    scores: Tensor | None = None  # (B, H, Q, K) Q K^T / sqrt(d_k), before softmax
    q: Tensor | None = None  # (B, H, Q, Dh)
    k: Tensor | None = None  # (B, H, K, Dh)
    v: Tensor | None = None  # (B, H, K, Dh)


class Tracer:
    """Collects a forward pass's intermediate tensors by name, for the step-by-step walkthrough.

    Modules call ``trace("name", tensor)`` and hand ``trace.sub("part")`` to their children, so names
    read like paths: ``encoder.0.attn.weights``. Nothing is stored on the modules: the model stays
    immutable and shareable; the collected dict belongs to the caller.
    """

    def __init__(self, store: dict[str, Tensor] | None = None, prefix: str = ""):
        self.store = {} if store is None else store
        self.prefix = prefix

    def sub(self, name: str) -> Tracer:
        return Tracer(self.store, f"{self.prefix}{name}.")

    def __call__(self, name: str, tensor: Tensor) -> None:
        self.store[self.prefix + name] = tensor.detach()


def _sub(trace: Tracer | None, name: str) -> Tracer | None:
    return None if trace is None else trace.sub(name)


def attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, keep_scores: bool = True
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Equation 1, softmax(Q K^T / sqrt(d_k)) V, explicitly: returns (output, weights, scores).

    ``q`` and ``k`` (B, H, Q or K, Dh), ``v`` (B, H, K, Dv); ``mask`` (True = may attend) broadcasts to
    (B, H, Q, K). Blocked scores are -inf, and a query whose every key is blocked gets all-zero
    weights (and output), not NaN. With ``keep_scores=False`` the scores are not returned (None)
    and, on the CPU when no gradient is recorded, the softmax overwrites them: one (B, H, Q, K)
    allocation less, whose first touch of fresh memory was the main cost on long inputs.

    It computes what ``(q / sqrt(d_k)) @ k^T``, ``masked_fill`` and ``softmax`` would, in fewer passes
    over the scores: the scale and the mask (as an added 0 / -inf bias) go into the matrix multiply,
    and the heads run as one batch of B*H. With those, returning the maps costs a few per cent over
    the fused kernel (``benchmarks/bench_forward.py``); the plain version cost 2.5x at 256 tokens.
    """
    B, H, Q, Dh = q.shape
    K = k.shape[2]
    q3, kT3 = q.reshape(B * H, Q, Dh), k.reshape(B * H, K, Dh).transpose(1, 2)  # (BH, Q, Dh), (BH, Dh, K)
    if mask is None:  # beta=0: the first argument only gives the shape; its values are never read
        scores = torch.baddbmm(q3.new_empty(1, 1, 1).expand(B * H, Q, K), q3, kT3, beta=0, alpha=Dh**-0.5)
    else:
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        scores = torch.baddbmm(bias.expand(B, H, Q, K).reshape(B * H, Q, K), q3, kT3, alpha=Dh**-0.5)
    if keep_scores or scores.device.type != "cpu" or (torch.is_grad_enabled() and scores.requires_grad):
        weights = torch.softmax(scores, dim=-1)
    else:  # torch's CPU kernel reads each element of a row before it overwrites it: safe in place
        weights = torch.ops.aten._softmax.out(scores, -1, False, out=scores)
    weights = weights.view(B, H, Q, K)
    if mask is not None and not bool(mask.any(dim=-1).all()):
        weights = weights.masked_fill(~mask, 0.0)  # rows that were all -inf are NaN: zero them
    Dv = v.shape[-1]  # d_v, which the paper lets differ from d_k
    out = torch.bmm(weights.reshape(B * H, Q, K), v.reshape(B * H, K, Dv)).view(B, H, Q, Dv)
    return out, weights, scores.view(B, H, Q, K) if keep_scores else None


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

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.n_heads, self.d_head = cfg.n_heads, cfg.d_head
        self.q_proj = Linear(cfg.d_model, cfg.d_model, bias=cfg.attn_bias)  # W^Q for all heads
        self.k_proj = Linear(cfg.d_model, cfg.d_model, bias=cfg.attn_bias)  # W^K
        self.v_proj = Linear(cfg.d_model, cfg.d_model, bias=cfg.attn_bias)  # W^V
        self.out_proj = Linear(cfg.d_model, cfg.d_model, bias=cfg.attn_bias)  # W^O

    def split_heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # (B, L, D) -> (B, H, L, Dh)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        capture: str | None,
        trace: Tracer | None = None,
    ) -> tuple[Tensor, AttentionRecord | None]:
        """Attention over already projected heads, then concat and W^O.

        ``capture`` is None (fused kernel, no record), "weights" or "internals" (also scores, Q, K, V).
        ``trace`` also collects each head's weighted sum of values, their concatenation and W^O's output.
        """
        if trace is not None:
            capture = "internals"
        if capture is None:
            heads, record = fused_attention(q, k, v, mask), None
        else:
            heads, weights, scores = attention(q, k, v, mask, keep_scores=capture == "internals")
            if capture == "internals":
                record = AttentionRecord(weights, scores, q, k, v)
            else:
                record = AttentionRecord(weights)
        B, H, Q, Dh = heads.shape
        concat = heads.transpose(1, 2).reshape(B, Q, H * Dh)  # (B, H, Q, Dh) -> (B, Q, D)
        out = self.out_proj(concat)
        if trace is not None:
            for name, value in (
                ("q", q),
                ("k", k),
                ("v", v),
                ("scores", record.scores),
                ("weights", record.weights),
                ("heads", heads),
                ("concat", concat),
                ("out", out),
            ):
                trace(name, value)
        return out, record

    def forward(
        self,
        x_q: Tensor,
        x_kv: Tensor,
        mask: Tensor | None,
        capture: str | None = None,
        trace: Tracer | None = None,
    ) -> tuple[Tensor, AttentionRecord | None]:
        q = self.split_heads(self.q_proj(x_q))  # (B, H, Q, Dh)
        k, v = self.project_kv(x_kv)  # (B, H, K, Dh) each
        return self.attend(q, k, v, mask, capture, trace)


# ---------------------------------------------------------------------------------------------
# Position-wise feed-forward network (3.3)


class FeedForward(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, applied to each position alone (eq. 2; act = ReLU)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.up = Linear(cfg.d_model, cfg.d_ff)  # W_1: D -> F
        self.down = Linear(cfg.d_ff, cfg.d_model)  # W_2: F -> D
        self.activation = cfg.activation

    def forward(self, x: Tensor, trace: Tracer | None = None) -> Tensor:
        hidden = self.up(x, activation=self.activation)  # (B, L, F)
        out = self.down(hidden)
        if trace is not None:
            trace("hidden", hidden)
            trace("out", out)
        return out


# ---------------------------------------------------------------------------------------------
# Encoder and decoder layers (3.1)


class SublayerConnection(nn.Module):
    """Residual + LayerNorm around a sub-layer: LN(x + Dropout(Sublayer(x))) in the paper (post-LN).

    With ``norm_first`` (pre-LN, a later variant) it is x + Dropout(Sublayer(LN(x))).
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm_first = cfg.norm_first

    def forward(self, x: Tensor, sublayer, trace: Tracer | None = None) -> tuple[Tensor, AttentionRecord | None]:
        """``sublayer`` maps a tensor to ``(out, record)``; returns ``(new x, record)``.

        ``trace`` collects the block's ``input``, the ``residual`` sum and the ``output``.
        """
        if self.norm_first:
            out, record = sublayer(self.norm(x))
            residual = x + self.dropout(out)
            new_x = residual
        else:
            out, record = sublayer(x)
            residual = x + self.dropout(out)
            new_x = self.norm(residual)
        if trace is not None:
            trace("input", x)
            trace("residual", residual)
            trace("output", new_x)
        return new_x, record


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each wrapped in residual + LayerNorm."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg)
        self.ffn = FeedForward(cfg)
        self.attn_block = SublayerConnection(cfg)
        self.ffn_block = SublayerConnection(cfg)

    def forward(
        self, x: Tensor, mask: Tensor, capture: str | None, trace: Tracer | None = None
    ) -> tuple[Tensor, AttentionRecord | None]:
        x, record = self.attn_block(
            x, lambda h: self.self_attn(h, h, mask, capture, _sub(trace, "attn")), _sub(trace, "attn_block")
        )
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h, _sub(trace, "ffn")), None), _sub(trace, "ffn_block"))
        return x, record


@dataclass
class LayerCache:
    """Keys and values a decoder layer keeps between decoding steps (not part of the model)."""

    self_k: Tensor | None = None  # (B, H, t, Dh): grows by one position per step
    self_v: Tensor | None = None
    cross_k: Tensor | None = None  # (B, H, S, Dh): computed once from the encoder output
    cross_v: Tensor | None = None

    def select(self, index: Tensor) -> LayerCache:
        """The cache for the batch rows in ``index`` (beam search reorders hypotheses)."""
        return LayerCache(
            *(
                None if t is None else t.index_select(0, index)
                for t in (self.self_k, self.self_v, self.cross_k, self.cross_v)
            )
        )


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder (cross) attention, feed-forward (3.1)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg)
        self.cross_attn = MultiHeadAttention(cfg)
        self.ffn = FeedForward(cfg)
        self.self_block = SublayerConnection(cfg)
        self.cross_block = SublayerConnection(cfg)
        self.ffn_block = SublayerConnection(cfg)

    def _self(self, h: Tensor, mask: Tensor, capture: str | None, cache: LayerCache | None, trace=None):
        attn = self.self_attn
        q = attn.split_heads(attn.q_proj(h))  # (B, H, t_new, Dh)
        k, v = attn.project_kv(h)
        if cache is not None:
            if cache.self_k is not None:
                k = torch.cat([cache.self_k, k], dim=2)  # (B, H, t_old + t_new, Dh)
                v = torch.cat([cache.self_v, v], dim=2)
            cache.self_k, cache.self_v = k, v
        return attn.attend(q, k, v, mask, capture, trace)

    def _cross(
        self, h: Tensor, memory: Tensor, mask: Tensor, capture: str | None, cache: LayerCache | None, trace=None
    ):
        attn = self.cross_attn
        q = attn.split_heads(attn.q_proj(h))  # queries from the decoder
        if cache is not None and cache.cross_k is not None:
            k, v = cache.cross_k, cache.cross_v
        else:
            k, v = attn.project_kv(memory)  # keys and values from the encoder output
            if cache is not None:
                cache.cross_k, cache.cross_v = k, v
        return attn.attend(q, k, v, mask, capture, trace)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor,
        cross_mask: Tensor,
        capture: str | None,
        cache: LayerCache | None = None,
        trace: Tracer | None = None,
    ) -> tuple[Tensor, AttentionRecord | None, AttentionRecord | None]:
        x, self_rec = self.self_block(
            x, lambda h: self._self(h, self_mask, capture, cache, _sub(trace, "self_attn")), _sub(trace, "self_block")
        )
        x, cross_rec = self.cross_block(
            x,
            lambda h: self._cross(h, memory, cross_mask, capture, cache, _sub(trace, "cross_attn")),
            _sub(trace, "cross_block"),
        )
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h, _sub(trace, "ffn")), None), _sub(trace, "ffn_block"))
        return x, self_rec, cross_rec


# ---------------------------------------------------------------------------------------------
# The whole model


@dataclass(frozen=True)
class Attention:
    """Every attention map of one forward pass: per layer, tensors shaped (B, H, query, key).

    Rows are queries, columns are keys. ``cross`` is target rows by source columns. ``internals``
    (when asked for) holds the full :class:`AttentionRecord` of every layer, by the same kinds.
    """

    encoder: tuple[Tensor, ...]  # L_enc x (B, H, S, S)
    decoder: tuple[Tensor, ...]  # L_dec x (B, H, T, T), causal
    cross: tuple[Tensor, ...]  # L_dec x (B, H, T, S)
    internals: dict[str, tuple[AttentionRecord, ...]] | None = None

    def stacked(self, kind: str) -> Tensor:
        """All layers of one kind as one tensor (L, B, H, Q, K)."""
        return torch.stack(getattr(self, kind))


@dataclass(frozen=True)
class Seq2SeqOutput:
    logits: Tensor | None  # (B, T, V): scores for the token after each target position
    memory: Tensor  # (B, S, D): the encoder output
    attention: Attention | None = None
    trace: dict[str, Tensor] | None = None  # with return_trace: every intermediate tensor by name


class Transformer(nn.Module):
    """The encoder-decoder of Figure 1 (or its encoder alone, with ``n_dec_layers=0``)."""

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
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_enc_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_dec_layers))
        # Pre-LN stacks end with a LayerNorm; the paper's post-LN stacks already end normalised.
        self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) if cfg.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps) if cfg.norm_first else nn.Identity()
        if not cfg.tie_output:
            self.out_proj = nn.Parameter(torch.randn(cfg.tgt_vocab_size, cfg.d_model) * cfg.d_model**-0.5)
        if cfg.output_bias:
            self.out_bias = nn.Parameter(torch.zeros(cfg.tgt_vocab_size))
        self._init_weights()

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
        capture: str | None = None,
        encoder_mask: Tensor | None = None,
        use_positions: bool = True,
        trace: Tracer | None = None,
    ) -> tuple[Tensor, list[AttentionRecord | None]]:
        """Source ids (B, S) -> memory (B, S, D) and each layer's self-attention record.

        Two experiments leave the model untouched: ``encoder_mask`` (S, S) or (B, 1, S, S), True =
        may attend, restricts encoder self-attention further (sparse patterns); ``use_positions``
        False skips the positional encoding (self-attention alone then sees a bag of tokens).
        """
        self._check_ids(src, self.cfg.src_vocab_size, "source")
        mask = attention_masks(src_valid)["encoder"]
        if encoder_mask is not None:
            S = src.shape[1]
            if encoder_mask.shape[-2:] != (S, S) or encoder_mask.dtype != torch.bool:
                raise InputError(f"encoder_mask must be a boolean ({S}, {S}) mask, got {tuple(encoder_mask.shape)}")
            mask = encoder_mask if mask is None else mask & encoder_mask
        x = self.src_embed(src)
        if trace is not None:
            trace("src.embed", x)  # already scaled by sqrt(d_model) when the config says so
            if use_positions and self.pos.table is not None:
                trace("src.pos", self.pos.table[: src.shape[1]])
        if use_positions:
            x = self.pos(x)
        if self.cfg.type_vocab_size:
            x = x + self.token_type[0]  # one segment: every token has type 0
        x = self.dropout(self.embed_norm(x))
        if trace is not None:
            trace("src.input", x)
        records = []
        for i, layer in enumerate(self.encoder_layers):
            x, rec = layer(x, mask, capture, _sub(trace, f"encoder.{i}"))
            records.append(rec)
        x = self.encoder_norm(x)
        if trace is not None:
            trace("memory", x)
        return x, records

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_valid: Tensor | None = None,
        tgt_valid: Tensor | None = None,
        capture: str | None = None,
        cache: list[LayerCache] | None = None,
        with_logits: bool = True,
        trace: Tracer | None = None,
    ) -> tuple[Tensor | None, list, list]:
        """Target ids (B, T) and memory -> logits (B, T, V), self and cross records per layer.

        With ``cache`` (one :class:`LayerCache` per layer), ``tgt`` holds only the new positions;
        earlier keys and values come from the cache, which is updated in place. Without
        ``with_logits`` the output projection (a large matmul over the vocabulary) is skipped and
        None is returned in its place: attention maps do not need it.
        """
        if self.cfg.encoder_only:
            raise InputError("this model is encoder-only: it has no decoder to translate or decode with")
        self._check_ids(tgt, self.cfg.tgt_vocab_size, "target")
        B, T = tgt.shape
        start = 0 if cache is None or cache[0].self_k is None else cache[0].self_k.shape[2]
        masks = attention_masks(src_valid, tgt_valid, tgt_len=start + T, device=tgt.device)
        self_mask = masks["decoder"][:, :, start:, :]  # rows of the new positions only
        x = self.tgt_embed(tgt)
        if trace is not None:
            trace("tgt.embed", x)
            if self.pos.table is not None:
                trace("tgt.pos", self.pos.table[start : start + T])
        x = self.dropout(self.pos(x, start=start))
        if trace is not None:
            trace("tgt.input", x)
        self_recs, cross_recs = [], []
        for i, layer in enumerate(self.decoder_layers):
            x, s_rec, c_rec = layer(
                x,
                memory,
                self_mask,
                masks["cross"],
                capture,
                None if cache is None else cache[i],
                _sub(trace, f"decoder.{i}"),
            )
            self_recs.append(s_rec)
            cross_recs.append(c_rec)
        x = self.decoder_norm(x)
        logits = self.logits(x) if with_logits else None
        if trace is not None:
            trace("decoder_out", x)
            if logits is not None:
                trace("logits", logits)
        return logits, self_recs, cross_recs

    def logits(self, x: Tensor) -> Tensor:
        """The pre-softmax linear transformation, tied to the target embedding (3.4)."""
        weight = self.tgt_embed.weight if self.cfg.tie_output else self.out_proj
        return linear(x, weight, self.out_bias if self.cfg.output_bias else None)  # (B, T, D) -> (B, T, V)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor | None = None,
        src_valid: Tensor | None = None,
        tgt_valid: Tensor | None = None,
        *,
        return_attention: bool = False,
        return_internals: bool = False,
        return_logits: bool = True,
        return_trace: bool = False,
    ) -> Seq2SeqOutput:
        """Teacher-forced forward pass.

        ``src`` (B, S) and ``tgt`` (B, T) are token ids; ``tgt`` starts with the start token.
        ``src_valid`` / ``tgt_valid`` (bool, True = real token) mark padding. With
        ``return_attention`` every map is returned; ``return_internals`` adds scores, Q, K, V.
        ``return_logits=False`` skips the output projection (``logits`` is then None).
        Without ``tgt`` (the only way for an encoder-only model) just the encoder runs.
        ``return_trace`` also returns every intermediate tensor by name (``trace``): embeddings,
        positions added, each attention's Q, K, V, scores, weights, per-head sums, concatenation and
        W^O output, each residual sum and LayerNorm output, the feed-forward hidden layer, the logits.
        """
        if return_trace:
            return_internals = True
        capture = "internals" if return_internals else "weights" if return_attention else None
        trace = Tracer() if return_trace else None
        memory, enc_recs = self.encode(src, src_valid, capture, trace=trace)
        logits, self_recs, cross_recs = None, [], []
        if tgt is not None:
            logits, self_recs, cross_recs = self.decode(
                tgt, memory, src_valid, tgt_valid, capture, with_logits=return_logits, trace=trace
            )
        attn = None
        if capture is not None:
            attn = Attention(
                encoder=tuple(r.weights for r in enc_recs),
                decoder=tuple(r.weights for r in self_recs),
                cross=tuple(r.weights for r in cross_recs),
                internals=(
                    {"encoder": tuple(enc_recs), "decoder": tuple(self_recs), "cross": tuple(cross_recs)}
                    if capture == "internals"
                    else None
                ),
            )
        return Seq2SeqOutput(logits=logits, memory=memory, attention=attn, trace=None if trace is None else trace.store)
