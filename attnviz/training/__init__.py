"""Training: the recipes, one loop for both kinds of model, the generated data, the optimiser and the history.

- `attnviz.training.recipes`: how each shipped model is trained;
- `attnviz.training.loop`: the one training loop (`train`), resumable;
- `attnviz.training.seq2seq`, `attnviz.training.lm`: the two kinds of model's batches, evaluation and card;
- `attnviz.training.data`: the generated tasks; `attnviz.training.optim`: Adam and equation 3;
- `attnviz.training.history`, `attnviz.training.recording`: what a training records every N steps;
- `attnviz.training.formation`: when a head formed, read off a history.

The history and formation names are imported with the package (numpy and pandas only); ``train``,
``Recipe`` and ``RECIPES`` on first use (they import torch).
"""

from __future__ import annotations

import importlib

from attnviz.training.formation import characteristic_head, formation_step, head_series, loss_drop, rise
from attnviz.training.history import HISTORY, History, HistoryWriter, Probe, load_history

_LAZY = {"train": "attnviz.training.loop", "Recipe": "attnviz.training.recipes", "RECIPES": "attnviz.training.recipes"}

__all__ = [
    "HISTORY",
    "RECIPES",
    "History",
    "HistoryWriter",
    "Probe",
    "Recipe",
    "characteristic_head",
    "formation_step",
    "head_series",
    "load_history",
    "loss_drop",
    "rise",
    "train",
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'attnviz.training' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
