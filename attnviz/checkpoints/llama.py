"""Hugging Face Llama-family checkpoints (decoder-only): Llama, SmolLM, Mistral without a sliding window.

These are the paper's decoder without cross-attention, with the later parts of `attnviz.later`:
pre-norm RMSNorm layers and a final RMSNorm, rotary positions (RoPE, half-split, with the config's
theta, and Llama 3.1's ``llama3`` frequency scaling), a SwiGLU feed-forward network, grouped-query
attention (``num_key_value_heads``), no biases unless ``attention_bias`` / ``mlp_bias`` say so
(Llama's: transformers' Mistral reads neither, and has none), and an output layer tied to the
embedding or not. The RoPE fields are read as transformers 5 reads them: a ``rope_scaling`` wins
over ``rope_parameters``, and a ``rope_theta`` missing from it comes from the top level. Parameter
names follow transformers' LlamaForCausalLM; the Linear weights are stored (out, in), as attnviz's.

A key config.json leaves out takes the default of the family's transformers config class, which
differ: Mistral's are 8 key/value heads, 131072 positions and a sliding window of 4096 (only
``"sliding_window": null`` is none), Qwen2's 32 key/value heads and 32768 positions, and Llama's
as many key/value heads as query heads and 2048 positions.

Refused, with the key named, before any weight is read: a quantized model, a RoPE scaling type
other than llama3 (linear, dynamic, yarn, longrope, ...) or a null one, llama3 scaling without a key
transformers requires (factor, low_freq_factor, high_freq_factor), a head size other than
hidden_size / num_attention_heads, an active sliding window, soft-capping, QK-norm, experts, and
any activation but SiLU. A ``partial_rotary_factor`` is read as transformers reads it for these
families with plain RoPE: ignored, every dimension rotated (transformers applies it only to
GPT-NeoX, Phi, StableLM and a few others), and a warning says so; with llama3 scaling, which
transformers applies it to (and then fails), it is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from attnviz.checkpoints.causal import Family, checked, positions, refuse_unsupported
from attnviz.checkpoints.fields import MAX_CLAIMED_POSITIONS, Fields
from attnviz.checkpoints.files import CONFIG_FILE, SAFETENSORS_FILE
from attnviz.errors import CheckpointError, describe
from attnviz.model import TransformerConfig

log = logging.getLogger(__name__)

FAMILY = "llama"
DESCRIPTION = (
    "a Hugging Face Llama-family language model such as HuggingFaceTB/SmolLM2-135M, Llama or Mistral "
    f"({CONFIG_FILE}, {SAFETENSORS_FILE} or its shards, tokenizer.json)"
)
ROPE_TYPES = ("default", "llama3")
MAX_ROPE_THETA = 1e12  # real bases are 1e4 to 1e6; beyond this every frequency but the first is nearly 0
LLAMA3_REQUIRED = ("factor", "low_freq_factor", "high_freq_factor")  # transformers' required keys it cannot fill in
MAX_ROPE_FACTOR = 1e6  # llama3's factors are 8, 1 and 4 in Llama 3.1; far beyond any real scaling
# transformers 5's defaults (LlamaConfig, MistralConfig) for the keys where the families differ; None: as many
# key/value heads as query heads. An explicit null is that in every family.
LLAMA_DEFAULTS = {"max_position_embeddings": 2048, "num_key_value_heads": None}
MISTRAL_DEFAULTS = {"max_position_embeddings": 4096 * 32, "num_key_value_heads": 8}
MISTRAL_WINDOW = 4096  # MistralConfig's sliding_window when config.json has no such key
UNSUPPORTED = {
    "attn_logit_softcapping": lambda v: None if v is None else "soft-capped attention scores",
    "final_logit_softcapping": lambda v: None if v is None else "soft-capped logits",
    "use_qk_norm": lambda v: "a norm on queries and keys (QK-norm)" if v else None,
    "qk_layernorm": lambda v: "a norm on queries and keys (QK-norm)" if v else None,
    "num_local_experts": lambda v: "a mixture of experts" if v else None,
    "num_experts": lambda v: "a mixture of experts" if v else None,
}


def rope_settings(f: Fields, max_positions: int, partial: float) -> dict:
    """The rotary fields of our config from config.json, each checked before use.

    transformers 5 keeps them in ``rope_parameters`` (``rope_type``, ``rope_theta`` and the scaling's
    values); older files say ``rope_theta`` and ``rope_scaling`` (with ``type`` or ``rope_type``).
    llama3's values are checked as transformers' ``_validate_llama3_parameters`` states them (the keys
    it requires present, a factor of at least 1, low_freq_factor below high_freq_factor), but refused
    rather than warned about; each is finite and at most `MAX_ROPE_FACTOR`. ``max_positions`` is the
    model's max_position_embeddings, llama3's original length when no other is given; ``partial`` the
    top-level partial_rotary_factor.
    """
    # As transformers 5 reads them (PreTrainedConfig.convert_rope_params_to_dict): a non-empty rope_scaling wins
    # over rope_parameters, and a rope_theta missing from the one used comes from the top level.
    scaling = f.object("rope_scaling")
    params = scaling if scaling is not None and scaling.hf else f.object("rope_parameters")
    params = params if params is not None else Fields({}, f.fail, "rope_parameters.")
    theta_from = params if "rope_theta" in params.hf else f
    kind_key = "rope_type" if "rope_type" in params.hf else "type"
    kind = params.hf.get(kind_key, "default")
    if kind is None:  # transformers looks a null type up among its RoPE functions and fails (KeyError: None)
        raise f.fail(f'"{params.where}{kind_key}" is null, which names no RoPE type: name one, or leave the key out')
    if kind not in ROPE_TYPES:
        raise f.fail(
            f"the RoPE scaling type {describe(kind)} is not implemented (attnviz implements {', '.join(ROPE_TYPES)})"
        )
    settings = {"rope_theta": theta_from.number("rope_theta", 10000.0, 1.0, MAX_ROPE_THETA, low_open=True)}
    if kind == "llama3":
        # transformers fills in only original_max_position_embeddings (the model's length); without these it
        # raises (Missing required keys), so a default here would run a model transformers cannot
        missing = [key for key in LLAMA3_REQUIRED if key not in params.hf]
        if missing:
            raise f.fail(
                f'llama3 RoPE scaling in "{params.where[:-1]}" is missing {", ".join(map(repr, missing))}, which '
                "transformers requires"
            )
        # transformers rotates part of each head then (rope_parameters' factor, else the top level's), and fails
        if params.number("partial_rotary_factor", partial, 0.0, 1.0, low_open=True, nullable=True) != 1.0:
            where = params.where if "partial_rotary_factor" in params.hf else ""
            raise f.fail(
                f'"{where}partial_rotary_factor" with llama3 scaling asks for rotary positions on part of each head, '
                "which attnviz does not implement (transformers applies it there, and fails)"
            )
        low = params.number("low_freq_factor", None, 0.0, MAX_ROPE_FACTOR, low_open=True)
        high = params.number("high_freq_factor", None, 0.0, MAX_ROPE_FACTOR, low_open=True)
        if not low < high:
            raise f.fail(
                f'"{params.where}low_freq_factor" ({low:g}) must be below "{params.where}high_freq_factor" ({high:g}): '
                "llama3 scaling interpolates between them"
            )
        settings |= {
            "rope_scaling": "llama3",
            "rope_factor": params.number("factor", None, 1.0, MAX_ROPE_FACTOR),
            "rope_low_freq_factor": low,
            "rope_high_freq_factor": high,
            # transformers: a top-level original_max_position_embeddings wins, else the params', else the model's
            "rope_original_max_len": (f if "original_max_position_embeddings" in f.hf else params).int(
                "original_max_position_embeddings", max_positions, high=MAX_CLAIMED_POSITIONS
            ),
        }
    return settings


def llama_style_config(
    hf: dict,
    source: str,
    family: str,
    attn_bias: bool,
    attn_out_bias: bool,
    mlp_bias_read: bool = True,
    defaults: Mapping[str, int | None] = LLAMA_DEFAULTS,
) -> TransformerConfig:
    """Our config for a Llama-style ``config.json``: Llama, Mistral, SmolLM, and Qwen2 with its biases.

    Every field is checked (`attnviz.checkpoints.fields`) before any is used. ``mlp_bias_read``: whether
    the family reads ``mlp_bias`` (Llama does; transformers' Mistral and Qwen2 never have MLP biases).
    ``defaults``: the family's own max_position_embeddings and num_key_value_heads, for a config.json
    without them (`LLAMA_DEFAULTS`).
    """

    def fail(what: str) -> CheckpointError:
        return CheckpointError(f"{source}: {what}; attnviz cannot load this {family} model faithfully")

    f = Fields(hf, fail)
    refuse_unsupported(hf, fail, UNSUPPORTED)
    partial = f.number("partial_rotary_factor", 1.0, 0.0, 1.0, low_open=True, nullable=True)
    max_positions = f.int("max_position_embeddings", defaults["max_position_embeddings"], high=MAX_CLAIMED_POSITIONS)
    rope = rope_settings(f, max_positions, partial)
    if partial != 1.0:
        log.warning(
            "%s: partial_rotary_factor %g is ignored, as transformers ignores it for %s: every dimension is rotated",
            source,
            partial,
            family,
        )
    f.choice("hidden_act", "silu", ("silu", "swish"))
    d_model, n_heads = f.int("hidden_size", 4096), f.int("num_attention_heads", 32)
    head_dim = f.int("head_dim", None, nullable=True)
    if head_dim is not None and head_dim * n_heads != d_model:
        raise fail(f'"head_dim" {head_dim} x {n_heads} heads is not hidden_size {d_model}: a separate head size')
    vocab = f.int("vocab_size", 32000)
    eos = f.token_id("eos_token_id", 0)
    bos = f.token_id("bos_token_id", eos)
    # as transformers reads it: absent, the family's default; null, as many as the query heads in every family
    kv_heads = defaults["num_key_value_heads"] if "num_key_value_heads" not in hf else None
    fields = {
        "n_dec_layers": f.int("num_hidden_layers", 32),
        "n_kv_heads": f.int("num_key_value_heads", kv_heads, nullable=True) or n_heads,
        "d_ff": f.int("intermediate_size", 11008),
        "ffn_bias": f.flag("mlp_bias", False) if mlp_bias_read else False,
        "max_len": positions(max_positions, rotary=True),
        "tie_output": f.flag("tie_word_embeddings", False),
        "ln_eps": f.number("rms_norm_eps", 1e-6, 0.0, 1.0, low_open=True),
        **rope,
    }
    return checked(
        fail,
        lambda: TransformerConfig(
            src_vocab_size=vocab,
            tgt_vocab_size=vocab,
            n_enc_layers=0,
            d_model=d_model,
            n_heads=n_heads,
            dropout=0.0,
            norm_first=True,
            norm="rmsnorm",
            activation="swish",
            ffn="gated",
            pos_encoding="rotary",
            share_embeddings=True,
            attn_bias=attn_bias,
            attn_out_bias=attn_out_bias,
            scale_embedding=False,
            pad_id=eos,
            bos_id=bos,
            eos_id=eos,
            unk_id=eos,
            **fields,
        ),
    )


def llama_config(hf: dict, source: str = CONFIG_FILE) -> TransformerConfig:
    """Llama, SmolLM and Mistral: biases on every attention projection or none (``attention_bias``)."""

    def fail(what: str) -> CheckpointError:
        return CheckpointError(f"{source}: {what}; attnviz cannot load this Llama-family model faithfully")

    f = Fields(hf, fail)
    mistral = hf.get("model_type") == "mistral"
    if mistral:
        if "sliding_window" not in hf:
            raise fail(
                f'"sliding_window" is missing, which transformers\' Mistral reads as {MISTRAL_WINDOW}: a sliding '
                'attention window, which attnviz does not implement (a model without one says "sliding_window": null)'
            )
        window = f.int("sliding_window", None, nullable=True)
        if window is not None:
            raise fail(
                f'"sliding_window": {window} asks for a sliding attention window, which attnviz does not implement'
            )
    # transformers' Mistral has no biases whatever attention_bias and mlp_bias say: it reads neither
    bias = False if mistral else f.flag("attention_bias", False)
    return llama_style_config(
        hf,
        source,
        "Llama-family",
        bias,
        bias,
        mlp_bias_read=not mistral,
        defaults=MISTRAL_DEFAULTS if mistral else LLAMA_DEFAULTS,
    )


def _rename(name: str) -> str:
    return name.removeprefix("model.")


def tensors(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama-style file holds (without the ``model.`` prefix); "?" marks a tied head it may repeat."""
    D, F, V, Dkv = cfg.d_model, cfg.d_ff, cfg.tgt_vocab_size, cfg.kv_heads * cfg.d_head
    names = {"embed_tokens.weight": (V, D), "norm.weight": (D,)}
    for i in range(cfg.n_dec_layers):
        h = f"layers.{i}."
        names |= {f"{h}input_layernorm.weight": (D,), f"{h}post_attention_layernorm.weight": (D,)}
        for proj, out in (("q_proj", D), ("k_proj", Dkv), ("v_proj", Dkv)):
            names[f"{h}self_attn.{proj}.weight"] = (out, D)
            if cfg.attn_bias:
                names[f"{h}self_attn.{proj}.bias"] = (out,)
        names[f"{h}self_attn.o_proj.weight"] = (D, D)
        if cfg.attn_bias and cfg.attn_out_bias:
            names[f"{h}self_attn.o_proj.bias"] = (D,)
        for proj, shape in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            names[f"{h}mlp.{proj}.weight"] = shape
            if cfg.ffn_bias:
                names[f"{h}mlp.{proj}.bias"] = shape[:1]
    names["lm_head.weight" if not cfg.tie_output else "lm_head.weight?"] = (V, D)
    return names


OURS = {
    "input_layernorm": "self_block.norm",
    "post_attention_layernorm": "ffn_block.norm",
    "self_attn.q_proj": "self_attn.q_proj",
    "self_attn.k_proj": "self_attn.k_proj",
    "self_attn.v_proj": "self_attn.v_proj",
    "self_attn.o_proj": "self_attn.out_proj",
    "mlp.gate_proj": "ffn.gate",
    "mlp.up_proj": "ffn.up",
    "mlp.down_proj": "ffn.down",
}


def convert(raw: Mapping[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """attnviz's parameters from a Llama-style file's tensors: the same matrices under other names."""
    ours = {"src_embed.weight": raw["embed_tokens.weight"], "decoder_norm.weight": raw["norm.weight"]}
    if not cfg.tie_output:
        ours["out_proj"] = raw["lm_head.weight"]
    for name, tensor in raw.items():
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            module, _, kind = rest.rpartition(".")
            ours[f"decoder_layers.{i}.{OURS[module]}.{kind}"] = tensor
    return ours


LLAMA = Family(
    FAMILY,
    ("llama", "mistral"),
    "Llama-family",
    "Hugging Face Llama family",
    lambda hf, source: llama_config(hf, source),
    tensors,
    convert,
    _rename,
)
detect, probe, load = LLAMA.detect, LLAMA.probe, LLAMA.load
