"""How attention forms: what the page of that name reads from a training history, over plain arrays.

A history (`attnviz.training.history.History`) holds, per record (a training step), the losses,
every head's statistics on a fixed probe set (a table with one row per step, kind, layer and head)
and the full maps of a few probe texts. Here are the pieces the page and the notebook views draw:
the record nearest a step, every head's statistic as one line over the steps, one probe's maps at a
record with their row and column labels, the head a statistic names, and the phase change of a
language model (Olsson et al., 2022): the loss, the previous-token score of the previous-token
head and the induction score of the induction head on one step axis.

Layers and heads count from 1, as in the atlas's table. Shape letters: N records, L layers,
H heads, Q queries, K keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnviz.atlas.stats import STATISTICS
from attnviz.export import written
from attnviz.kinds import TITLES, writing_labels
from attnviz.training.formation import CRITERIA, best_head
from attnviz.training.history import ENCODER_DECODER, LANGUAGE_MODEL

INDEX_COLUMNS = ("step", "kind", "layer", "head")  # the heads table's row keys; every other column is a statistic
SITES = ("encoder", "decoder", "cross")  # the order heads are listed in: the paper's, source to output
# The statistic a history opens on, by its task, else by the model's kind: the first of these that the table
# holds. A shipped task's is the one its card says its head formed by (`attnviz.training.formation.CRITERIA`).
OPENING_STATISTIC = {
    **{task: (statistic,) for task, (statistic, _) in CRITERIA.items()},
    "language model": ("induction", "previous"),
    "encoder-decoder": ("confidence", "diagonal"),
}
PREVIOUS, INDUCTION = "previous", "induction"  # the two scores of the phase change


def history_mismatch(kind: str, heads: pd.DataFrame, config) -> str | None:
    """Why a history (its ``kind``, "encoder-decoder" or "language model", and its ``heads`` table) is not the
    training of a model of ``config`` (`attnviz.config.TransformerConfig`), or None when its heads are the model's.

    A history lies beside the weights it trained (``history/``), but a folder put together by hand may hold
    another training's: its maps had been drawn under this model's name, and the heads its card names, which
    the history lacks, had failed the page."""
    model_kind = LANGUAGE_MODEL if config.decoder_only else "encoder-only" if config.encoder_only else ENCODER_DECODER
    if kind != model_kind:
        return f"its history is {_a(kind)}'s training, and the model is {_a(model_kind)}"
    layers = {"encoder": config.n_enc_layers, "decoder": config.n_dec_layers, "cross": config.n_dec_layers}
    for site in SITES:
        rows = heads[heads["kind"] == site]
        if rows.empty:
            continue
        recorded = (int(rows["layer"].max()), int(rows["head"].max()))
        if recorded != (layers[site], config.n_heads):
            return (
                f"its history records {TITLES[site].lower()} in {_count(recorded[0], 'layer')} of "
                f"{_count(recorded[1], 'head')}, and the model has {_count(layers[site], 'layer')} of "
                f"{_count(config.n_heads, 'head')}"
            )
    return None


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def statistics_of(heads: pd.DataFrame) -> list[str]:
    """The statistics a heads table holds a value of, for some head at some record: the atlas's
    (`attnviz.atlas.stats.STATISTICS`) in its order, then others. One that is NaN everywhere (`unmeasured`) is
    left out: the page had offered it, and drawn its chart empty."""
    named = [c for c in heads.columns if c not in INDEX_COLUMNS and heads[c].notna().any()]
    return [s for s in STATISTICS if s in named] + sorted(s for s in named if s not in STATISTICS)


def unmeasured(heads: pd.DataFrame) -> list[str]:
    """The statistics a heads table names but holds no value of (NaN for every head at every record)."""
    return sorted(c for c in heads.columns if c not in INDEX_COLUMNS and not heads[c].notna().any())


def opening_statistic(heads: pd.DataFrame, kind: str, task: str = "") -> str:
    """The statistic the page opens on for a history of ``task`` (a model of ``kind``): its characteristic one if
    recorded, else the first."""
    held = statistics_of(heads)
    if not held:
        raise ValueError("the history's heads table holds no statistic")
    wanted = (*OPENING_STATISTIC.get(task, ()), *OPENING_STATISTIC.get(kind, ()))
    return next((s for s in wanted if s in held), held[0])


def nearest_record(steps: Sequence[int], wanted: float) -> int:
    """The index of the record whose step is nearest ``wanted`` (the earlier one on a tie)."""
    steps = np.asarray(steps)
    if steps.size == 0:
        raise ValueError("the history has no record")
    return int(np.argmin(np.abs(steps.astype(np.float64) - float(wanted))))


def head_id(kind: str, layer: int, head: int) -> str:
    """A head's name in a link and a widget: ``cross-L2-H3``."""
    return f"{kind}-L{int(layer)}-H{int(head)}"


