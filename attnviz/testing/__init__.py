"""Snapshot tests of attention: compare two exports (or atlases) and report how they differ.

- `attnviz.testing.compare`: [`compare_exports`][attnviz.testing.compare_exports], the
  [`Report`][attnviz.testing.Report] (text and JSON), the invariants of attention weights;
- `attnviz.testing.atlas`: the same for two atlas folders;
- `attnviz.testing.plugin`: the pytest plugin, with the ``attention_snapshot`` fixture and
  the ``--attnviz-update`` flag (docs/snapshots.md).

The names below load on first use: pytest imports the plugin in every run where attnviz is
installed, and that import must stay free of numpy and torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnviz.testing.atlas import compare_atlases
    from attnviz.testing.compare import DEFAULT_ATOL, Finding, Report, check_invariants, compare_exports, compare_paths

_PUBLIC = {
    "DEFAULT_ATOL": "attnviz.testing.compare",
    "Finding": "attnviz.testing.compare",
    "Report": "attnviz.testing.compare",
    "check_invariants": "attnviz.testing.compare",
    "compare_exports": "attnviz.testing.compare",
    "compare_paths": "attnviz.testing.compare",
    "compare_atlases": "attnviz.testing.atlas",
}

__all__ = [
    "DEFAULT_ATOL",
    "Finding",
    "Report",
    "check_invariants",
    "compare_atlases",
    "compare_exports",
    "compare_paths",
]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'attnviz.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
