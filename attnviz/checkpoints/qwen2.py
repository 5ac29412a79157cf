"""Hugging Face Qwen2 checkpoints (Qwen2, Qwen2.5): the Llama recipe with biases on Q, K and V.

Qwen2 is `llama`'s decoder with biases on the query, key and value
projections and none on W^O, usually a tied output layer, and a sliding window that its configs
may name but switch off (``use_sliding_window: false``: no window is used, as transformers reads
it). A window that is switched on is refused, as is anything the Llama importer refuses. A key
config.json leaves out takes Qwen2Config's default (32 key/value heads, 32768 positions).
"""

from __future__ import annotations

from attnviz.checkpoints.causal import Family
from attnviz.checkpoints.fields import Fields
from attnviz.checkpoints.files import CONFIG_FILE, SAFETENSORS_FILE
from attnviz.checkpoints.llama import convert, llama_style_config, tensors
from attnviz.errors import CheckpointError
from attnviz.model import TransformerConfig

FAMILY = "qwen2"
QWEN2_DEFAULTS = {"max_position_embeddings": 32768, "num_key_value_heads": 32}  # transformers 5's Qwen2Config
DESCRIPTION = (
    f"a Hugging Face Qwen2 language model such as Qwen/Qwen2.5-0.5B ({CONFIG_FILE}, {SAFETENSORS_FILE}, tokenizer.json)"
)


def qwen2_config(hf: dict, source: str = CONFIG_FILE) -> TransformerConfig:
    """Our config for a Qwen2 ``config.json``: biases on Q, K, V and not on W^O."""

    def fail(what: str) -> CheckpointError:
        return CheckpointError(f"{source}: {what}; attnviz cannot load this Qwen2 model faithfully")

    if Fields(hf, fail).flag("use_sliding_window", False):
        raise CheckpointError(
            f'{source}: "use_sliding_window": true asks for a sliding attention window, which attnviz does not '
            "implement; attnviz cannot load this Qwen2 model faithfully"
        )
    return llama_style_config(
        hf, source, "Qwen2", attn_bias=True, attn_out_bias=False, mlp_bias_read=False, defaults=QWEN2_DEFAULTS
    )


QWEN2 = Family(
    FAMILY,
    ("qwen2",),
    "Qwen2",
    "Hugging Face Qwen2",
    lambda hf, source: qwen2_config(hf, source),
    tensors,
    convert,
    lambda name: name.removeprefix("model."),
)
detect, probe, load = QWEN2.detect, QWEN2.probe, QWEN2.load
