"""Every public name of attnviz, written once, with the module that defines it.

``attnviz`` exposes exactly these names (imported on first use: importing the package must not
import torch), and ``attnviz.api.__all__`` is its part of the table. Adding a function to the API
is its definition in ``api.py`` plus one name here. This module imports nothing.
"""

from __future__ import annotations

PUBLIC: dict[str, tuple[str, ...]] = {
    "attnviz.api": (
        "DEFAULT_MODEL",
        "METHODS",
        "MINILM",
        "Ablation",
        "AblationComparison",
        "Atlas",
        "AttentionExport",
        "ForwardPass",
        "HeadChoice",
        "HeadImportance",
        "TiledAttention",
        "attention",
        "attention_scores",
        "attribute",
        "build_atlas",
        "clearest_head",
        "compare_ablation",
        "compute_atlas",
        "forward_pass",
        "head_importance",
        "list_models",
        "load",
        "load_atlas",
        "load_export",
        "maps_size",
        "named_heads",
        "out_of_domain",
        "queries_keys",
        "resolve_model",
        "run_record",
        "step_through",
        "tiled_attention",
        "unknown_pieces",
        "translate",
        "generate",
        "versions",
    ),
    "attnviz.checkpoints": ("Bundle",),
    "attnviz.errors": ("AttnvizError", "CheckpointError", "ConfigError", "DeviceError", "ExportError", "InputError"),
    "attnviz.model": ("Attention", "Transformer", "TransformerConfig"),
    "attnviz.training.history": ("History", "load_history"),
}

# name -> the module it lives in
WHERE: dict[str, str] = {name: module for module, names in PUBLIC.items() for name in names}
