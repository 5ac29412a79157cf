"""Hugging Face Llama-family checkpoints (decoder-only): Llama, SmolLM, Mistral without a sliding window.

These are the paper's decoder without cross-attention, with the later parts of :mod:`attnviz.later`:
pre-norm RMSNorm layers and a final RMSNorm, rotary positions (RoPE, half-split, with the config's
theta, and Llama 3.1's ``llama3`` frequency scaling), a SwiGLU feed-forward network, grouped-query
attention (``num_key_value_heads``), no biases unless ``attention_bias`` / ``mlp_bias`` say so,
and an output layer tied to the embedding or not. Parameter names follow transformers'
LlamaForCausalLM; the Linear weights are stored (out, in), as attnviz's.

Refused, with the key named, before any weight is read: a RoPE scaling type other than llama3
(linear, dynamic, yarn, longrope, ...), a head size other than hidden_size / num_attention_heads,
an active sliding window, soft-capping, QK-norm, experts, and any activation but SiLU. A
``partial_rotary_factor`` is read as transformers reads it for these families: ignored, every
dimension rotated (transformers applies it only to GPT-NeoX, Phi, StableLM and a few others), and
a warning says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import torch

from attnviz.checkpoints.causal import Family, checked, first_id, positions, refuse_unsupported
from attnviz.checkpoints.files import CONFIG_FILE, SAFETENSORS_FILE
from attnviz.errors import CheckpointError
from attnviz.model import TransformerConfig

log = logging.getLogger(__name__)

FAMILY = "llama"
DESCRIPTION = (
    "a Hugging Face Llama-family language model such as HuggingFaceTB/SmolLM2-135M, Llama or Mistral "
    f"({CONFIG_FILE}, {SAFETENSORS_FILE} or its shards, tokenizer.json)"
)
ROPE_TYPES = ("default", "llama3")
UNSUPPORTED = {
    "attn_logit_softcapping": lambda v: None if v is None else "soft-capped attention scores",
    "final_logit_softcapping": lambda v: None if v is None else "soft-capped logits",
    "use_qk_norm": lambda v: "a norm on queries and keys (QK-norm)" if v else None,
    "qk_layernorm": lambda v: "a norm on queries and keys (QK-norm)" if v else None,
    "num_local_experts": lambda v: "a mixture of experts" if v else None,
    "num_experts": lambda v: "a mixture of experts" if v else None,
}


def rope_settings(hf: dict, fail: Callable[[str], CheckpointError]) -> dict:
    """The rotary fields of our config from config.json.

    transformers 5 keeps them in ``rope_parameters`` (``rope_type``, ``rope_theta`` and the scaling's
    values); older files say ``rope_theta`` and ``rope_scaling`` (with ``type`` or ``rope_type``).
    """
    params = hf.get("rope_parameters")
    if not isinstance(params, dict):
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in ROPE_TYPES:
        raise fail(f"the RoPE scaling type {kind!r} is not implemented (attnviz implements {', '.join(ROPE_TYPES)})")
    settings = {"rope_theta": float(params.get("rope_theta", 10000.0))}
    if kind == "llama3":
        settings |= {
            "rope_scaling": "llama3",
            "rope_factor": float(params.get("factor", 8.0)),
            "rope_low_freq_factor": float(params.get("low_freq_factor", 1.0)),
            "rope_high_freq_factor": float(params.get("high_freq_factor", 4.0)),
            "rope_original_max_len": int(params.get("original_max_position_embeddings", 8192)),
        }
    return settings


def llama_style_config(hf: dict, source: str, family: str, attn_bias: bool, attn_out_bias: bool) -> TransformerConfig:
    """Our config for a Llama-style ``config.json``: Llama, Mistral, SmolLM, and Qwen2 with its biases."""

    def fail(what: str) -> CheckpointError:
        return CheckpointError(f"{source}: {what}; attnviz cannot load this {family} model faithfully")

    refuse_unsupported(hf, fail, UNSUPPORTED)
    if hf.get("partial_rotary_factor") not in (None, 1, 1.0):
        log.warning(
            "%s: partial_rotary_factor %r is ignored, as transformers ignores it for %s: every dimension is rotated",
            source,
            hf["partial_rotary_factor"],
            family,
        )
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise fail(f'"hidden_act" {hf.get("hidden_act")!r} is not silu')
    d_model, n_heads = hf.get("hidden_size", 4096), hf.get("num_attention_heads", 32)
    head_dim = hf.get("head_dim")
    if head_dim is not None and isinstance(n_heads, int) and n_heads and head_dim * n_heads != d_model:
        raise fail(f'"head_dim" {head_dim} x {n_heads} heads is not hidden_size {d_model}: a separate head size')
    vocab, eos = hf.get("vocab_size", 32000), first_id(hf.get("eos_token_id"))
    eos = 0 if eos is None else eos
    bos = first_id(hf.get("bos_token_id"))
    return checked(
        fail,
        lambda: TransformerConfig(
            src_vocab_size=vocab,
            tgt_vocab_size=vocab,
            n_enc_layers=0,
            n_dec_layers=hf.get("num_hidden_layers", 32),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            d_ff=hf.get("intermediate_size", 11008),
            dropout=0.0,
            norm_first=True,
            norm="rmsnorm",
            activation="swish",
            ffn="gated",
            ffn_bias=bool(hf.get("mlp_bias", False)),
            pos_encoding="rotary",
            max_len=positions(hf.get("max_position_embeddings", 2048), rotary=True),
            share_embeddings=True,
            tie_output=bool(hf.get("tie_word_embeddings", False)),
            attn_bias=attn_bias,
            attn_out_bias=attn_out_bias,
            scale_embedding=False,
            ln_eps=float(hf.get("rms_norm_eps", 1e-6)),
            pad_id=eos,
            bos_id=eos if bos is None else bos,
            eos_id=eos,
            unk_id=eos,
            **rope_settings(hf, fail),
        ),
    )


def llama_config(hf: dict, source: str = CONFIG_FILE) -> TransformerConfig:
    """Llama, SmolLM and Mistral: biases on every attention projection or none (``attention_bias``)."""
    if hf.get("model_type") == "mistral" and hf.get("sliding_window") is not None:
        raise CheckpointError(
            f'{source}: "sliding_window": {hf["sliding_window"]} asks for a sliding attention window, which attnviz '
            "does not implement; attnviz cannot load this Mistral model faithfully"
        )
    bias = bool(hf.get("attention_bias", False))
    return llama_style_config(hf, source, "Llama-family", bias, bias)


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
