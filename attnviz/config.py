"""The model's hyper-parameters: one frozen dataclass, validated on creation, stored as JSON with the weights.

The defaults are the paper's base model. Options beyond the paper (pre-LN, GELU/swish, learned or
concatenated positions, an output bias, BERT's token types and embedding LayerNorm) exist so that
real checkpoints (Marian, BERT) run in the same model, and the fields after ``unk_id`` describe the
decoder-only language models that came later (GPT-2, the Llama family: `attnviz.later`); each
field says where it comes from. A decoder-only model is ``n_enc_layers=0``: its decoder layers have
no cross-attention and read the prompt directly.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from attnviz.errors import ConfigError, describe
from attnviz.linear import ACTIVATIONS as LINEAR_ACTIVATIONS

ACTIVATIONS = tuple(name for name in LINEAR_ACTIVATIONS if name)  # ("relu", "gelu", "swish")
POS_ENCODINGS = ("sinusoidal", "sinusoidal_concat", "learned", "rotary", "none")
NORMS = ("layernorm", "rmsnorm")
FFNS = ("mlp", "gated")
ROPE_SCALINGS = ("", "llama3")


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
    # After 2017 (attnviz.later): decoder-only language models. The defaults are the paper's.
    n_kv_heads: int = 0  # key/value heads, grouped-query attention (Llama, Qwen2); 0: one per query head
    norm: str = "layernorm"  # layernorm (paper) | rmsnorm (Llama)
    ffn: str = "mlp"  # mlp: act(x W1) W2 (paper) | gated: act(x W_gate) * (x W_up) W_down (SwiGLU, Llama)
    ffn_bias: bool = True  # biases in the feed-forward network (Llama has none)
    attn_out_bias: bool = True  # a bias on W^O, when attn_bias (Qwen2: biases on Q, K, V but not on W^O)
    rope_theta: float = 10000.0  # rotary positions' base, the counterpart of the sinusoids' 10000
    rope_scaling: str = ""  # "" | llama3: Llama 3.1's frequency scaling, with the four values below
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            value = getattr(self, f.name)
            kind = {"int": int, "float": (int, float), "bool": bool, "str": str}[f.type]
            if not isinstance(value, kind) or (f.type != "bool" and isinstance(value, bool)):
                problems.append(f"{f.name} must be of type {f.type}, got {describe(value)}")
            elif f.type == "int" and not -(2**63) < value < 2**63:  # no real size comes near; keeps messages short
                problems.append(f"{f.name} must be below 2^63 in size, got {describe(value)}")
            elif f.type == "float" and not math.isfinite(value):
                problems.append(f"{f.name} must be finite, got {value!r}")
        if problems:  # the checks below compare values, which needs the right types
            raise ConfigError("invalid model config: " + "; ".join(problems))
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be a positive integer, got {describe(getattr(self, name))}")
        for name in ("n_enc_layers", "n_dec_layers", "type_vocab_size"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be a non-negative integer, got {describe(getattr(self, name))}")
        if not problems and self.d_model % self.n_heads:
            problems.append(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_kv_heads < 0 or (self.n_kv_heads and self.n_heads % self.n_kv_heads):
            problems.append(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads}), or be 0")
        for name, allowed in (("norm", NORMS), ("ffn", FFNS), ("rope_scaling", ROPE_SCALINGS)):
            if getattr(self, name) not in allowed:
                problems.append(f"{name} must be one of {allowed}, got {describe(getattr(self, name))}")
        if self.pos_encoding == "rotary" and self.n_heads > 0 and self.d_head % 2:
            problems.append("rotary positions need an even head size (d_model / n_heads)")
        if not self.rope_theta > 0 or not self.rope_factor > 0 or self.rope_original_max_len < 1:
            problems.append("rope_theta, rope_factor and rope_original_max_len must be positive")
        if self.rope_scaling and not self.rope_high_freq_factor > self.rope_low_freq_factor > 0:
            problems.append("llama3 rope scaling needs rope_high_freq_factor > rope_low_freq_factor > 0")
        if self.rope_scaling and not self.rope_factor >= 1:  # it divides the low frequencies: below 1 they would grow
            problems.append(f"llama3 rope scaling needs rope_factor >= 1, got {self.rope_factor!r}")
        if self.n_enc_layers == 0 and self.n_dec_layers == 0:
            problems.append("a model needs an encoder, a decoder or both")
        if self.activation not in ACTIVATIONS:
            problems.append(f"activation must be one of {ACTIVATIONS}, got {describe(self.activation)}")
        if self.pos_encoding not in POS_ENCODINGS:
            problems.append(f"pos_encoding must be one of {POS_ENCODINGS}, got {describe(self.pos_encoding)}")
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
                problems.append(f"{name} must be a token id inside both vocabularies, got {describe(value)}")
        if problems:
            raise ConfigError("invalid model config: " + "; ".join(problems))

    @property
    def encoder_only(self) -> bool:
        """True for a model with no decoder (BERT-style): it has encoder self-attention only."""
        return self.n_dec_layers == 0

    @property
    def decoder_only(self) -> bool:
        """True for a language model (GPT-2, Llama): a decoder with no encoder and no cross-attention."""
        return self.n_enc_layers == 0

    @property
    def architecture(self) -> str:
        """encoder-decoder (the paper), encoder-only (BERT) or decoder-only (a language model)."""
        return "encoder-only" if self.encoder_only else "decoder-only" if self.decoder_only else "encoder-decoder"

    def n_layers_of(self, kind: str) -> int:
        """How many layers hold attention of ``kind`` (encoder, decoder, cross): 0 where the model has none."""
        if kind == "encoder":
            return self.n_enc_layers
        return 0 if kind == "cross" and self.decoder_only else self.n_dec_layers

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads: n_kv_heads, or one per query head (the paper)."""
        return self.n_kv_heads or self.n_heads

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
            shown = ", ".join(describe(key) for key in unknown[:5]) + (
                f" and {len(unknown) - 5:,} more" if len(unknown) > 5 else ""
            )
            raise ConfigError(f"unknown config keys {shown}; expected a subset of {sorted(known)}")
        return cls(**data)
