"""The atlas as tables: per sentence, per head over the corpus, head to head, and the 2-D map of heads.

Plain pandas and numpy: these functions turn the engines' numpy results into the DataFrames that
are written as Parquet (docs/atlas.md) and read by the app. Columns ``kind``
(encoder/decoder/cross), ``layer`` and ``head`` (from 1) name a head everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnviz.atlas.corpus import Sentence
from attnviz.atlas.engine import BatchResult
from attnviz.atlas.stats import POSITIONAL_SHARE, STATISTICS
from attnviz.errors import AtlasError, describe
from attnviz.kinds import KINDS

HEAD = ["kind", "layer", "head"]
KIND_ORDER = pd.CategoricalDtype(list(KINDS), ordered=True)


@dataclass(frozen=True)
class Atlas:
    """Every table of one atlas (docs/atlas.md says what each column holds); an AtlasError when they disagree
    with each other or with the manifest's counts (`_check_agree`), however the atlas was made or read."""

    sentences: pd.DataFrame  # one row per sentence x kind x layer x head
    heads: pd.DataFrame  # one row per kind x layer x head: mean and standard deviation over sentences
    distances: pd.DataFrame  # one row per kind x head pair: mean Jensen-Shannon divergence
    mds: pd.DataFrame  # one row per kind x layer x head: x, y on the 2-D map of that kind's heads
    inputs: pd.DataFrame  # one row per sentence: the exact encoder and decoder inputs
    manifest: dict

    def __post_init__(self):
        _check_agree(self)

    @property
    def kinds(self) -> list[str]:
        return [k for k in KINDS if k in set(self.heads["kind"])]


def _refuse(problem: str) -> AtlasError:
    return AtlasError(f"the atlas's {problem}: compute it again")


def _kind_name(kind) -> str:
    """``kind`` as a message names it: a kind of attention as it is, anything a forged table holds described."""
    return kind if kind in KINDS else describe(kind)


def _head_name(kind, layer, head) -> str:
    return f"{_kind_name(kind)} layer {layer} head {head}"


def _head_order(key: tuple) -> tuple:
    kind, layer, head = key
    return (KINDS.index(kind) if kind in KINDS else len(KINDS), str(kind), layer, head)


def _heads_of(frame: pd.DataFrame) -> set[tuple]:
    """The (kind, layer, head) keys ``frame`` names, each once."""
    return set(frame[HEAD].drop_duplicates().astype({"kind": object}).itertuples(index=False, name=None))


