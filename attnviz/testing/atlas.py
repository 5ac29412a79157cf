"""Compare two atlas folders (what `attnviz atlas` writes) by their documented files (docs/atlas.md).

An atlas folder holds ``inputs.parquet`` (one row per sentence: ``line``, its text ``src`` and the exact
token ids and tokens), ``sentences.parquet`` (one row per sentence x kind x layer x head: ``line``,
``kind``, ``layer``, ``head``, ``queries``, ``keys`` and every statistic), ``heads.parquet`` (one row
per kind x layer x head: the statistics pooled over the sentences), ``distances.parquet`` (one row per
kind x ordered pair of heads: their divergence over the corpus), ``mds.parquet`` (the heads' map drawn from
those divergences) and ``manifest.json`` (the corpus file and its sha256, targets, precision, device...).

The inputs come first: the lines of ``inputs.parquet`` and the manifest's corpus and targets hashes.
Statistics of other inputs are not compared: ``sentences.parquet`` only on the lines whose inputs are
the same on both sides, ``heads.parquet`` and ``distances.parquet`` (which pool every sentence) only when
no line differs. ``mds.parquet`` is not compared: it is drawn from ``distances.parquet`` alone, and each of
its axes is defined only up to its sign (and up to a rotation where two eigenvalues are equal), so equal
divergences can give other coordinates.
Rows are matched on their keys whatever their order in the file, and named by them; integer and flag
columns (counts, positions, ``positional``) are compared exactly, other numbers within the tolerance,
text exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from attnviz.errors import ExportError
from attnviz.testing.report import (
    ATLAS_CONTEXT_KEYS,
    MAX_GROUPS_SHOWN,
    Finding,
    Report,
    clip,
    differences,
    manifest_context,
)

HEAD_KEYS = ["kind", "layer", "head"]
SENTENCE_KEYS = ["line", *HEAD_KEYS]
PAIR_KEYS = ["kind", "layer_a", "head_a", "layer_b", "head_b"]
INPUT_KEYS = ["line"]
HASHED_INPUTS = ("corpus", "targets")  # manifest blocks whose sha256 says which file the lines came from


@dataclass(frozen=True)
class AtlasFiles:
    """The tables of an atlas folder that a comparison reads, each indexed by its keys and sorted."""

    heads: pd.DataFrame  # by kind, layer, head
    sentences: pd.DataFrame | None  # by line, kind, layer, head; None when the folder has no sentences.parquet
    inputs: pd.DataFrame | None  # by line; None when the folder has no inputs.parquet
    distances: pd.DataFrame | None  # by kind and pair of heads; None when the folder has no distances.parquet
    manifest: dict


def _read_table(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises its own zoo of errors for a file that is not Parquet
        raise ExportError(f"{path} is not a readable Parquet table: {type(e).__name__}: {e}") from None


def _keyed(path: Path, keys: list[str], name_row: Callable[[tuple], str]) -> pd.DataFrame:
    """The table at ``path`` indexed by ``keys``; an ExportError when a key column is missing or repeated."""
    table = _read_table(path)
    missing = [k for k in keys if k not in table.columns]
    if missing:
        raise ExportError(f"{path} is not an atlas table: it has no {', '.join(missing)} column")
    repeated = table.duplicated(keys)
    if repeated.any():
        raise ExportError(f"{path} has more than one row for {name_row(tuple(table.loc[repeated, keys].iloc[0]))}")
    return table.set_index(keys).sort_index()


def read_atlas(folder: Path) -> AtlasFiles:
    """The tables and manifest of an atlas folder; an ExportError when it is not one, or not a finished one."""
    heads_file = folder / "heads.parquet"
    if not heads_file.is_file():
        raise ExportError(f"{folder} is not an attnviz atlas: it has no heads.parquet")
    heads = _keyed(heads_file, HEAD_KEYS, _head_name)
    optional = {}
    for name, keys, name_row in (
        ("sentences", SENTENCE_KEYS, _row_name),
        ("inputs", INPUT_KEYS, _line_name),
        ("distances", PAIR_KEYS, _pair_name),
    ):
        path = folder / f"{name}.parquet"
        optional[name] = _keyed(path, keys, name_row) if path.is_file() else None
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
    return AtlasFiles(heads, optional["sentences"], optional["inputs"], optional["distances"], manifest)


def _head_name(key: tuple) -> str:
    kind, layer, head = key
    return f"{kind} layer {layer} head {head}"


def _pair_name(key: tuple) -> str:
    kind, layer_a, head_a, layer_b, head_b = key
    return f"{kind} layer {layer_a} head {head_a} and layer {layer_b} head {head_b}"


def _row_name(key: tuple) -> str:
    return f"{_line_name(key[:1])}, {_head_name(key[1:])}"


def _line_name(key) -> str:
    line = key[0] if isinstance(key, tuple) else key
    return f"line {line}"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' * (n != 1)}"


# ---------------------------------------------------------------------------------------------
# Values, column by column


def _exact(series: pd.Series) -> bool:
    """Whether a column counts or identifies (integers, flags): one more token is a difference at any tolerance."""
    return pd.api.types.is_integer_dtype(series) or pd.api.types.is_bool_dtype(series)


def _column_differences(
    table: str, column: str, a: pd.Series, b: pd.Series, atol: float, rtol: float, name_row
) -> tuple[Finding | None, str]:
    """A finding for the rows where ``a`` and ``b`` differ (aligned series), or None and a line on what was equal."""
    numeric = pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b)
    if pd.api.types.is_numeric_dtype(a) != pd.api.types.is_numeric_dtype(b):  # "0.5" and 0.5 print alike
        kinds = ["numbers" if pd.api.types.is_numeric_dtype(s) else f"{s.dtype} values" for s in (a, b)]
        text = f"{table} {column}: {kinds[0]} in A, {kinds[1]} in B"
        return Finding("values", f"{table}:{column}", text, (), {"table": table, "column": column}), ""
    exact = numeric and (_exact(a) or _exact(b))
    if numeric:
        x, y = (s.to_numpy(dtype=np.float64, na_value=np.nan) for s in (a, b))  # a flag's or count's NA is NaN
        off, gap = differences(x, y, 0.0 if exact else atol, 0.0 if exact else rtol)
    else:
        x, y = a.astype(str).to_numpy(), b.astype(str).to_numpy()
        off = x != y
        gap = off.astype(np.float64)
    largest = float(gap.max()) if len(gap) else 0.0
    if not off.any():
        return None, f"{table} {column}: {len(off):,} rows" + (
            f", largest |A - B| {largest:.1e}" if numeric and not exact else ", identical"
        )
    order = np.argsort(-gap, kind="stable")[: int(off.sum())]
    details = []
    for i in order[:MAX_GROUPS_SHOWN]:
        gap_text = f", |A - B| {gap[i]:.2e}" if numeric else ""
        shown = (f"{x[i]:.6g}", f"{y[i]:.6g}") if numeric else (clip(repr(x[i])), clip(repr(y[i])))
        details.append(f"{name_row(i)}: A {shown[0]}, B {shown[1]}{gap_text}")
    if off.sum() > MAX_GROUPS_SHOWN:
        details.append(f"... and {int(off.sum()) - MAX_GROUPS_SHOWN} more rows")
    text = f"{table} {column}: {int(off.sum()):,} of {len(off):,} rows differ"
    if numeric:
        text += (" (compared exactly)" if exact else "") + f"; largest |A - B| {largest:.2e}"
    data = {"table": table, "column": column, "rows_off": int(off.sum()), "rows": len(off), "exact": exact}
    return Finding("values", f"{table}:{column}", text, tuple(details), data), ""


def _compare_table(
    table: str, a: pd.DataFrame, b: pd.DataFrame, atol: float, rtol: float, noun: str, name_row
) -> tuple[list[Finding], list[str]]:
    """(findings, lines on what was equal) of two tables indexed by the same keys: rows and columns
    only one side has, then every common column on the common rows."""
    findings, checked = [], []
    for which, only in (("A", a.index.difference(b.index)), ("B", b.index.difference(a.index))):
        if len(only):
            shown = ", ".join(name_row(k) for k in only[:MAX_GROUPS_SHOWN]) + (
                " ..." if len(only) > MAX_GROUPS_SHOWN else ""
            )
            text = f"{table}: {_plural(len(only), noun)} only in {which}: {shown}"
            data = {"only_in": which, f"{noun}s": [list(k) if isinstance(k, tuple) else [k] for k in only]}
            findings.append(Finding("missing", table, text, data=data))
    for which, columns in (("A", a.columns.difference(b.columns)), ("B", b.columns.difference(a.columns))):
        for column in columns:
            findings.append(Finding("missing", f"{table}:{column}", f"{table}: only {which} has the column {column!r}"))
    common = a.index.intersection(b.index)
    x, y = a.loc[common], b.loc[common]
    for column in [c for c in a.columns if c in b.columns]:
        finding, line = _column_differences(
            table, column, x[column], y[column], atol, rtol, lambda i: name_row(common[i])
        )
        if finding is None:
            checked.append(line)
        else:
            findings.append(finding)
    return findings, checked


# ---------------------------------------------------------------------------------------------
# Inputs: the lines and the files they came from, compared before any statistic


def _plain(value):
    """A cell of inputs.parquet as a comparable, printable value: token ids and tokens as lists."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return None if value is None or (isinstance(value, float) and np.isnan(value)) else value


