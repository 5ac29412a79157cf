"""When a head formed, read off a training's history: the criteria the model cards state.

Plain numpy and pandas over a [`History`][attnviz.training.history.History]; the page "How attention
forms" and the cards call the same functions.

- `formation_step`: the first recorded step at which a head's statistic reaches a threshold
  (0.5 by default): the anti-diagonal share of ``reverse``'s cross head, the confidence of
  ``en-de``'s cross head, the previous-token and induction scores of ``induction``'s heads;
- `loss_drop`: the steps over which the held-out loss falls from 10% to 90% of its total drop
  (from its first record to its lowest);
- `rise`: the same window for a head's statistic, from its first record to its highest.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnviz.training.history import History

THRESHOLD = 0.5
# The statistic by which each shipped task's characteristic head is chosen and said to have formed, and its site.
CRITERIA = {
    "reverse": ("anti_diagonal", "cross"),
    "en-de": ("confidence", "cross"),
}
LM_CRITERIA = {"previous-token": ("previous", "decoder"), "induction": ("induction", "decoder")}


def head_series(history: History, statistic: str, site: str, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one head's ``statistic`` over the history's records; layer and head count from 1."""
    if statistic not in history.heads.columns:
        raise ValueError(f"the history has no statistic {statistic!r}; it has {', '.join(history.statistics)}")
    rows = history.heads[
        (history.heads["kind"] == site) & (history.heads["layer"] == layer) & (history.heads["head"] == head)
    ].sort_values("step")
    if rows.empty:
        raise ValueError(f"the history has no {site} head {layer}.{head}")
    return rows["step"].to_numpy(np.int64), rows[statistic].to_numpy(np.float64)


def formation_step(
    history: History, statistic: str, site: str, layer: int, head: int, threshold: float = THRESHOLD
) -> int | None:
    """The first recorded step at which the head's ``statistic`` is at least ``threshold``; None if it never is."""
    steps, values = head_series(history, statistic, site, layer, head)
    reached = np.flatnonzero(values >= threshold)
    return int(steps[reached[0]]) if reached.size else None


def _window(steps: np.ndarray, progress: np.ndarray, low: float, high: float) -> tuple[int, int]:
    """The first steps at which ``progress`` (0 at the start, 1 at the end) reaches ``low`` and ``high``."""
    first = np.flatnonzero(progress >= low)
    last = np.flatnonzero(progress >= high)
    return int(steps[first[0]]), int(steps[last[0]])


def loss_drop(history: History, low: float = 0.1, high: float = 0.9) -> tuple[int, int]:
    """(start, end): the first recorded steps at which the held-out loss has fallen by ``low`` and by ``high``
    of its total drop, from its first record to its lowest (by default 10% and 90%)."""
    loss = history.heldout_loss
    drop = loss[0] - loss.min()
    if not drop > 0:
        return int(history.step[0]), int(history.step[0])
    return _window(history.step, (loss[0] - loss) / drop, low, high)


def rise(history: History, statistic: str, site: str, layer: int, head: int, low: float = 0.1, high: float = 0.9):
    """(start, end): the first recorded steps at which the head's ``statistic`` has risen by ``low`` and by
    ``high`` of its total rise, from its first record to its highest."""
    steps, values = head_series(history, statistic, site, layer, head)
    gain = np.nanmax(values) - values[0]
    if not gain > 0:
        return int(steps[0]), int(steps[0])
    return _window(steps, (values - values[0]) / gain, low, high)


def best_head(heads: pd.DataFrame, statistic: str, kind: str, at_step: int | None = None) -> tuple[int, int]:
    """(layer, head), from 1: the head of ``kind`` in a history's ``heads`` table whose ``statistic`` is
    highest at ``at_step`` (default: the last record that has it); ties go to the first layer and head."""
    rows = heads[(heads["kind"] == kind) & heads[statistic].notna()]
    if rows.empty:
        raise ValueError(f"no {kind} head has a recorded {statistic!r}")
    step = rows["step"].max() if at_step is None else at_step
    best = rows[rows["step"] == step].sort_values([statistic, "layer", "head"], ascending=[False, True, True]).iloc[0]
    return int(best["layer"]), int(best["head"])