def _check_agree(atlas: Atlas) -> None:
    """AtlasError unless the tables agree with each other and with the manifest's counts.

    Each table can be whole and of the right types (`attnviz.atlas.store`'s checks) and still belong to
    another atlas, or have lost rows: the pages would then show a count the tables do not hold, leave
    heads out of the map, or average the wrong sentences. A sentence and a head are counted once each
    here; a line or a head given twice is `load_atlas`'s to name.
    """
    lines = set(atlas.inputs["line"])
    if not lines:
        raise _refuse("inputs.parquet holds no sentence")
    heads = _heads_of(atlas.heads)
    if not heads:
        raise _refuse("heads.parquet holds no head")
    counts = atlas.manifest.get("counts") or {}
    counted, read = counts.get("sentences"), counts.get("lines")
    if counted != len(lines):
        raise _refuse(f"manifest counts {describe(counted)} sentences and inputs.parquet holds {len(lines):,}")
    if isinstance(read, int) and read < counted:
        raise _refuse(f"manifest counts {counted:,} sentences in {read:,} line{'s' if read != 1 else ''}")
    per_head = atlas.heads["sentences"].to_numpy(dtype="float64", na_value=np.nan)  # pandas' Int64 too
    wrong = np.flatnonzero(per_head != len(lines))  # NaN included
    if len(wrong):
        row, count = atlas.heads.iloc[wrong[0]], per_head[wrong[0]]
        raise _refuse(
            f"heads.parquet counts {describe(int(count) if count.is_integer() else float(count))} sentences for "
            f"{_head_name(row['kind'], row['layer'], row['head'])}, and the atlas holds {len(lines):,}"
        )
    for table in ("sentences", "mds"):
        named = _heads_of(getattr(atlas, table))
        for more, than, which in ((named - heads, table, "heads"), (heads - named, "heads", table)):
            if more:
                first = _head_name(*min(more, key=_head_order))
                others = f" and {len(more) - 1:,} more" if len(more) > 1 else ""
                raise _refuse(f"{than}.parquet has heads that {which}.parquet lacks: {first}{others}")
    if set(atlas.sentences["line"].unique()) != lines:
        raise _refuse("sentences.parquet holds other sentences than inputs.parquet (their lines differ)")
    if len(atlas.sentences) != len(lines) * len(heads):
        raise _refuse(
            f"sentences.parquet has {len(atlas.sentences):,} rows for {len(lines):,} sentences of {len(heads):,} "
            "heads (one row each)"
        )
    if len(atlas.mds) != len(heads):
        raise _refuse(f"mds.parquet has {len(atlas.mds):,} rows for {len(heads):,} heads (one place each)")
    per_kind = atlas.distances.groupby(atlas.distances["kind"].astype(object)).size()
    for kind in sorted({kind for kind, _, _ in heads}, key=lambda kind: _head_order((kind, 0, 0))):
        n = sum(1 for k, _, _ in heads if k == kind)
        if per_kind.get(kind, 0) != n * n:
            raise _refuse(
                f"distances.parquet has {per_kind.get(kind, 0):,} rows for the {n:,} {_kind_name(kind)} heads "
                f"(one per ordered pair: {n * n:,})"
            )
    for table, columns in (("mds", ("x", "y")), ("distances", ("js_divergence",))):
        for column in columns:  # defined for every head and pair (an infinity is load_atlas's to name)
            if getattr(atlas, table)[column].isna().any():
                raise _refuse(f"{table}.parquet has {column} missing in a row")


def _kind_sides(kind: str) -> tuple[int, int]:
    """Which side (0 source, 1 decoder input) holds the (queries, keys) of ``kind``."""
    return {"encoder": (0, 0), "decoder": (1, 1), "cross": (1, 0)}[kind]


def stats_frame(result: BatchResult) -> pd.DataFrame:
    """One row per sentence x kind x layer x head of a batch.

    Columns: line, kind, layer, head, queries, keys, every statistic, positional.
    """
    frames = []
    # (B, 2): a language model's one text (src_ids, read by its decoder) is its decoder side as well
    lengths = np.array([(len(s.src_ids), len(s.src_ids if s.tgt_ids is None else s.tgt_ids)) for s in result.sentences])
    lines = np.array([s.line for s in result.sentences])
    for kind, values in result.stats.items():
        B, L, H, _ = values.shape
        q_side, k_side = _kind_sides(kind)
        columns = {
            "line": np.repeat(lines, L * H),
            "kind": kind,
            "layer": np.tile(np.repeat(np.arange(1, L + 1), H), B),
            "head": np.tile(np.arange(1, H + 1), B * L),
            "queries": np.repeat(lengths[:, q_side], L * H),
            "keys": np.repeat(lengths[:, k_side], L * H),
        }
        columns |= {name: values[..., i].reshape(-1) for i, name in enumerate(STATISTICS)}
        frames.append(pd.DataFrame(columns))  # built at once: a column added at a time costs pandas a copy each
    frame = pd.concat(frames, ignore_index=True)
    frame["positional"] = _positional(frame["argmax_previous"], frame["argmax_next"])
    return frame


