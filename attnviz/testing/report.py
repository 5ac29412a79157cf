"""What a comparison found, for people and for machines: findings, the report, and the manifests' context.

Shared by the comparison of exports (`attnviz.testing.compare`) and of atlas folders
(`attnviz.testing.atlas`); neither imports the other for it. Only numpy is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_GROUPS_SHOWN = 8  # heads listed per array; the count of the others follows
MAX_VALUE_CHARS = 120  # a token, string or manifest value shown in a report; the count of its characters follows


def clip(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``text`` as a report shows it: cut after ``limit`` characters, saying how long it was. A golden file may hold
    a token or a manifest value of a megabyte, and the report printed each whole (twice for a changed token)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


@dataclass(frozen=True)
class Finding:
    """One difference between A and B, or one broken invariant.

    ``what`` is one of "inputs", "missing", "shape", "values", "invariant"; ``subject`` the array,
    side or table it is about; ``text`` one line for people, ``details`` the lines under it;
    ``data`` the same facts for machines (JSON-able).
    """

    what: str
    subject: str
    text: str
    details: tuple[str, ...] = ()
    data: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "what": self.what,
            "subject": self.subject,
            "text": self.text,
            "details": list(self.details),
            **self.data,
        }


@dataclass(frozen=True)
class Report:
    """Every difference between A (expected) and B (actual), renderable as text or JSON.

    ``findings`` are the differences (empty when the two are equal within the tolerance);
    ``checked`` says, one line per array, what was found equal; ``context`` lists what differs
    between the two manifests (versions, device, kernels) and may explain the findings.
    """

    a: str
    b: str
    atol: float
    rtol: float
    findings: tuple[Finding, ...]
    checked: tuple[str, ...] = ()
    context: tuple[dict, ...] = ()

    @property
    def equal(self) -> bool:
        return not self.findings

    def to_text(self) -> str:
        """The report for people: what A and B are, the verdict, each difference, then the context."""
        lines = [f"A: {self.a}", f"B: {self.b}", f"tolerance: |A - B| <= {self.atol:g} + {self.rtol:g} * |B| per cell"]
        if self.equal:
            lines.append("EQUAL within the tolerance")
        else:
            n = len(self.findings)
            lines.append(f"DIFFERENT: {n} finding{'s' * (n != 1)}")
            for f in self.findings:
                lines.append(f"- {f.text}")
                lines.extend(f"    {d}" for d in f.details)
        if self.checked:
            lines.append("equal within the tolerance:")
            lines.extend(f"  {c}" for c in self.checked)
        if self.context:
            lines.append("context (differs between the two manifests; may explain differences):")
            lines.extend(f"  {_context_line(c)}" for c in self.context)
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The report for machines: the same facts as [`to_text`][attnviz.testing.report.Report.to_text], as a
        JSON-able dict.

        Strict JSON: a value that is not finite (NaN against a number) is the string "nan" or "inf".
        """
        return _json_safe(
            {
                "equal": self.equal,
                "a": self.a,
                "b": self.b,
                "atol": self.atol,
                "rtol": self.rtol,
                "findings": [f.to_json() for f in self.findings],
                "checked": list(self.checked),
                "context": list(self.context),
            }
        )


def differences(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> tuple[np.ndarray, np.ndarray]:
    """(off, gap) of two float64 arrays: which cells differ by more than ``atol + rtol |B|`` (NaN equals NaN), and
    |A - B| as a report states it: where a cell differs, NaN against a number and any infinite gap are inf
    (nan_to_num alone would make an infinity 1.8e308); where it does not, 0 for NaN and infinite pairs."""
    with np.errstate(invalid="ignore"):
        off = ~np.isclose(a, b, atol=atol, rtol=rtol, equal_nan=True)
        gap = np.abs(a - b)
    return off, np.where(off, np.nan_to_num(gap, nan=np.inf, posinf=np.inf), np.nan_to_num(gap, nan=0.0, posinf=0.0))


def _json_safe(value):
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)  # "nan", "inf", "-inf": JSON has no such numbers
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Labels: which cell of which map, in the app's words


CONTEXT_KEYS = ("model", "checkpoint_sha256", "method", "units", "format_version", "versions", "run", "config")
# an atlas also records what it was built from and how (docs/atlas.md); a corpus or targets file hashed
# otherwise is also a finding (attnviz.testing.atlas), the rest may explain a difference
ATLAS_CONTEXT_KEYS = (
    *CONTEXT_KEYS,
    "corpus",
    "targets",
    "tgt_from",
    "precision",
    "limit",
    "unknown",
    "engine",
    "device",
)


def _flatten(value, prefix: str) -> dict[str, object]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}.{key}").items()}
    return {prefix: value}


def manifest_context(a: dict, b: dict, keys: tuple[str, ...] = CONTEXT_KEYS) -> list[dict]:
    """What differs between two manifests among ``keys``, what can explain numbers: model, versions, device,
    kernels, config (an atlas's: also its corpus, targets, precision, limit, engine).

    One entry per differing leaf, ``{"key": "versions.torch", "a": ..., "b": ...}``; a whole block
    that one side does not record (an older file has no ``run``) is one entry whose missing side is None.
    A block recorded as null on one side (an atlas without targets) is compared leaf by leaf, as None.
    """
    flat_a, flat_b = {}, {}
    for key in keys:
        x, y = a.get(key), b.get(key)
        if (x is None) != (y is None) and not (key in a and key in b):
            flat_a[key], flat_b[key] = x, y  # not recorded on one side: one entry, not one per field
        else:
            flat_a.update(_flatten(x, key))
            flat_b.update(_flatten(y, key))
    keys = [*flat_a, *(k for k in flat_b if k not in flat_a)]
    return [{"key": k, "a": flat_a.get(k), "b": flat_b.get(k)} for k in keys if flat_a.get(k) != flat_b.get(k)]


def _context_line(entry: dict) -> str:
    for missing, other in (("a", "B"), ("b", "A")):
        if entry[missing] is None and isinstance(entry["b" if missing == "a" else "a"], dict):
            return f"{entry['key']}: recorded in {other} only"
    return f"{entry['key']}: {clip(repr(entry['a']))} (A) vs {clip(repr(entry['b']))} (B)"


# ---------------------------------------------------------------------------------------------
# The comparison