def characteristic_head(history: History, statistic: str, site: str) -> tuple[int, int]:
    """(layer, head), from 1: the head of ``site`` whose ``statistic`` is highest at the last record."""
    return best_head(history.heads, statistic, site)


def history_bytes(history: History) -> int:
    """The bytes of the history's files on disk (its manifest and every record)."""
    return sum(p.stat().st_size for p in history.folder.rglob("*") if p.is_file())


DESCRIBE = {
    "anti_diagonal": "anti-diagonal share (its mean weight on the mirrored source position, the letter it copies)",
    "confidence": "confidence (its largest weight per target row, averaged: each German piece looks at one English "
    "piece)",
    "previous": "previous-token score (its mean weight on the token before the query)",
    "induction": "induction score (on repeated random tokens, its weight on the token after the current token's "
    "earlier occurrence)",
}


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def _intro(history: History) -> str:
    every = history.manifest.get("every")
    return (
        f"The training's history (`history/`, read with `attnviz.load_history` or `attnviz history`) holds "
        f"{len(history.step)} records (every {every} steps and the last; {_size(history_bytes(history))}): the "
        f"losses, every head's statistics on fixed held-out texts, and the full maps of {len(history.probes)} "
        "probe texts in float16."
    )


def _when(step: int | None) -> str:
    return f"step **{step}**" if step is not None else "no recorded step (it stays under the threshold)"


def seq2seq_section(history: History) -> str:
    """The card's paragraph on formation for an encoder-decoder task of `CRITERIA` ("" for another task)."""
    if history.task not in CRITERIA:
        return ""
    statistic, site = CRITERIA[history.task]
    layer, head = characteristic_head(history, statistic, site)
    step = formation_step(history, statistic, site, layer, head)
    _, values = head_series(history, statistic, site, layer, head)
    start, end = loss_drop(history)
    return f"""
**Formation.** {_intro(history)} The characteristic head is **{site} layer {layer} head {head}**, the
{site} head whose {DESCRIBE[statistic]} is highest at the last step ({values[-1]:.3f}). Criterion: it formed
at the first record where that value reaches {THRESHOLD}: {_when(step)}. The held-out loss fell from 10% to
90% of its total drop between steps {start} and {end}.
"""


def lm_section(history: History, heads: dict[str, tuple[int, int]]) -> str:
    """The card's paragraph on the phase change for a language model, with its named ``heads`` (layer, head)."""
    start, end = loss_drop(history)
    lines, formed = [], {}
    for role in ("previous-token", "induction"):
        statistic, site = LM_CRITERIA[role]
        layer, head = heads[role]
        formed[role] = formation_step(history, statistic, site, layer, head)
        a, b = rise(history, statistic, site, layer, head)
        lines.append(
            f"- the {role} head, layer {layer} head {head}: its {DESCRIBE[statistic]} first reaches {THRESHOLD} at "
            f"{_when(formed[role])}; it rose from 10% to 90% of its total rise between steps {a} and {b};"
        )
    prev, ind = formed["previous-token"], formed["induction"]
    if prev is None or ind is None:
        order = "One of the two heads never reached 0.5, so no order is stated."
    elif prev < ind:
        order = f"The previous-token head formed first (step {prev}), then the induction head (step {ind})."
    elif prev > ind:
        order = f"The induction head reached 0.5 first (step {ind}), before the previous-token head (step {prev})."
    else:
        order = f"Both heads reached 0.5 at the same record (step {ind})."
    if ind is None:
        verdict = "The induction head never formed by this criterion, so its formation is not placed in the loss drop."
    elif start <= ind <= end:
        verdict = f"The induction head's formation (step {ind}) **falls inside** the loss drop, as Olsson et al. found."
    else:
        verdict = (
            f"The induction head's formation (step {ind}) **does not fall inside** the loss drop (Olsson et al., 2022, "
            "found it inside)."
        )
    return f"""
**The phase change, measured.** {_intro(history)} The loss drop is the window of steps in which the
held-out loss falls from 10% to 90% of its total drop (from its first record to its lowest): steps
**{start} to {end}**.

{chr(10).join(lines)}

{verdict} {order}
"""