def _positional(previous: pd.Series, following: pd.Series) -> pd.Series:
    """Voita et al.'s flag: the largest weight at offset -1 or +1 at least 90% of the time (NA: not defined)."""
    best = pd.concat([previous, following], axis=1).max(axis=1, skipna=True)
    # In the shares' own precision: 9 of 10 rows is 0.9f, under 0.9 in float64. Rounding keeps the order, so
    # k / n >= 0.9 holds exactly when its float32 does (to within a float32 step: n over 10 million rows).
    flag = (best.to_numpy() >= np.asarray(POSITIONAL_SHARE, dtype=best.dtype)).astype(bool)
    flag = pd.Series(flag, index=best.index).astype("boolean")
    flag[best.isna()] = pd.NA
    return flag


def inputs_frame(sentences: Sequence[Sentence]) -> pd.DataFrame:
    """One row per sentence: its line, source text, and the exact ids and labels of both inputs."""
    return pd.DataFrame(
        {
            "line": [s.line for s in sentences],
            "src": [s.src for s in sentences],
            "src_ids": [list(s.src_ids) for s in sentences],
            "src_tokens": [list(s.src_tokens) for s in sentences],
            "tgt_ids": [None if s.tgt_ids is None else list(s.tgt_ids) for s in sentences],
            "tgt_tokens": [None if s.tgt_tokens is None else list(s.tgt_tokens) for s in sentences],
        }
    )


def divergence_sums(result: BatchResult) -> dict[str, tuple[np.ndarray, int]]:
    """Per kind, the sum over the batch's sentences of their (N, N) divergences, and how many were summed."""
    return {kind: (d.sum(axis=0), d.shape[0]) for kind, d in result.divergences.items()}


def add_sums(into: dict, more: dict) -> dict:
    for kind, (total, count) in more.items():
        if kind in into:
            into[kind] = (into[kind][0] + total, into[kind][1] + count)
        else:
            into[kind] = (total, count)
    return into


