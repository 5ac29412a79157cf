"""Compare two attention exports and say, for people and for machines, where and how they differ.

[`compare_exports`][attnviz.testing.compare.compare_exports] gives a [`Report`][attnviz.testing.report.Report] with
every difference between an expected export A (a golden file) and an actual one B: inputs that changed (tokens, ids, and
why: another text, another tokenizer, another greedy output), arrays missing or reshaped, cells whose values differ by
more than the tolerance (grouped by kind, layer and head, with the worst query and key and their tokens), and broken
invariants of attention weights (a row that does not sum to 1, a weight
outside [0, 1], a causal cell that is not 0). Differences in the manifests' versions, device and
kernels are listed as context: they do not make two exports differ, but they say why they might.

Layers and heads are counted from 1, as the app shows them; query and key positions from 0, as the
app's axis labels show them ("4 ein"). A cell differs when ``|A - B| > atol + rtol * |B|``
(``numpy.isclose``); NaN equals NaN.

Only numpy is needed: exports are compared without torch or a model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnviz.errors import ExportError
from attnviz.export import DEFAULT_ATOL, AttentionExport, holds_weights, load_export
from attnviz.kinds import KIND_SIDES, KINDS, axis_names, causal_mask
from attnviz.testing.report import (
    MAX_GROUPS_SHOWN,
    MAX_VALUE_CHARS,
    Finding,
    Report,
    differences,
    manifest_context,
)

ROW_SUM_ATOL = 1e-5  # how far a row of float32 weights may sum from 1 (or atol, when larger)
MAX_TOKENS_SHOWN = 12  # tokens listed around the first changed one

SIDES = {"source": ("src_ids", "src_tokens", "src"), "target": ("tgt_ids", "tgt_tokens", "tgt")}


def _quote(token: str) -> str:
    if len(token) > MAX_VALUE_CHARS:  # quoted in part, so that the quotes still show where it starts
        return f"{json.dumps(token[:MAX_VALUE_CHARS], ensure_ascii=False)}... ({len(token):,} characters)"
    return json.dumps(token, ensure_ascii=False)  # "ein", with quotes and escapes visible


def _tokens_excerpt(tokens: Sequence[str], around: int) -> str:
    start = max(0, min(around - MAX_TOKENS_SHOWN // 2, len(tokens) - MAX_TOKENS_SHOWN))
    shown = " ".join(f"{i}:{_quote(t)}" for i, t in enumerate(tokens[start : start + MAX_TOKENS_SHOWN], start))
    return ("... " if start else "") + shown + (" ..." if start + MAX_TOKENS_SHOWN < len(tokens) else "")


def _generic_axes(ndim: int) -> list[str]:
    return [f"axis {i}" for i in range(ndim)]


def axes_of(name: str, array: np.ndarray, export: AttentionExport) -> list[str]:
    """The names of ``array``'s axes: the manifest's, else the kind's (L, H, Q, K) or (L, Q, K), else "axis i"."""
    declared = export.manifest.get("axes", {}).get(name) if isinstance(export.manifest.get("axes"), dict) else None
    if isinstance(declared, list) and len(declared) == array.ndim and all(isinstance(a, str) for a in declared):
        return declared
    if name in KIND_SIDES:
        query, key = axis_names(name)
        by_ndim = {4: ["layer", "head", query, key], 3: ["layer", query, key], 2: [query, key]}
        return by_ndim.get(array.ndim, _generic_axes(array.ndim))
    return _generic_axes(array.ndim)


def _axis_tokens(axis: str, length: int, export: AttentionExport) -> Sequence[str] | None:
    """The tokens along an axis named like "query: source position", when they fit its length."""
    if "source" in axis:
        tokens = export.src_tokens
    elif "decoder input" in axis or "target" in axis:
        tokens = export.tgt_tokens
    else:
        return None
    return tokens if tokens is not None and len(tokens) == length else None


def _cell_label(index: Sequence[int], axes: Sequence[str], shape: Sequence[int], export: AttentionExport) -> str:
    parts = []
    for i, axis, n in zip(index, axes, shape, strict=True):
        role = axis.split(":")[0].strip()
        if role in ("layer", "head"):
            parts.append(f"{role} {i + 1}")  # counted from 1, as the app shows them
        else:
            tokens = _axis_tokens(axis, n, export)
            parts.append(f"{role} {i}" + ("" if tokens is None else f" {_quote(tokens[i])}"))
    return ", ".join(parts)


