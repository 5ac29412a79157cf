"""Compare two atlas folders (what `attnviz atlas` writes) by their documented files.

An atlas folder holds ``heads.parquet`` (one row per kind x layer x head: columns ``kind``,
``layer``, ``head`` and statistics such as ``entropy``, ``mean_distance``, ``confidence``),
``sentences.parquet`` (the sentences it was built from) and ``manifest.json``. Heads are matched
on (kind, layer, head), whatever their order in the file, and named as the file numbers them;
numeric columns are compared within the tolerance, others exactly. When the sentences differ the
statistics are not compared: they describe other inputs, and one finding says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from attnviz.errors import ExportError
from attnviz.testing.report import MAX_GROUPS_SHOWN, Finding, Report, clip, differences, manifest_context

HEAD_KEYS = ["kind", "layer", "head"]


def _read_table(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises its own zoo of errors for a file that is not Parquet
        raise ExportError(f"{path} is not a readable Parquet table: {type(e).__name__}: {e}") from None


def read_atlas(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame | None, dict]:
    """(heads indexed by kind/layer/head, sentences or None, manifest) of an atlas folder."""
    heads_file = folder / "heads.parquet"
    if not heads_file.is_file():
        raise ExportError(f"{folder} is not an attnviz atlas: it has no heads.parquet")
    heads = _read_table(heads_file)
    missing = [k for k in HEAD_KEYS if k not in heads.columns]
    if missing:
        raise ExportError(f"{heads_file} is not an atlas table: it has no {', '.join(missing)} column")
    if heads.duplicated(HEAD_KEYS).any():
        kind, layer, head = heads.loc[heads.duplicated(HEAD_KEYS), HEAD_KEYS].iloc[0]
        raise ExportError(f"{heads_file} has more than one row for {kind} layer {layer} head {head}")
    sentences_file = folder / "sentences.parquet"
    sentences = _read_table(sentences_file) if sentences_file.is_file() else None
    manifest_file = folder / "manifest.json"
    manifest = {}
    if manifest_file.is_file():
        try:
            manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ExportError(f"{manifest_file} is not valid JSON: {e}") from None
        if not isinstance(manifest, dict):
            raise ExportError(f"{manifest_file} is not a JSON object")
        if manifest.get("complete") is False:  # a run stopped part-way: its tables are not the atlas
            raise ExportError(f"{folder} holds an unfinished atlas: run its command again to finish it")
    return heads.set_index(HEAD_KEYS).sort_index(), sentences, manifest


def _head_name(key: tuple) -> str:
    kind, layer, head = key
    return f"{kind} layer {layer} head {head}"


def _column_differences(
    table: str, column: str, a: pd.Series, b: pd.Series, atol: float, rtol: float, name_row
) -> tuple[Finding | None, str]:
    """A finding for the rows where ``a`` and ``b`` differ (aligned series), or None and a line on what was equal."""
    numeric = pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b)
    if pd.api.types.is_numeric_dtype(a) != pd.api.types.is_numeric_dtype(b):  # "0.5" and 0.5 print alike
        kinds = ["numbers" if pd.api.types.is_numeric_dtype(s) else f"{s.dtype} values" for s in (a, b)]
        text = f"{table} {column}: {kinds[0]} in A, {kinds[1]} in B"
        return Finding("values", f"{table}:{column}", text, (), {"table": table, "column": column}), ""
    if numeric:
        x, y = a.to_numpy(dtype=np.float64), b.to_numpy(dtype=np.float64)
        off, gap = differences(x, y, atol, rtol)
    else:
        x, y = a.astype(str).to_numpy(), b.astype(str).to_numpy()
        off = x != y
        gap = off.astype(np.float64)
    largest = float(gap.max()) if len(gap) else 0.0
    if not off.any():
        return None, f"{table} {column}: {len(off):,} rows" + (
            f", largest |A - B| {largest:.1e}" if numeric else ", identical"
        )
    order = np.argsort(-gap, kind="stable")[: int(off.sum())]
    details = []
    for i in order[:MAX_GROUPS_SHOWN]:
        gap_text = f", |A - B| {gap[i]:.2e}" if numeric else ""
        shown = (f"{x[i]:.6g}", f"{y[i]:.6g}") if numeric else (clip(repr(x[i])), clip(repr(y[i])))
        details.append(f"{name_row(i)}: A {shown[0]}, B {shown[1]}{gap_text}")
    if off.sum() > MAX_GROUPS_SHOWN:
        details.append(f"... and {int(off.sum()) - MAX_GROUPS_SHOWN} more rows")
    text = f"{table} {column}: {int(off.sum()):,} of {len(off):,} rows differ" + (
        f"; largest |A - B| {largest:.2e}" if numeric else ""
    )
    data = {"table": table, "column": column, "rows_off": int(off.sum()), "rows": len(off)}
    return Finding("values", f"{table}:{column}", text, tuple(details), data), ""


def _compare_sentences(a: pd.DataFrame | None, b: pd.DataFrame | None, atol: float, rtol: float) -> list[Finding]:
    if a is None and b is None:
        return []
    if a is None or b is None:
        which = "A" if b is None else "B"
        return [Finding("missing", "sentences.parquet", f"sentences.parquet: only {which} has it")]
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        text = (
            f"sentences.parquet: the atlases were built from different sentences: {len(a)} rows "
            f"({', '.join(map(str, a.columns))}) in A, {len(b)} rows ({', '.join(map(str, b.columns))}) in B"
        )
        return [Finding("inputs", "sentences.parquet", text)]
    findings = []
    for column in a.columns:
        finding, _ = _column_differences(
            "sentences.parquet", column, a[column], b[column], atol, rtol, lambda i: f"sentence row {i}"
        )
        if finding is not None:
            text = "the atlases were built from different sentences: " + finding.text
            findings.append(Finding("inputs", finding.subject, text, finding.details, finding.data))
    return findings


def compare_atlases(
    a: str | Path, b: str | Path, atol: float, rtol: float = 0.0, labels: tuple[str, str] | None = None
) -> Report:
    """Every difference between atlas folder ``a`` (expected) and ``b`` (actual), as a
    [`Report`][attnviz.testing.report.Report].

    ``labels`` name A and B in the report (default: the paths).
    """
    a, b = Path(a), Path(b)
    heads_a, sentences_a, manifest_a = read_atlas(a)
    heads_b, sentences_b, manifest_b = read_atlas(b)
    findings = _compare_sentences(sentences_a, sentences_b, atol, rtol)
    checked: list[str] = []
    if findings:
        findings.append(Finding("inputs", "heads.parquet", "heads.parquet: not compared, since the sentences differ"))
    else:
        for which, only in (
            ("A", heads_a.index.difference(heads_b.index)),
            ("B", heads_b.index.difference(heads_a.index)),
        ):
            if len(only):
                shown = ", ".join(_head_name(k) for k in only[:MAX_GROUPS_SHOWN]) + (
                    " ..." if len(only) > MAX_GROUPS_SHOWN else ""
                )
                text = f"heads.parquet: {len(only)} head{'s' * (len(only) != 1)} only in {which}: {shown}"
                findings.append(
                    Finding("missing", "heads.parquet", text, data={"only_in": which, "heads": [list(k) for k in only]})
                )
        for which, columns in (
            ("A", heads_a.columns.difference(heads_b.columns)),
            ("B", heads_b.columns.difference(heads_a.columns)),
        ):
            for column in columns:
                findings.append(
                    Finding(
                        "missing", f"heads.parquet:{column}", f"heads.parquet: only {which} has the column {column!r}"
                    )
                )
        common = heads_a.index.intersection(heads_b.index)
        x, y = heads_a.loc[common], heads_b.loc[common]
        for column in [c for c in heads_a.columns if c in heads_b.columns]:
            finding, line = _column_differences(
                "heads.parquet", column, x[column], y[column], atol, rtol, lambda i: _head_name(common[i])
            )
            if finding is None:
                checked.append(line)
            else:
                findings.append(finding)
    context = manifest_context(manifest_a, manifest_b)
    labels = labels or (str(a), str(b))
    return Report(labels[0], labels[1], atol, rtol, tuple(findings), tuple(checked), tuple(context))