def parse_head(text: str) -> tuple[str, int, int]:
    """(kind, layer, head) of a `head_id`; ValueError when ``text`` is none."""
    parts = str(text).split("-")
    if len(parts) != 3 or parts[0] not in SITES or parts[1][:1] != "L" or parts[2][:1] != "H":
        raise ValueError(f"{text!r} names no head: write it as kind-L<layer>-H<head>, e.g. cross-L2-H3")
    layer, head = parts[1][1:], parts[2][1:]
    if not (layer.isdigit() and head.isdigit()):
        raise ValueError(f"{text!r} names no head: layer and head are whole numbers")
    return parts[0], int(layer), int(head)


def head_name(kind: str, layer: int, head: int, short: bool = False) -> str:
    """A head as people read it: ``Cross-attention (encoder-decoder), layer 2, head 3``; ``short``: without
    the kind's note in brackets (``Cross-attention, layer 2, head 3``), for a title in half a screen's width."""
    kind_title = TITLES[kind].split(" (")[0] if short else TITLES[kind]
    return f"{kind_title}, layer {layer}, head {head}"


def _site_order(kind: str, layer: int, head: int) -> tuple[int, int, int]:
    return (SITES.index(kind) if kind in SITES else len(SITES), int(layer), int(head))


def _heads_in_order(heads: pd.DataFrame) -> tuple[list[tuple[str, int, int]], np.ndarray]:
    """Every head of a heads table, (kind, layer, head) in the order of `SITES`, layer and head, and the
    index among them of each row's head.

    On arrays, not row by row: the page reads them on every rerun, and a set of the rows' tuples and a
    pivot table took 8.5 ms of a 52 ms rerun of en-de's history (1,800 rows; 2-core AMD EPYC, Zen 4)."""
    codes, kinds = pd.factorize(heads["kind"].astype(str).to_numpy())
    by_site = sorted(range(len(kinds)), key=lambda i: (_site_order(kinds[i], 0, 0), kinds[i]))
    rank = np.empty(len(kinds), dtype=np.int64)
    rank[by_site] = np.arange(len(kinds))
    keys = np.stack([rank[codes], heads["layer"].to_numpy(np.int64), heads["head"].to_numpy(np.int64)], axis=1)
    rows = np.lexsort(keys.T[::-1])  # by site, then layer, then head (np.unique(axis=0) took 1.2 ms here)
    ordered = keys[rows]
    first = np.ones(len(rows), dtype=bool)  # each head's first row in that order
    first[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    row_head = np.empty(len(rows), dtype=np.int64)
    row_head[rows] = np.cumsum(first) - 1
    return [(str(kinds[by_site[r]]), int(layer), int(head)) for r, layer, head in ordered[first]], row_head


def every_head(heads: pd.DataFrame) -> list[str]:
    """The `head_id` of every head in a heads table: encoder, decoder, cross, then by layer and head."""
    return [head_id(*h) for h in _heads_in_order(heads)[0]]


def opening_head(heads: pd.DataFrame, statistic: str | None, named: tuple[str, int, int] | None = None) -> str:
    """The `head_id` the page opens on: ``named`` (kind, layer, head: the card's) when the table has it, else the
    head with the highest ``statistic`` at the last record, a cross-attention head where there are (where the
    decoder looks: the alignment forming); the first head when there is no statistic (None) to rank them by."""
    if named is not None and head_id(*named) in every_head(heads):
        return head_id(*named)
    if statistic is None:
        return every_head(heads)[0]
    step, value = heads["step"].to_numpy(), heads[statistic].to_numpy(np.float64)
    cross = heads["kind"].to_numpy() == "cross"
    candidates = (step == step.max()) & ~np.isnan(value)  # the last record's defined values
    if (candidates & cross).any():
        candidates &= cross
    if not candidates.any():
        return every_head(heads)[0]
    best = heads.iloc[np.flatnonzero(candidates)[np.argmax(value[candidates])]]  # the first row of the highest
    return head_id(best["kind"], best["layer"], best["head"])


@dataclass(frozen=True)
class HeadLines:
    """One statistic of every head over the records: one line per head."""

    statistic: str
    steps: np.ndarray  # (N,) the records' steps
    heads: list[tuple[str, int, int]]  # (kind, layer, head) of each line, in the order of `SITES`, layer, head
    values: np.ndarray  # (n_heads, N) float64; NaN where the statistic is undefined for the head (or unrecorded)

    @property
    def ids(self) -> list[str]:
        return [head_id(*h) for h in self.heads]


def head_lines(heads: pd.DataFrame, statistic: str, steps: Sequence[int]) -> HeadLines:
    """``statistic`` of every head at every record of ``steps``, from a heads table (one row per step, kind,
    layer, head). Heads whose statistic is undefined at every record (NaN: the mean distance of a cross-attention
    head) are left out."""
    if statistic not in statistics_of(heads):
        raise ValueError(f"the history records no statistic {statistic!r}; it has {', '.join(statistics_of(heads))}")
    steps = np.asarray(steps)
    order, row_head = _heads_in_order(heads)
    recorded, row_step = np.unique(heads["step"].to_numpy(np.int64), return_inverse=True)
    # The mean of a head's defined values at each recorded step (a step recorded twice: their mean).
    value = heads[statistic].to_numpy(np.float64)
    defined = ~np.isnan(value)
    at = (row_head[defined], row_step.reshape(-1)[defined])
    sums, counts = np.zeros((len(order), len(recorded))), np.zeros((len(order), len(recorded)))
    np.add.at(sums, at, value[defined])
    np.add.at(counts, at, 1)
    means = np.divide(sums, counts, out=np.full_like(sums, np.nan), where=counts > 0)
    # ... at the steps asked for, NaN at one not recorded
    column = np.searchsorted(recorded, steps)
    found = column < len(recorded)
    found[found] = recorded[column[found]] == steps[found]
    values = np.full((len(order), len(steps)), np.nan)
    values[:, found] = means[:, column[found]]
    keep = ~np.all(np.isnan(values), axis=1)
    kept = [h for h, ok in zip(order, keep, strict=True) if ok]
    return HeadLines(statistic, steps, kept, values[keep])


def probe_maps(maps: dict[str, np.ndarray], site: str, record: int) -> np.ndarray:
    """(L, H, Q, K) float32: one probe's maps of ``site`` at record ``record`` (recorded in float16)."""
    if site not in maps:
        raise ValueError(f"the probe has no {site} maps; it has {', '.join(maps)}")
    return np.asarray(maps[site][record], dtype=np.float32)


def probe_labels(src_tokens: Sequence[str] | None, tgt_tokens: Sequence[str], site: str) -> tuple[list[str], list[str]]:
    """(row labels, column tokens) of a probe's ``site`` maps: rows are queries, columns keys.

    Decoder rows are named by the token they read and the one they write ("a → b"), as on every page; a
    language model's (no ``src_tokens``) last row writes what follows the probe, "…".
    """
    if site == "encoder":
        if src_tokens is None:
            raise ValueError("a language model's probe has no encoder maps")
        return list(src_tokens), list(src_tokens)
    rows = writing_labels(list(tgt_tokens), written(tuple(tgt_tokens), False, src_tokens is None))
    if site == "cross":
        if src_tokens is None:
            raise ValueError("a language model's probe has no cross-attention maps")
        return rows, list(src_tokens)
    return rows, list(tgt_tokens)


@dataclass(frozen=True)
class PhaseChange:
    """The phase change of a language model on one step axis (Olsson et al., 2022)."""

    steps: np.ndarray  # (N,)
    loss: np.ndarray  # (N,) the held-out loss (the train loss where none was recorded)
    loss_name: str
    previous: np.ndarray  # (N,) the previous-token score of the previous-token head
    induction: np.ndarray  # (N,) the induction score of the induction head
    previous_head: tuple[int, int]  # (layer, head)
    induction_head: tuple[int, int]
    drop: tuple[int, int]  # (first step, last step) of the loss's drop


def phase_change(
    steps: Sequence[int],
    train_loss: Sequence[float],
    heldout_loss: Sequence[float],
    heads: pd.DataFrame,
    drop: tuple[int, int],
    previous_head: tuple[int, int] | None = None,
    induction_head: tuple[int, int] | None = None,
) -> PhaseChange:
    """The loss, the previous-token head's ``previous`` score and the induction head's ``induction`` score per record.

    The heads are the ones given (the card's), else the decoder heads with the highest score at the last record;
    ``drop`` is the loss drop (`attnviz.training.loss_drop`).
    """
    for needed in (PREVIOUS, INDUCTION):
        if needed not in heads.columns:
            raise ValueError(f"the history records no {needed!r} score: no phase change to show")
    steps = np.asarray(steps)
    previous_head = previous_head or best_head(heads, PREVIOUS, "decoder")
    induction_head = induction_head or best_head(heads, INDUCTION, "decoder")

    def score(statistic: str, layer_head: tuple[int, int]) -> np.ndarray:
        one = heads[(heads["kind"] == "decoder") & (heads["layer"] == layer_head[0]) & (heads["head"] == layer_head[1])]
        if one.empty:
            raise ValueError(f"the history has no decoder layer {layer_head[0]}, head {layer_head[1]}")
        return one.set_index("step")[statistic].reindex(steps).to_numpy(dtype=np.float64)

    heldout = np.asarray(heldout_loss, dtype=np.float64)
    use_heldout = heldout.size == steps.size and not np.all(np.isnan(heldout))
    return PhaseChange(
        steps=steps,
        loss=heldout if use_heldout else np.asarray(train_loss, dtype=np.float64),
        loss_name="held-out loss" if use_heldout else "train loss",
        previous=score(PREVIOUS, previous_head),
        induction=score(INDUCTION, induction_head),
        previous_head=tuple(previous_head),
        induction_head=tuple(induction_head),
        drop=(int(drop[0]), int(drop[1])),
    )