def _group_label(index: Sequence[int], axes: Sequence[str]) -> str:
    return ", ".join(
        f"{axis} {i + 1}" if axis in ("layer", "head") else f"{axis.split(':')[0]} {i}"
        for i, axis in zip(index, axes, strict=True)
    )


def _n(count: int) -> str:
    return f"{count:,}"


def _cells(count: int) -> str:
    return f"{count:,} cell{'s' * (count != 1)}"


# ---------------------------------------------------------------------------------------------
# Inputs: tokens and ids, compared before any number


def _decoder_input(export: AttentionExport) -> str:
    """What an export's decoder input is, in words: a language model's prompt, an encoder-decoder's given target or
    its own greedy output."""
    if export.src_tokens is None:
        return "a language model's prompt" + (" and its continuation" if export.manifest.get("generated") else "")
    return "an encoder-decoder's " + ("given target" if export.manifest.get("tgt") is not None else "own greedy output")


def _compare_side(side: str, a: AttentionExport, b: AttentionExport) -> Finding | None:
    ids_name, tokens_name, text_key = SIDES[side]
    a_ids, b_ids = getattr(a, ids_name), getattr(b, ids_name)
    a_tok, b_tok = getattr(a, tokens_name), getattr(b, tokens_name)
    if a_tok is None and b_tok is None:
        return None
    if (a_ids is None or b_ids is None) and a_tok is not None and b_tok is not None:
        # maps from another library (attnviz.notebook.plain_export) have tokens and no ids: their tokens say the text
        if tuple(a_tok) == tuple(b_tok):
            return None
        first = next(
            (i for i, (x, y) in enumerate(zip(a_tok, b_tok, strict=False)) if x != y), min(len(a_tok), len(b_tok))
        )
        details = (
            f"A ({len(a_tok)} tokens): {_tokens_excerpt(a_tok, first)}",
            f"B ({len(b_tok)} tokens): {_tokens_excerpt(b_tok, first)}",
        )
        data = {"side": side, "first_difference": first, "a_tokens": list(a_tok), "b_tokens": list(b_tok)}
        why = f"the {side} tokens differ from position {first} (a file without ids is compared by its tokens)"
        return Finding("inputs", side, why, details, {**data, "cause": "tokens"})
    if a_tok is None or b_tok is None:
        # by the tokens, not the ids: maps from another library have none, and both files lacking them named A
        which = "A" if b_tok is None else "B"
        kind = "a language model" if side == "source" else "encoder-only"
        return Finding("inputs", side, f"only {which} has a {side} side (the other model is {kind})")
    same_ids = a_ids.shape == b_ids.shape and bool(np.array_equal(a_ids, b_ids))
    if same_ids and tuple(a_tok) == tuple(b_tok):
        return None
    first = next((i for i, (x, y) in enumerate(zip(a_tok, b_tok, strict=False)) if x != y), min(len(a_tok), len(b_tok)))
    details = (
        f"A ({len(a_tok)} tokens): {_tokens_excerpt(a_tok, first)}",
        f"B ({len(b_tok)} tokens): {_tokens_excerpt(b_tok, first)}",
    )
    data = {"side": side, "first_difference": first, "a_tokens": list(a_tok), "b_tokens": list(b_tok)}
    units = a.manifest.get("units"), b.manifest.get("units")
    if units[0] != units[1] and all(isinstance(u, str) for u in units):  # `--words` on one side only
        why = (
            f"the {side} tokens are {units[0]} in A and {units[1]} in B (attnviz attention --words merges pieces "
            "into words): the maps are over other units"
        )
        return Finding("inputs", side, why, details, {**data, "cause": "units"})
    if same_ids:
        why = f"the {side} ids are equal but their tokens differ from position {first}: the vocabulary's labels changed"
        return Finding("inputs", side, why, details, {**data, "cause": "labels"})
    if side == "target" and (a.src_tokens is None) != (b.src_tokens is None):  # a language model and a translator
        why = f"the decoder input is {_decoder_input(a)} in A and {_decoder_input(b)} in B"
        return Finding("inputs", side, why, details, {**data, "cause": "model kind"})
    lm = a.src_ids is None and b.src_ids is None  # language models: the decoder input is the prompt (and more)
    a_text, b_text = (
        (a.manifest.get("src"), b.manifest.get("src")) if lm else (a.manifest.get(text_key), b.manifest.get(text_key))
    )
    side = "prompt" if lm else side
    generated = lm and (a.manifest.get("generated") or b.manifest.get("generated"))
    if generated and a_text == b_text:
        cause, why = "greedy output", f"the same prompt {_quote(a_text)} was continued differently by the model"
    elif side == "target" and a_text is None and b_text is None and "tgt" in a.manifest and "tgt" in b.manifest:
        cause, why = "greedy output", "the model's own greedy output (the decoder input) changed"
    elif a_text is not None and a_text == b_text:
        cause = "tokenizer"
        why = f"the same {side} text {_quote(a_text)} was tokenised differently: a different tokenizer or vocabulary"
    elif a_text is not None and b_text is not None:
        cause, why = "text", f"the {side} text differs: {_quote(a_text)} (A) vs {_quote(b_text)} (B)"
    else:
        cause, why = "ids", f"the {side} ids differ"
    why += f"; first difference at position {first}" if first < min(len(a_tok), len(b_tok)) else ""
    return Finding("inputs", side, why, details, {**data, "cause": cause})


