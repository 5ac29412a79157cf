"""How large a checkpoint attnviz will load, checked before anything is allocated or read whole.

A hostile or broken folder (a config asking for a billion layers, a "config.json" that is a
device or a 2 GB file, a tokenizer file of gigabytes) is refused at the cost of a few small reads.
The defaults admit every real model attnviz imports with room to spare (BERT-large: 24 layers,
d_model 1024, 16 heads, 335M parameters; opus-mt-tc-big: 6+6 layers, d_model 1024, about 240M);
an operator raises a limit with the environment variable named beside it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from attnviz.config import TransformerConfig
from attnviz.errors import CheckpointError

TOO_LARGE = "the model is larger than this server allows"


@dataclass(frozen=True)
class Limits:
    max_parameters: int = 1_000_000_000  # ATTNVIZ_MAX_PARAMETERS: 4 GB of float32 weights
    max_layers: int = 64  # ATTNVIZ_MAX_LAYERS: per stack (encoder, decoder)
    max_heads: int = 128  # ATTNVIZ_MAX_HEADS
    max_d_model: int = 8192  # ATTNVIZ_MAX_D_MODEL
    max_d_ff: int = 65536  # ATTNVIZ_MAX_D_FF
    max_vocab: int = 1_000_000  # ATTNVIZ_MAX_VOCAB
    max_positions: int = 16384  # ATTNVIZ_MAX_POSITIONS: the config's max_len
    max_file_mb: int = 64  # ATTNVIZ_MAX_FILE_MB: any file but the weights and config.json (tokenizers, vocabularies)
    max_config_mb: int = 1  # ATTNVIZ_MAX_CONFIG_MB: config.json (real ones are a few kB)

    @property
    def max_file_bytes(self) -> int:
        return self.max_file_mb << 20

    @property
    def max_config_bytes(self) -> int:
        return self.max_config_mb << 20

    def weights_bytes(self, n_parameters: int) -> int:
        """The largest weights file for ``n_parameters``: 8 bytes each (float64) and room for the header."""
        return 8 * n_parameters + (16 << 20)


def env_name(field: str) -> str:
    return f"ATTNVIZ_{field.upper()}"


def current_limits() -> Limits:
    """The defaults, with any limit an ``ATTNVIZ_MAX_*`` environment variable raises or lowers."""
    values = {}
    for f in fields(Limits):
        text = os.environ.get(env_name(f.name))
        if text is None:
            continue
        try:
            values[f.name] = int(float(text))
        except ValueError:
            raise CheckpointError(
                f"{env_name(f.name)}={text!r} is not a number", "the server's limits are misconfigured"
            ) from None
    return Limits(**values)


def check_config(cfg: TransformerConfig, n_parameters: int | None, source: str, limits: Limits | None = None) -> None:
    """Refuse a config beyond the limits, naming the value, the limit and how to raise it."""
    limits = limits or current_limits()
    checks = [
        ("n_enc_layers", cfg.n_enc_layers, "max_layers"),
        ("n_dec_layers", cfg.n_dec_layers, "max_layers"),
        ("n_heads", cfg.n_heads, "max_heads"),
        ("d_model", cfg.d_model, "max_d_model"),
        ("d_ff", cfg.d_ff, "max_d_ff"),
        ("src_vocab_size", cfg.src_vocab_size, "max_vocab"),
        ("tgt_vocab_size", cfg.tgt_vocab_size, "max_vocab"),
        ("max_len", cfg.max_len, "max_positions"),
    ]
    if n_parameters is not None:
        checks.append(("parameters", n_parameters, "max_parameters"))
    for name, value, limit in checks:
        if value > getattr(limits, limit):
            raise CheckpointError(
                f"{source}: {name} is {value:,}, above attnviz's limit of {getattr(limits, limit):,}; "
                f"if the model is genuine, raise the limit with {env_name(limit)}",
                TOO_LARGE,
            )
