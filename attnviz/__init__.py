"""attnviz: see and explore attention in the Transformer of "Attention Is All You Need"."""

__version__ = "0.1.0"

from attnviz.api import (  # noqa: E402
    DEFAULT_MODEL,
    AttentionExport,
    attention,
    list_models,
    load,
    load_export,
    step_through,
    translate,
)
from attnviz.checkpoint import Bundle  # noqa: E402
from attnviz.errors import AttnvizError, CheckpointError, ConfigError, DeviceError, InputError  # noqa: E402
from attnviz.model import Attention, Transformer, TransformerConfig  # noqa: E402

__all__ = [
    "DEFAULT_MODEL",
    "Attention",
    "AttentionExport",
    "AttnvizError",
    "Bundle",
    "CheckpointError",
    "ConfigError",
    "DeviceError",
    "InputError",
    "Transformer",
    "TransformerConfig",
    "attention",
    "list_models",
    "load",
    "load_export",
    "step_through",
    "translate",
]