# ---------------------------------------------------------------------------------------------
# Values


def _percent(part: int, whole: int) -> str:
    """'8.3%', '0.042%', '100%': two figures, never 100% unless every one, never 1e+02%."""
    if part == whole:
        return "100%"
    share = 100 * part / whole
    return f"{share:.2g}%" if share < 10 else f"{min(share, 99.9):.1f}%" if share >= 99.5 else f"{share:.0f}%"


def _compare_values(
    name: str, a: np.ndarray, b: np.ndarray, atol: float, rtol: float, b_export: AttentionExport
) -> tuple[Finding | None, str]:
    """A finding for the cells of ``name`` that differ, or None; and one line on what was compared."""
    if a.dtype.kind in "US" or b.dtype.kind in "US":
        if a.dtype.kind == b.dtype.kind and np.array_equal(a, b):
            return None, f"{name}: {_n(a.size)} strings, identical"
        off = a != b
        where = tuple(int(i) for i in np.argwhere(off)[0]) if off.ndim else ()
        text = f"{name}: {_n(int(off.sum()))} of {_n(off.size)} strings differ, first at {where}"
        return Finding("values", name, text, data={"array": name, "cells_off": int(off.sum()), "cells": off.size}), ""
    for side, array in (("A", a), ("B", b)):
        if array.dtype.kind not in "biuf":  # complex would compare its real part alone; void or records not at all
            raise ExportError(
                f"{name} in {side} holds {array.dtype} values: attnviz compares real numbers and strings only"
            )
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    off, gap = differences(a64, b64, atol, rtol)
    largest = float(gap.max()) if gap.size else 0.0
    if not off.any():
        return None, f"{name}: {_n(off.size)} cells, largest |A - B| {largest:.1e}"
    axes = axes_of(name, b, b_export)
    lead = max(b.ndim - 2, 0)  # group by every axis but the last two: (layer, head) of (L, H, Q, K)
    groups = int(np.prod(b.shape[:lead], dtype=np.int64))
    off_g = off.reshape(groups, -1)
    gap_g = np.where(off, gap, -1.0).reshape(groups, -1)
    counts = off_g.sum(1)
    order = [int(g) for g in np.argsort(-counts, kind="stable") if counts[g]]
    n_off = int(counts.sum())
    group_word = "head" if "head" in axes[:lead] else "layer" if "layer" in axes[:lead] else "group"
    where = f" in {len(order)} of {groups} {group_word}s" if lead else ""
    text = (
        f"{name}: {_n(n_off)} of {_n(off.size)} cells differ ({_percent(n_off, off.size)}){where}; "
        f"largest |A - B| {largest:.2e}"
    )
    details, groups_data = [], []
    for g in order[:MAX_GROUPS_SHOWN]:
        flat = int(np.argmax(gap_g[g]))
        index = tuple(int(i) for i in np.unravel_index(g * off_g.shape[1] + flat, b.shape))
        va, vb = float(a64[index]), float(b64[index])
        label = _cell_label(index, axes, b.shape, b_export)
        cell = _cell_label(index[lead:], axes[lead:], b.shape[lead:], b_export)  # the group is named before it
        per = (
            f"{_group_label(index[:lead], axes[:lead])}: {_n(int(counts[g]))} of {_n(off_g.shape[1])} cells; "
            if lead
            else ""
        )
        details.append(f"{per}worst at {cell}: A {va:.6g}, B {vb:.6g}, |A - B| {float(gap[index]):.2e}")
        groups_data.append({"index": list(index), "cell": label, "cells_off": int(counts[g]), "a": va, "b": vb})
    if len(order) > MAX_GROUPS_SHOWN:
        details.append(f"... and {len(order) - MAX_GROUPS_SHOWN} more {group_word}s")
    data = {
        "array": name,
        "axes": axes,
        "cells_off": n_off,
        "cells": off.size,
        "largest": largest,
        "worst": groups_data,
    }
    return Finding("values", name, text, tuple(details), data), ""