def _compare_inputs(a: pd.DataFrame, b: pd.DataFrame) -> tuple[list[Finding], list[str], set]:
    """(findings, lines on what was equal, the lines whose inputs differ or only one side has)."""
    only_a, only_b = a.index.difference(b.index), b.index.difference(a.index)
    columns = [c for c in a.columns if c in b.columns]
    common = a.index.intersection(b.index)
    # column by column, not cell by cell (a.at[line, c] took 68 s for a million lines)
    off_by_column = {}
    for c in columns:
        pairs = zip(a.loc[common, c].tolist(), b.loc[common, c].tolist(), strict=True)
        off_by_column[c] = np.fromiter((_plain(x) != _plain(y) for x, y in pairs), bool, len(common))
    off_rows = np.flatnonzero(np.logical_or.reduce([*off_by_column.values(), np.zeros(len(common), bool)]))
    changed = [(common[i], [c for c in columns if off_by_column[c][i]]) for i in off_rows]  # (line, its columns)
    findings = [
        Finding("missing", f"inputs.parquet:{column}", f"inputs.parquet: only {which} has the column {column!r}")
        for which, extra in (("A", a.columns.difference(b.columns)), ("B", b.columns.difference(a.columns)))
        for column in extra
    ]
    differing = {*only_a, *only_b, *(line for line, _ in changed)}
    if not differing:
        return findings, [f"inputs.parquet: {_plural(len(common), 'line')}, identical"], differing
    details = []
    for line, off in changed:
        if "src" in off:
            what = f"src {clip(repr(_plain(a.at[line, 'src'])))} (A) vs {clip(repr(_plain(b.at[line, 'src'])))} (B)"
        else:
            text = clip(repr(_plain(a.at[line, "src"]))) if "src" in columns else ""
            what = f"{text} tokenised differently: {', '.join(off)} differ".strip()
        details.append(f"{_line_name(line)}: {what}")
    for which, only, side in (("A", only_a, a), ("B", only_b, b)):
        for line in only:
            text = f" ({clip(repr(_plain(side.at[line, 'src'])))})" if "src" in side.columns else ""
            details.append(f"{_line_name(line)}: only in {which}{text}")
    text = (
        f"inputs.parquet: the atlases were built from different inputs: the inputs of {_plural(len(differing), 'line')}"
        f" differ"
        f" ({len(changed)} changed, {len(only_a)} only in A, {len(only_b)} only in B)"
    )
    if len(details) > MAX_GROUPS_SHOWN:
        details = [*details[:MAX_GROUPS_SHOWN], f"... and {len(details) - MAX_GROUPS_SHOWN} more lines"]
    data = {"lines": sorted(int(line) for line in differing)}
    findings.insert(0, Finding("inputs", "inputs.parquet", text, tuple(details), data))
    return findings, [], differing