def sort_sentences(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in corpus order, then kind (encoder, decoder, cross), layer, head: the same whatever the engine."""
    order = frame["kind"].astype(KIND_ORDER)
    return (
        frame.assign(_kind=order)
        .sort_values(["line", "_kind", "layer", "head"], kind="stable")
        .drop(columns="_kind")
        .reset_index(drop=True)
    )


def head_table(sentences: pd.DataFrame) -> pd.DataFrame:
    """One row per head: ``sentences`` counted, each statistic's mean over sentences under its own name,
    its standard deviation over sentences as ``<name>_std`` (population, ddof 0), and ``positional``.

    A sentence where a statistic is undefined (``previous`` of a one-token sentence) is left out of
    that statistic. ``positional`` is Voita et al.'s flag over the whole corpus: the query rows of
    every sentence pooled, is the largest weight at offset -1 (or +1) at least 90% of the time? NA
    for cross-attention. ``positional_offset`` says which offset (-1, +1), 0 when neither.
    """
    return heads_from_parts(head_parts(sentences))


POOLED = ("argmax_previous", "argmax_next")  # pooled over query rows for the positional flag


def head_parts(sentences: pd.DataFrame) -> pd.DataFrame:
    """Per head (index kind, layer, head), what `head_table` needs from these rows, in sums that add up
    over the parts of a corpus (`add_head_parts`): the rows, and per statistic the count ``<name>_n``,
    mean and sum of squared deviations ``<name>_m2`` of its defined values; per pooled argmax share,
    the query rows that have the key (``<name>_rows``) and how many of them put their largest weight there."""
    keys = [sentences[c] for c in HEAD]
    numbers = sentences[list(STATISTICS)].astype("float64")  # the per-sentence rows are float32
    grouped = numbers.groupby(keys, sort=False, observed=True)
    counts = grouped.count()
    parts = grouped.size().rename("sentences").to_frame()
    squares = (grouped.var(ddof=0) * counts).add_suffix("_m2")
    parts = parts.join(counts.add_suffix("_n")).join(grouped.mean()).join(squares)
    # Pooled over query rows: a sentence of n queries has n - 1 rows with a previous (and a next) key.
    rows = (sentences["queries"] - 1).clip(lower=0)
    for name in POOLED:
        value = sentences[name]
        weight = rows.where(value.notna(), 0).astype("float64")
        # A sentence's share is hits / rows, stored in float32: 36/40 times 40 is 35.99999988, and a head exactly
        # at POSITIONAL_SHARE fell under it. Its hits are a whole number: rounded back, they add up exactly.
        hits = (value.fillna(0).astype("float64") * weight).round()
        parts[f"{name}_hits"] = hits.groupby(keys, sort=False, observed=True).sum()
        parts[f"{name}_rows"] = weight.groupby(keys, sort=False, observed=True).sum()
    return parts


def add_head_parts(a: pd.DataFrame | None, b: pd.DataFrame) -> pd.DataFrame:
    """The `head_parts` of two sets of rows together: counts and pooled sums added, means and squared
    deviations merged as Chan, Golub and LeVeque (1979) do, so no pass over the rows is needed again."""
    if a is None:
        return b
    index = a.index.union(b.index, sort=False)
    a, b = a.reindex(index), b.reindex(index)
    out = pd.DataFrame(index=index)
    out["sentences"] = a["sentences"].fillna(0) + b["sentences"].fillna(0)
    for name in STATISTICS:
        na, nb = a[f"{name}_n"].fillna(0), b[f"{name}_n"].fillna(0)
        n = na + nb
        mean_a, mean_b = a[name].fillna(0), b[name].fillna(0)
        delta = mean_b - mean_a
        share = (nb / n.where(n > 0)).fillna(0)
        out[f"{name}_n"] = n
        out[name] = (mean_a + delta * share).where(n > 0)
        out[f"{name}_m2"] = a[f"{name}_m2"].fillna(0) + b[f"{name}_m2"].fillna(0) + delta**2 * na * share
    for name in POOLED:
        for part in ("hits", "rows"):
            out[f"{name}_{part}"] = a[f"{name}_{part}"].fillna(0) + b[f"{name}_{part}"].fillna(0)
    return out


def heads_from_parts(parts: pd.DataFrame) -> pd.DataFrame:
    """The heads' table (`head_table`) from the `head_parts` of all of a corpus's rows."""
    table = parts[["sentences"]].astype("int64")
    means = parts[list(STATISTICS)]
    n = parts[[f"{name}_n" for name in STATISTICS]].to_numpy()
    m2 = parts[[f"{name}_m2" for name in STATISTICS]].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        stds = np.sqrt(np.where(n > 0, m2 / np.where(n > 0, n, 1), np.nan))
    table = table.join(means).join(pd.DataFrame(stds, index=parts.index, columns=[f"{s}_std" for s in STATISTICS]))
    pooled = {}
    for name in POOLED:
        total = parts[f"{name}_rows"]
        pooled[name] = parts[f"{name}_hits"] / total.where(total > 0)
    prev, nxt = pooled["argmax_previous"], pooled["argmax_next"]
    best = pd.concat([prev, nxt], axis=1).max(axis=1, skipna=True)
    table["positional"] = (best >= POSITIONAL_SHARE).astype("boolean")
    table.loc[best.isna(), "positional"] = pd.NA
    offset = np.where(prev.fillna(-1) >= nxt.fillna(-1), -1, 1)
    table["positional_offset"] = pd.array(np.where(table["positional"].fillna(False), offset, 0), dtype="Int64")
    table.loc[best.isna(), "positional_offset"] = pd.NA
    table = table.reset_index()
    return sort_heads(table)


def sort_heads(frame: pd.DataFrame) -> pd.DataFrame:
    order = frame["kind"].astype(KIND_ORDER)
    return frame.assign(_k=order).sort_values(["_k", "layer", "head"]).drop(columns="_k").reset_index(drop=True)


def mean_divergences(sums: dict[str, tuple[np.ndarray, int]]) -> dict[str, np.ndarray]:
    """The (N, N) mean over sentences per kind."""
    return {kind: total / count for kind, (total, count) in sums.items() if count}


def distance_table(means: dict[str, np.ndarray], n_heads: int) -> pd.DataFrame:
    """One row per kind and ordered pair of heads (both orders, and a head with itself at 0): ``js_divergence``."""
    frames = []
    for kind in KINDS:
        if kind not in means:
            continue
        matrix = means[kind]
        N = matrix.shape[0]
        a, b = np.meshgrid(np.arange(N), np.arange(N), indexing="ij")
        frames.append(
            pd.DataFrame(
                {
                    "kind": kind,
                    "layer_a": a.ravel() // n_heads + 1,
                    "head_a": a.ravel() % n_heads + 1,
                    "layer_b": b.ravel() // n_heads + 1,
                    "head_b": b.ravel() % n_heads + 1,
                    "js_divergence": matrix.ravel(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def classical_mds(distances: np.ndarray, dims: int = 2) -> np.ndarray:
    """Points (N, dims) whose Euclidean distances approximate ``distances`` (N, N): Torgerson's classical MDS.

    Double-centre the squared distances, take the top eigenvectors scaled by the square roots of
    their eigenvalues (negative ones count as 0). Each axis's sign is fixed (its largest coordinate
    by size is positive) so that the same matrix always gives the same picture.
    """
    d2 = np.asarray(distances, dtype=np.float64) ** 2
    n = d2.shape[0]
    centre = np.eye(n) - np.full((n, n), 1.0 / n)
    gram = -0.5 * centre @ d2 @ centre
    values, vectors = np.linalg.eigh((gram + gram.T) / 2)
    top = np.argsort(values)[::-1][:dims]
    points = vectors[:, top] * np.sqrt(np.clip(values[top], 0, None))
    if points.shape[1] < dims:
        points = np.pad(points, ((0, 0), (0, dims - points.shape[1])))
    for axis in range(dims):
        column = points[:, axis]
        if column[np.argmax(np.abs(column))] < 0:
            points[:, axis] = -column
    return points


def mds_table(means: dict[str, np.ndarray], n_heads: int) -> pd.DataFrame:
    """Per kind, each head's (x, y): classical MDS of the Jensen-Shannon distance sqrt(mean divergence).

    The square root of the Jensen-Shannon divergence is a metric that embeds in Euclidean space
    (Endres & Schindelin, 2003), which is what classical MDS assumes; heads close on the map attend alike.
    """
    frames = []
    for kind in KINDS:
        if kind not in means:
            continue
        matrix = means[kind]
        points = classical_mds(np.sqrt(np.clip(matrix, 0, None)))
        index = np.arange(matrix.shape[0])
        frames.append(
            pd.DataFrame(
                {
                    "kind": kind,
                    "layer": index // n_heads + 1,
                    "head": index % n_heads + 1,
                    "x": points[:, 0],
                    "y": points[:, 1],
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def typical_sentences(
    sentences: pd.DataFrame, kind: str, layer: int, head: int, statistic: str, n: int = 3
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The head's rows of ``sentences`` where ``statistic`` is closest to (most typical) and farthest
    from (least typical) its mean over the corpus, ``n`` of each, closest (farthest) first.

    Each frame has the sentence rows with a ``deviation`` column, the value minus the mean. Sentences
    where the statistic is undefined are left out.
    """
    rows = sentences[(sentences["kind"] == kind) & (sentences["layer"] == layer) & (sentences["head"] == head)]
    rows = rows[rows[statistic].notna()]
    rows = rows.assign(deviation=rows[statistic] - rows[statistic].mean())
    rows = rows.assign(_distance=rows["deviation"].abs())
    most = rows.sort_values(["_distance", "line"], ascending=[True, True]).head(n)
    least = rows[~rows["line"].isin(most["line"])].sort_values(["_distance", "line"], ascending=[False, True]).head(n)
    return most.drop(columns="_distance").reset_index(drop=True), least.drop(columns="_distance").reset_index(drop=True)