# ---------------------------------------------------------------------------------------------
# Invariants of attention weights


def is_plain_attention(export: AttentionExport) -> bool:
    """Whether the export holds post-softmax weights (not a method's relevance, whose rows need not sum to 1)."""
    return holds_weights(export.manifest)


def check_invariants(export: AttentionExport, label: str, atol: float = 0.0) -> list[Finding]:
    """The broken invariants of an export's (L, H, Q, K) attention weights; empty when none is broken.

    Every weight is finite and in [0, 1], every row sums to 1 (within ``max(ROW_SUM_ATOL, atol)``),
    and every cell of the decoder's future (the causal mask, 3.2.3) is exactly 0. A method's maps
    (``manifest["method"]``), (L, H, Q, K) or (L, Q, K), need only be finite: its numbers need not be shares.
    So do the export's further numeric arrays (``extras``, e.g. grad-attention's ``source_relevance``): NaN there
    had compared equal to NaN, and a golden file holding it passed every run.
    """
    weights = is_plain_attention(export)
    findings = []
    row_tol = max(ROW_SUM_ATOL, atol)
    for kind in KINDS:
        w = getattr(export, kind)
        if w is None or w.dtype.kind != "f" or w.ndim not in ((4,) if weights else (3, 4)):
            continue
        axes = axes_of(kind, w, export)
        lead = w.ndim - 2  # (layer, head) or a method's (layer)
        groups, group_word = int(np.prod(w.shape[:lead])), "heads" if lead == 2 else "layers"
        Q, K = w.shape[-2:]
        w64 = w.astype(np.float64)
        checks = []
        bad = ~np.isfinite(w64)
        checks.append(("not finite (NaN or infinite)", bad, None))
        if weights:
            with np.errstate(invalid="ignore"):
                checks.append(("outside [0, 1]", np.isfinite(w64) & ((w64 < 0) | (w64 > 1 + row_tol)), w64))
                sums = w64.sum(-1)  # (L, H, Q)
                rows_bad = np.abs(sums - 1) > row_tol
            if kind == "decoder":
                future = ~causal_mask(Q, K)
                checks.append(("not 0 in the causal mask (a query sees a later position)", (w64 != 0) & future, w64))
        for problem, cells, values in checks:
            if cells.any():
                index = tuple(int(i) for i in np.argwhere(cells)[0])
                shown = "" if values is None else f" = {values[index]:.6g}"
                heads = {tuple(int(i) for i in at) for at in np.argwhere(cells)[:, :lead]}
                text = (
                    f"invariant broken in {label}: {kind}: {_cells(int(cells.sum()))} {problem}, in {len(heads)} of "
                    f"{groups} {group_word}; first at {_cell_label(index, axes, w.shape, export)}{shown}"
                )
                data = {
                    "array": kind,
                    "invariant": problem,
                    "file": label,
                    "cells": int(cells.sum()),
                    "first": list(index),
                }
                findings.append(Finding("invariant", kind, text, data=data))
        if not weights:
            continue
        L, H = w.shape[:2]
        if rows_bad.any():
            worst = tuple(
                int(i) for i in np.unravel_index(np.argmax(np.where(rows_bad, np.abs(sums - 1), -1)), sums.shape)
            )
            heads = sorted({(int(li), int(h)) for li, h in np.argwhere(rows_bad)[:, :2]})
            shown = ", ".join(f"layer {li + 1} head {h + 1}" for li, h in heads[:MAX_GROUPS_SHOWN])
            text = (
                f"invariant broken in {label}: {kind}: {_n(int(rows_bad.sum()))} row{'s' * int(rows_bad.sum() != 1)} "
                "not summing to 1 "
                f"(tolerance {row_tol:g}), in {len(heads)} of {L * H} heads; worst: "
                f"{_cell_label(worst, axes[:3], w.shape[:3], export)} sums to {sums[worst]:.6g}"
            )
            details = (f"heads: {shown}" + (" ..." if len(heads) > MAX_GROUPS_SHOWN else ""),)
            data = {
                "array": kind,
                "invariant": "rows sum to 1",
                "file": label,
                "rows": int(rows_bad.sum()),
                "worst": list(worst),
            }
            findings.append(Finding("invariant", kind, text, details, data))
    for name, values in export.extras.items():
        if not (isinstance(values, np.ndarray) and values.dtype.kind == "f" and values.size):
            continue
        bad = ~np.isfinite(values)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            cell = _cell_label(index, axes_of(name, values, export), values.shape, export)
            text = (
                f"invariant broken in {label}: {name}: {_cells(int(bad.sum()))} not finite (NaN or infinite) of "
                f"{_n(bad.size)}; first at {cell} = {values[index]}"
            )
            data = {"array": name, "invariant": "not finite (NaN or infinite)", "file": label, "cells": int(bad.sum())}
            findings.append(Finding("invariant", name, text, data={**data, "first": list(index)}))
    return findings


