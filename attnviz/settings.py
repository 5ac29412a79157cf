"""The operator's numeric settings (``ATTNVIZ_*`` in the environment), read one way everywhere.

A setting is a finite number from a low to a high bound, a whole number where it counts things. Unset, it is its
default. One that is unreadable, not finite, under its low bound or not whole where it must be is its default;
one over its high bound is that bound; each such replacement is logged once, with the setting and its value, and
never raises: a server keeps serving. Read anyhow, "0.5" workers at once had become 0 and lifted the limit on heavy
work, "inf" raised an OverflowError on every page, and "-5" MB of cache had cached nothing.
"""

from __future__ import annotations

import logging
import math
import os

log = logging.getLogger(__name__)
_said: set[tuple[str, str]] = set()


def number_setting(name: str, default: float, low: float, high: float, whole: bool = False) -> float:
    """The setting ``name``: ``default`` when unset or not a finite number of at least ``low`` (and whole, where
    ``whole``); ``high`` when over it. An int where ``whole``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return int(default) if whole else float(default)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= low and (value.is_integer() or not whole)):
        used, why = default, f"is not a finite number of at least {low:g}" + (" (a whole number)" if whole else "")
    elif value > high:
        used, why = high, f"is more than the most it may be, {high:g}"
    else:
        return int(value) if whole else value
    if (name, text) not in _said:
        _said.add((name, text))
        log.warning("%s=%r %s: %g is used", name, text[:40], why, used)
    return int(used) if whole else float(used)