def _compare_sources(a: dict, b: dict) -> tuple[list[Finding], list[str]]:
    """(a finding for each input file, corpus or targets, that the two manifests hash differently; a line
    for each they hash alike)."""
    findings, checked = [], []
    for key in HASHED_INPUTS:
        if key not in a or key not in b:  # not recorded on one side: context, not a difference
            continue
        x, y = (m[key] if isinstance(m[key], dict) else {} for m in (a, b))
        if (a[key] is None) != (b[key] is None):
            which = "A" if b[key] is None else "B"
            text = f"manifest.json: only {which} was built with a {key} file ({(x or y).get('file')!r})"
        elif x.get("sha256") != y.get("sha256"):
            text = (
                f"manifest.json: the {key} files differ: {x.get('file')!r} sha256 {x.get('sha256')} (A) vs "
                f"{y.get('file')!r} sha256 {y.get('sha256')} (B)"
            )
        else:
            if a[key] is not None:
                checked.append(f"manifest.json {key}: the same file, sha256 {x.get('sha256')}")
            continue
        findings.append(Finding("inputs", f"manifest.json:{key}", text, data={"a": a[key], "b": b[key]}))
    return findings, checked


# ---------------------------------------------------------------------------------------------
# The comparison


def _compare_statistics(
    x: AtlasFiles, y: AtlasFiles, differing: set, atol: float, rtol: float
) -> tuple[list[Finding], list[str]]:
    """(findings, lines on what was equal) of sentences.parquet on the lines not in ``differing``, and of
    heads.parquet and distances.parquet when ``differing`` is empty: they pool every sentence."""
    findings, checked = [], []
    if x.sentences is not None and y.sentences is not None:
        kept = [s[~s.index.get_level_values("line").isin(differing)] for s in (x.sentences, y.sentences)]
        findings, checked = _compare_table("sentences.parquet", *kept, atol, rtol, "row", _row_name)
        if differing:
            lines = ", ".join(str(line) for line in sorted(differing)[:MAX_GROUPS_SHOWN])
            text = (
                f"sentences.parquet: the rows of {_plural(len(differing), 'line')} not compared, since their "
                f"inputs differ: {lines}" + (" ..." if len(differing) > MAX_GROUPS_SHOWN else "")
            )
            findings.append(Finding("inputs", "sentences.parquet", text, data={"lines": sorted(map(int, differing))}))
    elif x.sentences is not None or y.sentences is not None:
        which = "A" if y.sentences is None else "B"
        findings.append(Finding("missing", "sentences.parquet", f"sentences.parquet: only {which} has it"))
    if differing:
        text = "heads.parquet: not compared, since its statistics pool sentences whose inputs differ"
        findings.append(Finding("inputs", "heads.parquet", text))
        if x.distances is not None or y.distances is not None:
            text = "distances.parquet: not compared, since its divergences pool sentences whose inputs differ"
            findings.append(Finding("inputs", "distances.parquet", text))
        return findings, checked
    found, equal = _compare_table("heads.parquet", x.heads, y.heads, atol, rtol, "head", _head_name)
    findings.extend(found)
    checked.extend(equal)
    if x.distances is not None and y.distances is not None:
        found, equal = _compare_table("distances.parquet", x.distances, y.distances, atol, rtol, "pair", _pair_name)
        findings.extend(found)
        checked.extend(equal)
    elif x.distances is not None or y.distances is not None:
        which = "A" if y.distances is None else "B"
        findings.append(Finding("missing", "distances.parquet", f"distances.parquet: only {which} has it"))
    return findings, checked


