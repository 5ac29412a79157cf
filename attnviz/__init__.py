"""attnviz: see and explore attention in the Transformer of "Attention Is All You Need".

Its public names, listed once in :mod:`attnviz.public`, are imported on first use, not with the
package: pytest imports ``attnviz.testing.plugin`` in every test run of every project where attnviz
is installed, and that must not import torch (seconds) for a run that never takes an attention
snapshot.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib.metadata import PackageNotFoundError, version

# Returning every attention map writes a new map of L x H x T x T floats per forward pass: 576 MB
# for GPT-2 small at 1024 tokens. Faulting that memory in 4 KB pages cost as long as computing it
# (13 ms of a 31 ms layer, AMD EPYC); torch's CPU allocator asks for 2 MB pages instead when this is
# set before it first allocates (docs/benchmarks.md). Set it to 0 to keep torch's default.
if "torch" not in sys.modules:
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from attnviz.public import WHERE

try:
    __version__ = version("attnviz")
except PackageNotFoundError:
    __version__ = "not installed"

__all__ = sorted([*WHERE, "__version__"])  # attnviz.public lists every name once


def __getattr__(name: str):
    if name not in WHERE:
        raise AttributeError(f"module 'attnviz' has no attribute {name!r}")
    value = getattr(importlib.import_module(WHERE[name]), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *WHERE})
