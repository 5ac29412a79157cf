"""attnviz: see and explore attention in the Transformer of "Attention Is All You Need".

Its public names, listed once in `attnviz.public`, are imported on first use, not with the
package: pytest imports ``attnviz.testing.plugin`` in every test run of every project where attnviz
is installed, and that must not import torch (seconds) for a run that never takes an attention
snapshot.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

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