def atlas_invariants(files: AtlasFiles, label: str) -> list[Finding]:
    """What `attnviz.atlas.load_atlas` refuses in an atlas's numbers, as findings: an infinite statistic,
    divergence or place in any table, and a missing (NaN) one among those never missing (`NEVER_NAN`) in
    sentences.parquet and heads.parquet. The comparison reads NaN as equal to NaN and inf to inf, so two
    atlases broken alike had compared equal, and the snapshot plugin kept such a folder as golden."""
    from attnviz.atlas.store import broken_numbers

    findings = []
    for table, frame, name_row in (
        ("sentences", files.sentences, _row_name),
        ("heads", files.heads, _head_name),
        ("distances", files.distances, _pair_name),
    ):
        for column, bad in ({} if frame is None else broken_numbers(table, frame)).items():
            first = int(np.argmax(bad))
            key = frame.index[first]
            value = frame[column].to_numpy(dtype=float, na_value=np.nan)[first]
            text = (
                f"invariant broken in {label}: {table}.parquet {column}: {_plural(int(bad.sum()), 'row')} infinite or "
                f"missing (NaN); first at {name_row(key if isinstance(key, tuple) else (key,))} = {value}"
            )
            data = {"table": table, "column": column, "file": label, "rows": int(bad.sum())}
            findings.append(Finding("invariant", f"{table}.parquet:{column}", text, data=data))
    return findings


def compare_atlases(
    a: str | Path, b: str | Path, atol: float, rtol: float = 0.0, labels: tuple[str, str] | None = None
) -> Report:
    """Every difference between atlas folder ``a`` (expected) and ``b`` (actual), as a
    [`Report`][attnviz.testing.report.Report].

    ``labels`` name A and B in the report (default: the paths).
    """
    a, b = Path(a), Path(b)
    x, y = read_atlas(a), read_atlas(b)
    sources, checked = _compare_sources(x.manifest, y.manifest)
    findings = list(sources)
    if x.inputs is not None and y.inputs is not None:
        found, equal, differing = _compare_inputs(x.inputs, y.inputs)
        findings.extend(found)
        checked.extend(equal)
    else:
        if x.inputs is not None or y.inputs is not None:
            which = "A" if y.inputs is None else "B"
            findings.append(Finding("missing", "inputs.parquet", f"inputs.parquet: only {which} has it"))
        differing = None if sources else set()  # another corpus (by its hash), and no lines to say where
    if differing is None:
        text = "sentences.parquet, heads.parquet: not compared: an input file differs, and no inputs.parquet says where"
        findings.append(Finding("inputs", "sentences.parquet", text))
    else:
        found, equal = _compare_statistics(x, y, differing, atol, rtol)
        findings.extend(found)
        checked.extend(equal)
    labels = labels or (str(a), str(b))
    findings.extend([*atlas_invariants(x, "A"), *atlas_invariants(y, "B")])
    context = manifest_context(x.manifest, y.manifest, ATLAS_CONTEXT_KEYS)
    return Report(labels[0], labels[1], atol, rtol, tuple(findings), tuple(checked), tuple(context))
