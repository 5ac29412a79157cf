"""attnviz: see and explore attention in the Transformer of "Attention Is All You Need"."""

from attnviz.api import (
    DEFAULT_MODEL,
    METHODS,
    Ablation,
    AblationComparison,
    AttentionExport,
    HeadImportance,
    attention,
    attribute,
    compare_ablation,
    head_importance,
    list_models,
    load,
    load_export,
    step_through,
    translate,
)
from attnviz.checkpoints import Bundle
from attnviz.errors import AttnvizError, CheckpointError, ConfigError, DeviceError, InputError
from attnviz.export import package_version
from attnviz.model import Attention, Transformer, TransformerConfig

__version__ = package_version("attnviz")

__all__ = [
    "DEFAULT_MODEL",
    "METHODS",
    "Ablation",
    "AblationComparison",
    "Attention",
    "AttentionExport",
    "AttnvizError",
    "Bundle",
    "CheckpointError",
    "ConfigError",
    "DeviceError",
    "HeadImportance",
    "InputError",
    "Transformer",
    "TransformerConfig",
    "__version__",
    "attention",
    "attribute",
    "compare_ablation",
    "head_importance",
    "list_models",
    "load",
    "load_export",
    "step_through",
    "translate",
]