# ---------------------------------------------------------------------------------------------
# Manifests: context, never a difference by itself


def _numeric_arrays(export: AttentionExport) -> dict[str, np.ndarray]:
    maps = {kind: getattr(export, kind) for kind in KINDS if getattr(export, kind) is not None}
    return {**maps, **export.extras}


def compare_exports(
    a: AttentionExport,
    b: AttentionExport,
    atol: float = DEFAULT_ATOL,
    rtol: float = 0.0,
    labels: tuple[str, str] = ("A", "B"),
) -> Report:
    """Every difference between export ``a`` (expected) and ``b`` (actual), as a
    [`Report`][attnviz.testing.report.Report].

    When the inputs differ (other ids on either side), the maps are not compared cell by cell: their
    rows and columns are other tokens, and one finding says why instead of a million numbers.
    """
    findings: list[Finding] = []
    checked: list[str] = []
    inputs = [f for side in SIDES if (f := _compare_side(side, a, b)) is not None]
    findings.extend(inputs)
    ids_changed = any(f.data.get("cause") != "labels" for f in inputs)
    arrays_a, arrays_b = _numeric_arrays(a), _numeric_arrays(b)
    names = [*arrays_a, *(n for n in arrays_b if n not in arrays_a)]
    if ids_changed:
        skipped = ", ".join(names)
        findings.append(
            Finding(
                "inputs",
                "maps",
                f"the maps ({skipped}) were not compared cell by cell: their rows and columns are other tokens",
                data={"not_compared": names},
            )
        )
    else:
        for name in names:
            if name not in arrays_a or name not in arrays_b:
                which = "A" if name in arrays_a else "B"
                findings.append(Finding("missing", name, f"{name}: only {which} has this array", data={"array": name}))
                continue
            x, y = arrays_a[name], arrays_b[name]
            if x.shape != y.shape:
                axes = ", ".join(axes_of(name, y, b))
                text = f"{name}: shapes differ, {x.shape} (A) vs {y.shape} (B), axes ({axes}); not compared"
                findings.append(
                    Finding("shape", name, text, data={"array": name, "a": list(x.shape), "b": list(y.shape)})
                )
                continue
            finding, line = _compare_values(name, x, y, atol, rtol, b)
            if finding is None:
                checked.append(line)
            else:
                findings.append(finding)
    findings.extend(check_invariants(a, "A", atol))
    findings.extend(check_invariants(b, "B", atol))
    # a file without format_version is version 1: say so rather than "None"
    versioned = [{**e.manifest, "format_version": e.format_version} for e in (a, b)]
    context = manifest_context(*versioned)
    return Report(labels[0], labels[1], atol, rtol, tuple(findings), tuple(checked), tuple(context))


def compare_paths(
    a: str | Path, b: str | Path, atol: float = DEFAULT_ATOL, rtol: float = 0.0, labels: tuple[str, str] | None = None
) -> Report:
    """Compare two .npz exports, or two atlas folders; raises ExportError for a file that is neither.

    ``labels`` name A and B in the report (default: the paths).
    """
    a, b = Path(a), Path(b)
    labels = labels or (str(a), str(b))
    if a.is_dir() and b.is_dir():
        from attnviz.testing.atlas import compare_atlases

        return compare_atlases(a, b, atol, rtol, labels)
    if a.is_dir() or b.is_dir():
        folder, file = (a, b) if a.is_dir() else (b, a)
        raise ExportError(
            f"cannot compare the folder {folder} (an atlas) with the file {file} (an export): give two of a kind"
        )
    return compare_exports(load_export(a), load_export(b), atol, rtol, labels)
