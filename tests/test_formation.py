"""How attention forms, without Streamlit: the lesson's reading of a history and the figures drawn from it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from attnviz.figures.common import HIGHLIGHT
from attnviz.figures.formation import loss_curves, phase_change_figure, statistic_lines
from attnviz.lessons import formation

STEPS = np.array([0, 100, 250, 400])


def heads_table(seed: int = 0) -> pd.DataFrame:
    """A heads table of an encoder-decoder model (2 layers, 2 heads per site) with random statistics; the cross
    heads have no mean distance (NaN), as in the atlas. Rows are shuffled: nothing may rely on their order."""
    rng = np.random.default_rng(seed)
    rows = [
        {"step": step, "kind": kind, "layer": layer, "head": head}
        for step in STEPS
        for kind in ("cross", "encoder", "decoder")
        for layer in (1, 2)
        for head in (1, 2)
    ]
    table = pd.DataFrame(rows)
    table["entropy"] = rng.random(len(table))
    table["previous"] = rng.random(len(table))
    table["induction"] = rng.random(len(table))
    table["anti_diagonal"] = np.where(table["kind"] == "cross", rng.random(len(table)), np.nan)
    table["mean_distance"] = np.where(table["kind"] == "cross", np.nan, rng.random(len(table)))
    return table.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def test_nearest_record_matches_a_search_by_hand():
    rng = np.random.default_rng(1)
    for wanted in rng.uniform(-100, 600, size=200).tolist() + [175.0, 325.0, 0, 400]:
        distances = [abs(s - wanted) for s in STEPS]
        expected = distances.index(min(distances))  # the first of the nearest: the earlier record on a tie
        assert formation.nearest_record(STEPS, wanted) == expected, wanted
    with pytest.raises(ValueError, match="no record"):
        formation.nearest_record([], 3)


def test_head_lines_hold_each_heads_statistic_step_by_step():
    table = heads_table()
    lines = formation.head_lines(table, "entropy", STEPS)
    assert lines.heads[0] == ("encoder", 1, 1) and lines.heads[-1] == ("cross", 2, 2), "encoder, decoder, cross order"
    assert len(lines.heads) == 12 and lines.values.shape == (12, len(STEPS))
    for (kind, layer, head), row in zip(lines.heads, lines.values, strict=True):
        for step, value in zip(STEPS, row, strict=True):
            (expected,) = [
                r["entropy"]
                for _, r in table.iterrows()
                if (r["kind"], r["layer"], r["head"], r["step"]) == (kind, layer, head, step)
            ]
            assert value == expected
    assert lines.ids[0] == "encoder-L1-H1"


def test_head_lines_leave_out_heads_where_the_statistic_is_undefined():
    lines = formation.head_lines(heads_table(), "mean_distance", STEPS)
    assert {kind for kind, _, _ in lines.heads} == {"encoder", "decoder"}
    lines = formation.head_lines(heads_table(), "anti_diagonal", STEPS)
    assert {kind for kind, _, _ in lines.heads} == {"cross"}
    with pytest.raises(ValueError, match="no statistic 'bos'"):
        formation.head_lines(heads_table(), "bos", STEPS)


def pivoted_lines(heads: pd.DataFrame, statistic: str, steps) -> tuple[list[tuple[str, int, int]], np.ndarray]:
    """The reference: pandas' pivot table of the statistic (the mean at a step recorded twice), its columns the
    steps asked for, its rows sorted by site, layer and head, those with no defined value left out."""
    table = heads.pivot_table(index=["kind", "layer", "head"], columns="step", values=statistic, dropna=False)
    table = table.reindex(columns=list(steps))
    order = sorted(table.index, key=lambda k: (formation.SITES.index(k[0]), k[1], k[2]))
    values = table.loc[order].to_numpy(dtype=np.float64)
    keep = ~np.all(np.isnan(values), axis=1)
    return [(str(k), int(la), int(h)) for (k, la, h), ok in zip(order, keep, strict=True) if ok], values[keep]


def shipped_heads() -> list[pd.DataFrame]:
    from attnviz.checkpoints.catalog import pretrained_dir
    from attnviz.training.history import load_history

    return [load_history(folder).heads for folder in sorted(pretrained_dir().glob("*/history"))]


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_head_lines_and_every_head_agree_with_a_pivot_table():
    """On the shipped models' histories (every statistic, every record) and on tables with what they lack: steps
    asked for that were never recorded, in another order, a step recorded twice, and layers past 9."""
    wide = heads_table(3)
    wide["layer"] = wide["layer"] * 6  # layers 6 and 12: 12 sorts after 6 as a number, before it as text
    again = heads_table(4)
    again = pd.concat([again, again[again["step"] == 100].assign(entropy=lambda t: t["entropy"] + 0.25)])
    cases = [
        (table, statistic, sorted(table["step"].unique()))
        for table in shipped_heads()
        for statistic in formation.statistics_of(table)
    ]
    assert len(cases) >= 3 * 8, "the shipped histories were read"
    cases += [
        (wide, "entropy", [400, 0, 50, 250]),  # out of order, 50 never recorded
        (heads_table(5), "mean_distance", [7, 9]),  # none recorded: every line left out
        (again, "entropy", list(STEPS)),
    ]
    for table, statistic, steps in cases:
        lines = formation.head_lines(table, statistic, steps)
        heads, values = pivoted_lines(table, statistic, steps)
        assert lines.heads == heads, statistic
        np.testing.assert_allclose(lines.values, values.reshape(len(heads), len(steps)), rtol=1e-15, atol=0)
        expected = sorted(
            {(str(k), int(la), int(h)) for k, la, h in table[["kind", "layer", "head"]].to_numpy()},
            key=lambda k: (formation.SITES.index(k[0]), k[1], k[2]),
        )
        assert formation.every_head(table) == [formation.head_id(*h) for h in expected]
    assert not formation.head_lines(heads_table(5), "mean_distance", [7, 9]).heads


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_the_opening_head_is_the_one_a_sorted_table_puts_first():
    """On the shipped histories, for every statistic: the highest at the last record, a cross-attention head where
    there are, the first row of the highest on a tie, as a stable sort of the table puts it."""
    tied = heads_table(6).assign(previous=0.5)  # every head tied: the first row of the last record's cross heads
    cases = [(table, statistic) for table in [*shipped_heads(), tied] for statistic in formation.statistics_of(table)]
    for table, statistic in cases:
        last = table[table["step"] == table["step"].max()].dropna(subset=[statistic])
        if (last["kind"] == "cross").any():
            last = last[last["kind"] == "cross"]
        if last.empty:
            expected = formation.every_head(table)[0]
        else:
            best = last.sort_values(statistic, ascending=False, kind="stable").iloc[0]
            expected = formation.head_id(best["kind"], best["layer"], best["head"])
        assert formation.opening_head(table, statistic) == expected, statistic


def test_the_statistics_come_in_the_atlas_order_then_the_others():
    assert formation.statistics_of(heads_table()) == [
        "entropy",
        "mean_distance",
        "previous",
        "anti_diagonal",
        "induction",
    ]


def test_a_statistic_with_no_value_recorded_is_not_offered():
    """A statistic NaN for every head at every record had been offered, and its chart drawn empty."""
    table = heads_table().assign(previous=np.nan, confidence=np.nan)
    assert formation.statistics_of(table) == ["entropy", "mean_distance", "anti_diagonal", "induction"]
    assert formation.unmeasured(table) == ["confidence", "previous"]
    assert formation.unmeasured(heads_table()) == [], "NaN for some kinds of head only (mean_distance): measured"
    nothing = table.assign(entropy=np.nan, induction=np.nan, anti_diagonal=np.nan, mean_distance=np.nan)
    assert formation.statistics_of(nothing) == []
    assert formation.opening_head(nothing, None) == formation.every_head(nothing)[0] == "encoder-L1-H1"
    assert formation.opening_head(nothing, None, ("decoder", 2, 1)) == "decoder-L2-H1"


def test_the_opening_statistic_and_head():
    table = heads_table()
    assert formation.opening_statistic(table, "encoder-decoder", "reverse") == "anti_diagonal"
    assert formation.opening_statistic(table, "language model", "induction") == "induction"
    assert formation.opening_statistic(table, "encoder-decoder", "en-de") == "entropy", "no confidence: the first"
    assert formation.opening_statistic(table.assign(confidence=0.5), "encoder-decoder", "en-de") == "confidence"
    last = table[(table["step"] == STEPS[-1]) & (table["kind"] == "cross")]
    best = last.loc[last["previous"].idxmax()]
    assert formation.opening_head(table, "previous") == formation.head_id("cross", best["layer"], best["head"])
    assert formation.opening_head(table, "previous", ("decoder", 2, 1)) == "decoder-L2-H1", "the card's head first"
    assert formation.opening_head(table, "previous", ("decoder", 9, 1)) != "decoder-L9-H1", "one the model lacks"


def test_head_ids_read_back_and_bad_ones_are_refused():
    for head in [("encoder", 1, 1), ("cross", 12, 16), ("decoder", 3, 2)]:
        assert formation.parse_head(formation.head_id(*head)) == head
    for bad in ["cross-2-3", "self-L1-H1", "cross-L2", "cross-Lx-H1", "cross-L1-H-1"]:
        with pytest.raises(ValueError, match="names no head"):
            formation.parse_head(bad)


def test_probe_labels_name_rows_by_what_they_read_and_write():
    src, tgt = ["▁a", "▁b", "</s>"], ["<s>", "▁b", "▁a"]
    rows, columns = formation.probe_labels(src, tgt, "cross")
    assert rows == ["<s> → ▁b", "▁b → ▁a", "▁a → </s>"] and columns == src, "target rows by source columns"
    assert formation.probe_labels(src, tgt, "encoder") == (src, src)
    rows, columns = formation.probe_labels(None, tgt, "decoder")
    assert rows[-1] == "▁a → …" and columns == tgt, "a language model's last row writes what follows"
    with pytest.raises(ValueError, match="no encoder"):
        formation.probe_labels(None, tgt, "encoder")


def test_probe_maps_are_one_records_maps_as_float32():
    maps = {"decoder": np.random.default_rng(0).random((4, 2, 3, 5, 5)).astype(np.float16)}
    one = formation.probe_maps(maps, "decoder", 2)
    assert one.dtype == np.float32 and one.shape == (2, 3, 5, 5)
    np.testing.assert_array_equal(one, maps["decoder"][2].astype(np.float32))
    with pytest.raises(ValueError, match="no cross maps"):
        formation.probe_maps(maps, "cross", 0)


def test_the_phase_change_reads_the_named_heads_or_the_strongest():
    table = heads_table()
    train, heldout = np.array([3.3, 3.1, 2.0, 1.8]), np.array([3.4, 3.2, 2.1, 1.9])
    change = formation.phase_change(STEPS, train, heldout, table, (100, 250), (1, 2), (2, 1))
    for values, statistic, (layer, head) in (
        (change.previous, "previous", (1, 2)),
        (change.induction, "induction", (2, 1)),
    ):
        for step, value in zip(STEPS, values, strict=True):
            row = table[(table["kind"] == "decoder") & (table["layer"] == layer) & (table["head"] == head)]
            assert value == row[row["step"] == step][statistic].item()
    np.testing.assert_array_equal(change.loss, heldout)
    assert change.loss_name == "held-out loss" and change.drop == (100, 250)
    found = formation.phase_change(STEPS, train, np.full(4, np.nan), table, (100, 250))
    last = table[(table["step"] == STEPS[-1]) & (table["kind"] == "decoder")]
    strongest = last.loc[last["induction"].idxmax()]
    assert found.induction_head == (strongest["layer"], strongest["head"])
    assert found.loss_name == "train loss", "no held-out loss recorded: the train loss"
    with pytest.raises(ValueError, match="no 'induction' score"):
        formation.phase_change(STEPS, train, heldout, table.drop(columns="induction"), (100, 250))


def test_the_statistic_lines_draw_one_line_per_head_the_chosen_one_red_and_on_top():
    lines = formation.head_lines(heads_table(), "entropy", STEPS)
    chosen = "decoder-L2-H1"
    fig = statistic_lines(STEPS, lines.values, lines.heads, lines.ids, "entropy", step=250, selected=chosen)
    assert len(fig.data) == len(lines.heads)
    last = fig.data[-1]
    assert set(last.customdata) == {chosen} and last.line.color == HIGHLIGHT, "the chosen head is drawn last, red"
    drawn = [trace.marker.opacity != 0 and not trace.marker.maxdisplayed for trace in fig.data]
    assert drawn == [False] * (len(fig.data) - 1) + [True], "the chosen head's records are marked, no other's"
    assert {trace.mode for trace in fig.data} == {"lines+markers"}, "every line's points can be clicked (selected)"
    for trace in fig.data:
        (head,) = set(trace.customdata)  # every point of a line names its head: a click picks it
        np.testing.assert_array_equal(trace.y, lines.values[lines.ids.index(head)])
    assert [s.x0 for s in fig.layout.shapes if s.type == "line"] == [250], "the step shown is marked"
    with pytest.raises(ValueError, match="values must be"):
        statistic_lines(STEPS, lines.values[:3], lines.heads, lines.ids, "entropy")


def test_the_loss_curves_mark_the_step_and_shade_the_drop():
    fig = loss_curves(STEPS, [3, 2.5, 2, 1.9], [3.1, 2.6, 2.1, 2.0], step=100, drop=(100, 250))
    assert [t.name for t in fig.data] == ["train loss", "held-out loss"]
    assert [(s.type, s.x0, s.x1) for s in fig.layout.shapes] == [("rect", 100, 250), ("line", 100, 100)]
    assert len(loss_curves(STEPS, [3, 2, 1, 1], None).data) == 1
    with pytest.raises(ValueError, match="3 values for 4 steps"):
        loss_curves(STEPS, [3, 2, 1], None)


def test_the_phase_change_figure_puts_loss_and_scores_on_one_step_axis():
    fig = phase_change_figure(
        STEPS, [3, 2.5, 2, 1.9], [0, 0.5, 0.9, 0.9], [0, 0.1, 0.8, 0.9], (100, 250), (1, 1), (2, 2)
    )
    assert isinstance(fig, go.Figure) and len(fig.data) == 3
    assert fig.data[0].yaxis == "y" and {t.yaxis for t in fig.data[1:]} == {"y2"}, "scores on their own 0..1 axis"
    assert {t.xaxis for t in fig.data} == {"x"}, "one step axis"
    assert "layer 1 head 1" in fig.data[1].name and "layer 2 head 2" in fig.data[2].name
    assert [(s.x0, s.x1) for s in fig.layout.shapes if s.type == "rect"] == [(100, 250)]


def test_a_history_of_other_heads_than_the_models_is_named_as_anothers():
    """A folder holding another training's history had its maps drawn under the model's name, or failed the page
    on a head its card names and the history lacks (a 1-layer, 2-head induction history beside a 2 x 4 model)."""
    from attnviz.config import TransformerConfig

    lm = TransformerConfig(
        src_vocab_size=10, tgt_vocab_size=10, n_enc_layers=0, n_dec_layers=2, d_model=16, n_heads=4, d_ff=8
    )
    translator = TransformerConfig(
        src_vocab_size=10, tgt_vocab_size=10, n_enc_layers=2, n_dec_layers=2, d_model=16, n_heads=4, d_ff=8
    )

    def heads(sites, layers, n_heads):
        rows = [(0, s, la, h) for s in sites for la in range(1, layers + 1) for h in range(1, n_heads + 1)]
        return pd.DataFrame(rows, columns=["step", "kind", "layer", "head"])

    assert formation.history_mismatch("language model", heads(["decoder"], 2, 4), lm) is None
    assert formation.history_mismatch("encoder-decoder", heads(formation.SITES, 2, 4), translator) is None
    assert formation.history_mismatch("language model", heads(["decoder"], 1, 2), lm) == (
        "its history records decoder self-attention (masked) in 1 layer of 2 heads, and the model has 2 layers of "
        "4 heads"
    )
    assert formation.history_mismatch("encoder-decoder", heads(formation.SITES, 2, 4), lm) == (
        "its history is an encoder-decoder's training, and the model is a language model"
    )
    assert "cross-attention" in formation.history_mismatch("encoder-decoder", heads(["cross"], 3, 4), translator)
