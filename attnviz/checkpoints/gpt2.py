"""Hugging Face GPT-2 checkpoints (decoder-only), loaded into attnviz's Transformer.

GPT-2 (Radford et al., 2019) is the paper's decoder without cross-attention, with pre-LN and a
final LayerNorm, learned positions (counted from 0), GELU in its tanh form ("gelu_new"), biases
everywhere, no embedding scaling, and the output layer tied to the token embedding. Its layers
are Conv1D modules: a weight stored (in, out), the transpose of a Linear's, and the query, key and
value projections fused into one ``c_attn`` of width 3 * d_model, split here in that order.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from attnviz.checkpoints.causal import Family, checked, positions, refuse_unsupported
from attnviz.checkpoints.fields import MAX_CLAIMED_POSITIONS, Fields
from attnviz.checkpoints.files import CONFIG_FILE, SAFETENSORS_FILE
from attnviz.errors import CheckpointError
from attnviz.model import TransformerConfig

FAMILY = "gpt2"
DESCRIPTION = (
    f"a Hugging Face GPT-2 language model such as openai-community/gpt2 ({CONFIG_FILE}, {SAFETENSORS_FILE}, "
    "tokenizer.json)"
)
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
FLAGS = {"add_cross_attention": False, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}
UNSUPPORTED = {
    "add_cross_attention": lambda v: "cross-attention layers" if v else None,
    "scale_attn_weights": lambda v: None if v else "unscaled attention scores",
    "scale_attn_by_inverse_layer_idx": lambda v: "scores scaled by the inverse layer index" if v else None,
}


def gpt2_config(hf: dict, source: str = CONFIG_FILE) -> TransformerConfig:
    """Our config for a GPT-2 ``config.json`` (as a dict), refusing what we cannot run.

    Every field is checked (`attnviz.checkpoints.fields`) before any is used.
    """

    def fail(what: str) -> CheckpointError:
        return CheckpointError(f"{source}: {what}; attnviz cannot load this GPT-2 model faithfully")

    f = Fields(hf, fail)
    for key, default in FLAGS.items():
        f.flag(key, default)
    refuse_unsupported(hf, fail, UNSUPPORTED)
    activation = f.choice("activation_function", "gelu_new", ACTIVATIONS)
    d_model, vocab = f.int("n_embd", 768), f.int("vocab_size", 50257)
    eos = f.token_id("eos_token_id", 50256)
    bos = f.token_id("bos_token_id", eos)
    n_inner = f.int("n_inner", None, nullable=True)
    fields = {
        "n_dec_layers": f.int("n_layer", 12),
        "n_heads": f.int("n_head", 12),
        "max_len": positions(f.int("n_positions", 1024, high=MAX_CLAIMED_POSITIONS), rotary=False),
        "tie_output": f.flag("tie_word_embeddings", True),
        "ln_eps": f.number("layer_norm_epsilon", 1e-5, 0.0, 1.0, low_open=True),
    }
    return checked(
        fail,
        lambda: TransformerConfig(
            src_vocab_size=vocab,
            tgt_vocab_size=vocab,
            n_enc_layers=0,
            d_model=d_model,
            d_ff=n_inner or 4 * d_model,
            dropout=0.0,
            norm_first=True,
            activation=ACTIVATIONS[activation],
            pos_encoding="learned",
            share_embeddings=True,
            scale_embedding=False,
            pad_id=eos,
            bos_id=bos,
            eos_id=eos,
            unk_id=eos,
            **fields,
        ),
    )


def _rename(name: str) -> str:
    """A stored name without the ``transformer.`` prefix that GPT2LMHeadModel adds (the hub's files have none)."""
    return name.removeprefix("transformer.")


def tensors(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a GPT-2 file holds (Conv1D weights are (in, out)); "?" marks a tied head it may repeat."""
    D, F, V = cfg.d_model, cfg.d_ff, cfg.tgt_vocab_size
    names = {"wte.weight": (V, D), "wpe.weight": (cfg.max_len, D), "ln_f.weight": (D,), "ln_f.bias": (D,)}
    for i in range(cfg.n_dec_layers):
        h = f"h.{i}."
        names |= {
            f"{h}ln_1.weight": (D,),
            f"{h}ln_1.bias": (D,),
            f"{h}attn.c_attn.weight": (D, 3 * D),
            f"{h}attn.c_attn.bias": (3 * D,),
            f"{h}attn.c_proj.weight": (D, D),
            f"{h}attn.c_proj.bias": (D,),
            f"{h}ln_2.weight": (D,),
            f"{h}ln_2.bias": (D,),
            f"{h}mlp.c_fc.weight": (D, F),
            f"{h}mlp.c_fc.bias": (F,),
            f"{h}mlp.c_proj.weight": (F, D),
            f"{h}mlp.c_proj.bias": (D,),
        }
    names["lm_head.weight" if not cfg.tie_output else "lm_head.weight?"] = (V, D)
    return names


def convert(raw: Mapping[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """attnviz's parameters from GPT-2's tensors: Conv1D weights transposed, c_attn split into Q, K, V."""
    ours = {
        "src_embed.weight": raw["wte.weight"],
        "pos.table": raw["wpe.weight"],
        "decoder_norm.weight": raw["ln_f.weight"],
        "decoder_norm.bias": raw["ln_f.bias"],
    }
    if not cfg.tie_output:
        ours["out_proj"] = raw["lm_head.weight"]
    for i in range(cfg.n_dec_layers):
        h, us = f"h.{i}.", f"decoder_layers.{i}."
        q, k, v = raw[f"{h}attn.c_attn.weight"].t().chunk(3, dim=0)  # (3D, D): W^Q, W^K, W^V stacked
        qb, kb, vb = raw[f"{h}attn.c_attn.bias"].chunk(3)
        for proj, weight, bias in (("q_proj", q, qb), ("k_proj", k, kb), ("v_proj", v, vb)):
            ours[f"{us}self_attn.{proj}.weight"], ours[f"{us}self_attn.{proj}.bias"] = weight, bias
        ours[f"{us}self_attn.out_proj.weight"] = raw[f"{h}attn.c_proj.weight"].t()
        ours[f"{us}self_attn.out_proj.bias"] = raw[f"{h}attn.c_proj.bias"]
        ours[f"{us}ffn.up.weight"] = raw[f"{h}mlp.c_fc.weight"].t()
        ours[f"{us}ffn.up.bias"] = raw[f"{h}mlp.c_fc.bias"]
        ours[f"{us}ffn.down.weight"] = raw[f"{h}mlp.c_proj.weight"].t()
        ours[f"{us}ffn.down.bias"] = raw[f"{h}mlp.c_proj.bias"]
        for theirs, block in (("ln_1", "self_block"), ("ln_2", "ffn_block")):
            ours[f"{us}{block}.norm.weight"] = raw[f"{h}{theirs}.weight"]
            ours[f"{us}{block}.norm.bias"] = raw[f"{h}{theirs}.bias"]
    return ours


GPT2 = Family(
    FAMILY,
    ("gpt2",),
    "GPT-2",
    "Hugging Face GPT-2",
    lambda hf, source: gpt2_config(hf, source),
    tensors,
    convert,
    _rename,
)
detect, probe, load = GPT2.detect, GPT2.probe, GPT2.load
