"""attnviz: see and explore attention in the Transformer of "Attention Is All You Need".

The names below are imported on first use, not with the package: pytest imports
``attnviz.testing.plugin`` in every test run of every project where attnviz is installed, and that
must not import torch (seconds) for a run that never takes an attention snapshot.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
        queries_keys,
        step_through,
        translate,
    )
    from attnviz.checkpoints import Bundle
    from attnviz.errors import AttnvizError, CheckpointError, ConfigError, DeviceError, ExportError, InputError
    from attnviz.model import Attention, Transformer, TransformerConfig

try:
    __version__ = version("attnviz")
except PackageNotFoundError:
    __version__ = "not installed"

# name -> the module it lives in
_PUBLIC = {
    "DEFAULT_MODEL": "attnviz.api",
    "METHODS": "attnviz.api",
    "Ablation": "attnviz.api",
    "AblationComparison": "attnviz.api",
    "AttentionExport": "attnviz.api",
    "HeadImportance": "attnviz.api",
    "attention": "attnviz.api",
    "attribute": "attnviz.api",
    "compare_ablation": "attnviz.api",
    "head_importance": "attnviz.api",
    "list_models": "attnviz.api",
    "load": "attnviz.api",
    "load_export": "attnviz.api",
    "queries_keys": "attnviz.api",
    "step_through": "attnviz.api",
    "translate": "attnviz.api",
    "Bundle": "attnviz.checkpoints",
    "AttnvizError": "attnviz.errors",
    "CheckpointError": "attnviz.errors",
    "ConfigError": "attnviz.errors",
    "DeviceError": "attnviz.errors",
    "ExportError": "attnviz.errors",
    "InputError": "attnviz.errors",
    "Attention": "attnviz.model",
    "Transformer": "attnviz.model",
    "TransformerConfig": "attnviz.model",
}

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
    "ExportError",
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
    "queries_keys",
    "step_through",
    "translate",
]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
