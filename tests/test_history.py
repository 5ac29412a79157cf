"""A training's history (attnviz.training.history): recorded maps and statistics equal a checkpoint's at that
step, recording leaves the training unchanged, resuming keeps records, torn and hostile folders, the CLI."""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from contextlib import nullcontext
from dataclasses import asdict, replace

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

import attnviz
from attnviz.atlas import compute_atlas
from attnviz.atlas.stats import STATISTICS
from attnviz.cli import main
from attnviz.errors import InputError
from attnviz.training import History, HistoryWriter, formation_step, load_history, loop, loss_drop, seq2seq
from attnviz.training.data import get_task
from attnviz.training.formation import rise
from attnviz.training.history import FORMAT_VERSION, HISTORY, MANIFEST, MAPS, RECORDS
from attnviz.training.loop import STATE_FILE, train
from attnviz.training.recipes import RECIPES
from attnviz.training.recording import STATISTICS_PROBES, STATISTICS_SEED, anti_diagonal_share

TINY = dict(d_model=16, n_layers=1, n_heads=2, d_ff=32, batch_size=8, warmup=10, eval_n=10)
SEQ2SEQ = dict(TINY, spm_sentences=200)


def _train(out, task="reverse", steps=6, every=2, **kw):
    recipe = SEQ2SEQ if task != "induction" else TINY
    torch.set_num_threads(1)
    return train(task, out, steps=steps, history_every=every, **{**recipe, **kw})


@pytest.fixture(scope="module")
def reverse_runs(tmp_path_factory):
    """Six steps recorded every two; the same four steps (a checkpoint at step 4); six steps unrecorded."""
    root = tmp_path_factory.mktemp("reverse")
    _train(root / "recorded")
    _train(root / "four", steps=4, every=0)
    _train(root / "plain", every=0)
    return root


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "run"
    _train(out, task="induction", steps=4, every=2)
    return out


def _maps(bundle, src: str, tgt: str | None) -> dict[str, np.ndarray]:
    tok = bundle.tokenizer
    with torch.no_grad():
        if bundle.config.decoder_only:
            ids = torch.tensor([tok.encode_source(src).ids])
            attn = bundle.model(None, ids, return_attention=True, return_logits=False).attention
            return {"decoder": attn.stacked("decoder")[:, 0].numpy()}
        s = torch.tensor([tok.encode_source(src).ids])
        t = torch.tensor([tok.encode_target(tgt)[0].ids])
        attn = bundle.model(s, t, return_attention=True, return_logits=False).attention
        return {kind: attn.stacked(kind)[:, 0].numpy() for kind in ("encoder", "decoder", "cross")}


@pytest.mark.slow
def test_recorded_maps_equal_a_checkpoint_saved_at_that_step(reverse_runs):
    history = load_history(reverse_runs / "recorded")
    assert history.step.tolist() == [2, 4, 6]
    for folder, step in ((reverse_runs / "four", 4), (reverse_runs / "recorded", 6)):
        bundle = attnviz.load(str(folder), device="cpu")
        index = history.step.tolist().index(step)
        for probe in history.probes:
            for site, maps in _maps(bundle, probe.text, probe.target).items():
                recorded = probe.maps[site][index]
                assert recorded.dtype == np.float16 and recorded.shape == maps.shape
                np.testing.assert_allclose(recorded.astype(np.float32), maps, atol=1e-3, rtol=0)
        # another step's maps differ from this checkpoint's: the comparison can fail
        probe = history.probes[0]
        earlier = probe.maps["cross"][history.step.tolist().index(2)].astype(np.float32)
        assert not np.allclose(earlier, _maps(bundle, probe.text, probe.target)["cross"], atol=1e-3)


@pytest.mark.slow
def test_recorded_statistics_equal_the_atlas_on_the_same_model(reverse_runs):
    history = load_history(reverse_runs / "recorded")
    bundle = attnviz.load(str(reverse_runs / "four"), device="cpu")
    pairs = get_task("reverse").pairs(STATISTICS_PROBES, STATISTICS_SEED, "heldout")
    atlas = compute_atlas(bundle, [s for s, _ in pairs], [t for _, t in pairs]).heads
    recorded = history.heads[history.heads["step"] == 4].reset_index(drop=True)
    assert list(recorded[["kind", "layer", "head"]].itertuples(index=False)) == list(
        atlas[["kind", "layer", "head"]].itertuples(index=False)
    )
    np.testing.assert_allclose(
        recorded[list(STATISTICS)].to_numpy(float), atlas[list(STATISTICS)].to_numpy(float), atol=1e-6, equal_nan=True
    )
    assert recorded["anti_diagonal"].notna().sum() == (recorded["kind"] == "cross").sum() > 0


@pytest.mark.slow
def test_recording_does_not_change_the_training(reverse_runs):
    recorded = (reverse_runs / "recorded" / "model.safetensors").read_bytes()
    assert recorded == (reverse_runs / "plain" / "model.safetensors").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("resumed_with", ["the same flag", "no flag", "no flag, a state saved without it"])
def test_resuming_keeps_the_records_and_writes_none_twice(tmp_path, reverse_runs, resumed_with, capsys):
    out = tmp_path / "run"
    _train(out, steps=4)
    records = out / HISTORY / RECORDS
    before = {p.name: p.stat().st_mtime_ns for p in records.iterdir()}
    assert sorted(before) == ["00000002", "00000004"] and (out / STATE_FILE).is_file()
    if resumed_with.endswith("without it"):  # as saved before the state kept it: the history's manifest says it
        state = torch.load(out / STATE_FILE, weights_only=True)
        del state["history_every"]
        torch.save(state, out / STATE_FILE)
    capsys.readouterr()
    _train(out, steps=6, resume=True, every=2 if resumed_with == "the same flag" else 0)
    said = capsys.readouterr().err
    assert ("a record every 2 steps, as before" in said) == resumed_with.startswith("no flag"), said
    after = {p.name: p.stat().st_mtime_ns for p in records.iterdir()}
    assert sorted(after) == ["00000002", "00000004", "00000006"]
    assert all(after[name] == time for name, time in before.items()), "an earlier record was written again"
    # the resumed training is the uninterrupted one: same weights, same records
    assert (out / "model.safetensors").read_bytes() == (reverse_runs / "recorded" / "model.safetensors").read_bytes()
    resumed, whole = load_history(out), load_history(reverse_runs / "recorded")
    np.testing.assert_array_equal(resumed.heldout_loss, whole.heldout_loss)
    recipes = [
        json.loads((run / HISTORY / "manifest.json").read_text())["recipe"] for run in (out, reverse_runs / "recorded")
    ]
    assert recipes[0] == recipes[1] and recipes[0]["steps"] == 6, "the manifest names the steps run to, not the first 4"
    np.testing.assert_array_equal(resumed.probes[1].maps["cross"], whole.probes[1].maps["cross"])


@pytest.mark.slow
def test_resume_refuses_another_recipe_or_history_interval(tmp_path):
    out = tmp_path / "run"
    _train(out, steps=2)
    with pytest.raises(InputError, match="another recipe"):
        _train(out, steps=4, resume=True, d_ff=64)
    with pytest.raises(InputError, match="records its history every 2 steps: resume with --history-every 2"):
        _train(out, steps=4, resume=True, every=3)
    assert sorted(p.name for p in (out / HISTORY / RECORDS).iterdir()) == ["00000002"]


@pytest.mark.slow
def test_a_run_without_history_may_begin_one_when_resumed(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "STATE_EVERY", 2)  # a run without history saves its state every STATE_EVERY steps
    out = tmp_path / "run"
    _train(out, steps=2, every=0)
    assert not (out / HISTORY).exists() and (out / STATE_FILE).is_file()
    _train(out, steps=4, every=0, resume=True)  # no flag, no history before: none now either
    assert not (out / HISTORY).exists()
    _train(out, steps=6, every=2, resume=True)
    assert load_history(out).step.tolist() == [6]


# ---------------------------------------------------------------------------------------------
# The writer and reader on synthetic records (fast)


def _write(folder, steps=(10, 20, 30), kind="language model", values=None, manifest=None):
    writer = HistoryWriter(
        folder,
        kind,
        "induction",
        [("a b a b", None)],
        manifest or {"every": 10},
        tokens=[(None, ["<s>", "a", "b", "a", "b"])],
    )
    rng = np.random.default_rng(0)
    causal = np.tril(np.ones((5, 5), dtype=bool))  # a language model's decoder sees no later token
    for i, step in enumerate(steps):
        heads = pd.DataFrame(
            {"kind": "decoder", "layer": [1, 1, 2, 2], "head": [1, 2, 1, 2], "induction": [0.1, 0.2, 0.3, 0.4]}
        )
        if values is not None:
            heads["induction"] = values[i]
        loss = 3.0 - i
        weights = rng.random((2, 2, 5, 5)) * causal
        weights /= weights.sum(-1, keepdims=True)
        writer.record(step, loss + 0.1, loss, 1e-3 * (i + 1), [{"decoder": weights}], heads)
    return writer


def test_a_history_round_trips(tmp_path):
    _write(tmp_path)
    history = load_history(tmp_path)  # the --out folder; its history/ folder reads the same
    assert isinstance(history, History) and load_history(tmp_path / HISTORY).step.tolist() == [10, 20, 30]
    assert history.step.dtype == np.int64 and history.heldout_loss.tolist() == [3.0, 2.0, 1.0]
    assert history.probes[0].maps["decoder"].shape == (3, 2, 2, 5, 5)
    assert history.probes[0].maps["decoder"].dtype == np.float16
    assert history.heads.columns.tolist()[:4] == ["step", "kind", "layer", "head"] and len(history.heads) == 12
    assert sorted(history.arrays()) == sorted(
        ["step", "train_loss", "heldout_loss", "p0_tgt_tokens", "p0_decoder", "manifest"]
    )


def test_a_step_is_never_written_twice(tmp_path):
    writer = _write(tmp_path)
    maps = tmp_path / HISTORY / RECORDS / "00000020" / MAPS
    before = maps.read_bytes()
    heads = pd.DataFrame({"kind": "decoder", "layer": [1], "head": [1], "induction": [0.9]})
    assert writer.record(20, 0.0, 0.0, 0.0, [{"decoder": np.zeros((2, 2, 5, 5))}], heads) is False
    assert maps.read_bytes() == before
    resumed = _write(tmp_path, steps=(20, 30, 40))  # a resumed training's writer adds step 40 only
    assert sorted(resumed.steps) == [10, 20, 30, 40] and maps.read_bytes() == before


def test_a_torn_record_is_ignored_and_cleaned(tmp_path):
    _write(tmp_path)
    torn = tmp_path / HISTORY / RECORDS / ".tmp-00000040-999"
    torn.mkdir()
    (torn / "losses.parquet").write_bytes(b"PAR1 half")
    assert load_history(tmp_path).step.tolist() == [10, 20, 30]
    _write(tmp_path, steps=(40,))
    assert not torn.exists() and load_history(tmp_path).step.tolist() == [10, 20, 30, 40]


def test_a_history_of_another_training_is_refused(tmp_path):
    _write(tmp_path)
    with pytest.raises(InputError, match="another training"):
        HistoryWriter(tmp_path, "language model", "induction", [("x y", None)], {})


@pytest.mark.parametrize(
    "damage, message",
    [
        ("no_history", "no training history"),
        ("truncated_maps", "corrupt"),
        ("missing_heads", "incomplete"),
        ("newer_version", "newer attnviz"),
        ("pickled_maps", "not float16"),
        ("wrong_shape", "not float16"),
        ("huge_declared", "over the limit|once decompressed"),
        ("manifest_not_json", "cannot be read"),
        ("manifest_tokens_mismatch", "does not match its tokens"),
        ("linked_maps", "link"),
        ("wrong_step", "one row, of step"),
        ("loss_as_text", "other values than numbers in train_loss"),
        ("statistic_as_text", "other values than numbers in induction"),
        ("layer_out_of_range", "outside the model's 2 layers of 2"),
        ("unknown_kind", "names the kind 'sideways'"),
        ("fractional_layer", "other values than whole numbers"),
        ("head_twice", "more than one row for decoder layer 1 head 1"),
        ("no_heads", "has no row"),
        ("nan_loss", "NaN or infinite loss"),
        ("step_twice", "two records of step 20"),
        ("records_linked", "records folder is a link"),
        ("manifest_huge_integer", "manifest.json cannot be read"),
        ("statistics_a_number", "statistics must be a list of names"),
        ("statistics_lists", "statistics must be a list of names"),
        ("step_not_whole", "numbers its step with other values than a whole number"),
        ("kind_null", "has a row with no kind"),
        ("kind_a_list", "names kinds with other values than text"),
        ("manifest_kind_a_list", "names no known kind of model"),
        ("manifest_nan", "manifest.json holds NaN or Infinity"),
        ("maps_encrypted", "maps.npz cannot be read .*: it is corrupt"),
        ("maps_member_without_npy", "maps.npz holds the member 'p0_decoder', not a name.npy"),
        ("maps_member_twice", "maps.npz holds p0_decoder.npy twice"),
        ("head_missing", "has 3 rows for decoder heads, not one for each of the model's 2 layers of 2"),
        ("layer_null", "has a row with no layer or head"),
        ("statistic_infinite", "holds an infinite value in induction"),
        ("maps_nan", "p0_decoder holds weights outside 0 to 1"),
        ("maps_negative", "p0_decoder holds weights outside 0 to 1"),
        ("maps_over_one", "p0_decoder holds weights outside 0 to 1"),
        ("maps_rows_not_one", "p0_decoder holds rows whose weights do not sum to 1"),
        ("maps_see_later_tokens", "p0_decoder holds weights on later tokens"),
    ],
)
def test_hostile_or_damaged_histories_are_refused_with_a_clear_message(tmp_path, damage, message, monkeypatch):
    _write(tmp_path)
    folder = tmp_path / HISTORY
    record = folder / RECORDS / "00000020"
    manifest = json.loads((folder / MANIFEST).read_text())
    if damage == "no_history":
        shutil.rmtree(folder)
    elif damage == "truncated_maps":
        data = (record / MAPS).read_bytes()
        (record / MAPS).write_bytes(data[: len(data) // 2])
    elif damage == "missing_heads":
        (record / "heads.parquet").unlink()
    elif damage == "newer_version":
        (folder / MANIFEST).write_text(json.dumps({**manifest, "format_version": FORMAT_VERSION + 1}))
    elif damage == "pickled_maps":
        np.savez(record / MAPS, p0_decoder=np.array([{"a": 1}], dtype=object))
    elif damage == "wrong_shape":
        np.savez(record / MAPS, p0_decoder=np.zeros((2, 2, 5, 6), dtype=np.float16))
    elif damage == "huge_declared":
        monkeypatch.setenv("ATTNVIZ_MAX_EXPORT_MB", "0.0001")
    elif damage == "manifest_not_json":
        (folder / MANIFEST).write_text("{not json")
    elif damage == "manifest_tokens_mismatch":
        manifest["probes"][0]["tgt_tokens"] = ["<s>", "a"]
        (folder / MANIFEST).write_text(json.dumps(manifest))
    elif damage == "linked_maps":
        (record / MAPS).unlink()
        os.symlink(folder / RECORDS / "00000010" / MAPS, record / MAPS)
    elif damage == "wrong_step":
        frame = pd.read_parquet(record / "losses.parquet")
        frame["step"] = 99
        frame.to_parquet(record / "losses.parquet", index=False)
    elif damage == "loss_as_text":
        frame = pd.read_parquet(record / "losses.parquet")
        frame["train_loss"] = "x"
        frame.to_parquet(record / "losses.parquet", index=False)
    elif damage == "fractional_layer":
        frame = pd.read_parquet(record / "heads.parquet")
        frame["layer"] = frame["layer"].astype(float) + 0.5
        frame.to_parquet(record / "heads.parquet", index=False)
    elif damage in ("head_twice", "no_heads"):
        frame = pd.read_parquet(record / "heads.parquet")
        frame = pd.concat([frame, frame.iloc[:1]]) if damage == "head_twice" else frame.iloc[:0]
        frame.to_parquet(record / "heads.parquet", index=False)
    elif damage == "nan_loss":
        frame = pd.read_parquet(record / "losses.parquet")
        frame["heldout_loss"] = np.nan
        frame.to_parquet(record / "losses.parquet", index=False)
    elif damage == "step_twice":  # the same step under a longer name
        shutil.copytree(record, folder / RECORDS / "000000020")
    elif damage == "records_linked":  # a visitor's folder whose records lie elsewhere
        shutil.move(folder / RECORDS, tmp_path / "elsewhere")
        os.symlink(tmp_path / "elsewhere", folder / RECORDS)
    elif damage == "manifest_huge_integer":  # json raises a plain ValueError past 4,300 digits
        (folder / MANIFEST).write_text(json.dumps(manifest)[:-1] + ', "every": ' + "9" * 5000 + "}")
    elif damage.startswith("statistics_"):
        manifest["statistics"] = 5 if damage == "statistics_a_number" else [["induction"]]
        (folder / MANIFEST).write_text(json.dumps(manifest))
    elif damage == "step_not_whole":
        frame = pd.read_parquet(record / "losses.parquet")
        frame["step"] = np.nan
        frame.to_parquet(record / "losses.parquet", index=False)
    elif damage.startswith("kind_"):  # a null kind had been averaged into another head by the page
        frame = pd.read_parquet(record / "heads.parquet")
        frame["kind"] = [None, *frame["kind"][1:]] if damage == "kind_null" else [["decoder"]] * len(frame)
        frame.to_parquet(record / "heads.parquet", index=False)
    elif damage == "manifest_kind_a_list":  # `kind not in SITES` had hashed the list: exit 3, unexpected TypeError
        (folder / MANIFEST).write_text(json.dumps({**manifest, "kind": [manifest["kind"]]}))
    elif damage == "manifest_nan":  # the writer refuses NaN: a resumed training had failed on it, the export kept it
        (folder / MANIFEST).write_text(json.dumps({**manifest, "every": float("nan")}))
    elif damage == "maps_encrypted":  # zipfile had raised a RuntimeError: exit 3
        _mark_encrypted(record / MAPS)
    elif damage.startswith("maps_member_"):  # np.load had read a member the header check had not
        other = np.zeros((2, 2, 5, 5), dtype=np.float16)
        other[..., 0] = 1
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, other)
        name = "p0_decoder" if damage == "maps_member_without_npy" else "p0_decoder.npy"
        with zipfile.ZipFile(record / MAPS) as archive:
            valid = archive.read("p0_decoder.npy")
        with pytest.warns(UserWarning, match="Duplicate name") if name == "p0_decoder.npy" else nullcontext():
            with zipfile.ZipFile(record / MAPS, "w") as archive:
                archive.writestr(name, buffer.getvalue())
                archive.writestr("p0_decoder.npy", valid)
    elif damage in ("head_missing", "layer_null", "statistic_infinite"):
        frame = pd.read_parquet(record / "heads.parquet")
        if damage == "head_missing":  # formation_step had answered another step for that head
            frame = frame.iloc[:-1]
        elif damage == "layer_null":  # an empty layer had been exported, every_head had raised a ValueError
            frame["layer"] = pd.array([None, *frame["layer"][1:]], dtype="Int64")
        else:
            frame["induction"] = [np.inf, *frame["induction"][1:]]
        frame.to_parquet(record / "heads.parquet", index=False)
    elif damage.startswith("maps_"):  # weights no softmax gives had been drawn
        with np.load(record / MAPS) as z:
            maps = z["p0_decoder"].copy()
        if damage == "maps_nan":
            maps[0, 0, 2, 0] = np.nan
        elif damage == "maps_negative":
            maps[0, 0, 2, :2] = [-0.5, 1.5]
        elif damage == "maps_over_one":
            maps[0, 0, 2, :3] = [2, -0.5, -0.5]
        elif damage == "maps_rows_not_one":
            maps[1, 1, 3] *= 0.9
        else:
            maps[1, 0, 2] = 0.2
        np.savez_compressed(record / MAPS, p0_decoder=maps)
    else:  # a head's row: a statistic as text, a layer the model lacks, a kind that does not exist
        frame = pd.read_parquet(record / "heads.parquet")
        column, value = {
            "statistic_as_text": ("induction", "0.5"),
            "layer_out_of_range": ("layer", 99),
            "unknown_kind": ("kind", "sideways"),
        }[damage]
        frame[column] = [value] + frame[column].astype(type(value)).tolist()[1:]
        frame.to_parquet(record / "heads.parquet", index=False)
    with pytest.raises(InputError, match=message):
        load_history(tmp_path)


def _mark_encrypted(path):
    """Set the encryption flag of every member of the zip file ``path``, in its local and central headers."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        locals_, central = [info.header_offset for info in archive.infolist()], archive.start_dir
    for offset in locals_:
        data[offset + 6] |= 0x1
    while data[central : central + 4] == b"PK\x01\x02":
        data[central + 8] |= 0x1
        central += 46 + sum(int.from_bytes(data[central + at : central + at + 2], "little") for at in (28, 30, 32))
    path.write_bytes(bytes(data))


def test_the_record_count_is_bounded_before_steps_are_compared(tmp_path, monkeypatch):
    """Two records of one step had been looked for by comparing every pair: 12,000 records took 23 seconds."""
    from attnviz.training import history as history_module

    _write(tmp_path)
    records = tmp_path / HISTORY / RECORDS
    shutil.copytree(records / "00000020", records / "000000020")
    monkeypatch.setattr(history_module, "MAX_RECORDS", 3)
    with pytest.raises(InputError, match="4 records, over the limit of 3"):
        load_history(tmp_path)
    monkeypatch.setattr(history_module, "MAX_RECORDS", 100_000)
    with pytest.raises(InputError, match="two records of step 20"):  # found by counting steps once, not pair by pair
        load_history(tmp_path)


def _widen(frame, n):
    """``frame`` with ``n`` more statistics, all 0."""
    return pd.concat([frame, pd.DataFrame(0.0, index=frame.index, columns=[f"s{i}" for i in range(n)])], axis=1)


@pytest.mark.parametrize("damage", ["columns", "values", "bytes"])
def test_a_table_s_decompressed_size_is_bounded_from_its_metadata(tmp_path, monkeypatch, damage):
    """A small Parquet file had decompressed to any size: 319 columns of 100,000 equal rows (208 kB) to 255 MB."""
    from attnviz.training import history as history_module

    _write(tmp_path)
    path = tmp_path / HISTORY / RECORDS / "00000020" / "heads.parquet"
    frame = pd.read_parquet(path)
    if damage == "columns":
        frame = _widen(frame, 300)
        message = "has 305 columns, over the limit of 256"
    elif damage == "values":  # 100,000 rows of 50 columns, each a run of one value
        frame = _widen(frame.iloc[np.zeros(100_000, dtype=int)].reset_index(drop=True), 45)
        message = "has 100,000 rows of 50 columns, over the limit of 4,000,000 values"
    else:  # a bound this small (real tables are a few kB) stands for a text column of hundreds of MB
        monkeypatch.setattr(history_module, "MAX_TABLE_DECODED_BYTES", 1 << 16)
        frame["kind"] = "decoder" + "x" * 100_000
        message = "decompresses to 0.1 MB, over the limit of 0.0625 MB"
    frame.to_parquet(path, index=False)
    read, real = [], pd.read_parquet
    monkeypatch.setattr(pd, "read_parquet", lambda path, *a, **k: read.append(path) or real(path, *a, **k))
    with pytest.raises(InputError, match=f"record 00000020: heads.parquet {message}"):
        load_history(tmp_path)
    assert path not in read, "refused from its metadata, before it is read"


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_the_shipped_histories_hold_attention_weights():
    """The value checks pass what real trainings wrote (float16 rows sum to 1 within their rounding)."""
    from attnviz.checkpoints.catalog import pretrained_dir

    folders = sorted(pretrained_dir().glob("*/history"))
    assert folders
    for folder in folders:
        assert len(load_history(folder).step) > 0


def test_probes_whose_maps_have_other_layers_or_heads_are_refused(tmp_path):
    """The page had drawn probe 0's heads from probe 1's maps of one layer: an IndexError, and the page's end lost."""
    tokens = (None, ["<s>", "a", "b"])
    probes = [("a b", None), ("b a", None)]
    writer = HistoryWriter(tmp_path, "language model", "induction", probes, {"every": 10}, tokens=[tokens] * 2)
    heads = pd.DataFrame({"kind": "decoder", "layer": [1, 1, 2, 2], "head": [1, 2, 1, 2], "induction": 0.5})
    maps = [{"decoder": np.full((2, 2, 3, 3), 1 / 3)}, {"decoder": np.full((1, 2, 3, 3), 1 / 3)}]
    writer.record(10, 1.0, 1.0, 1e-3, maps, heads)
    with pytest.raises(InputError, match="probe 1's decoder maps have 1 layers of 2 heads, probe 0's 2 of 2"):
        load_history(tmp_path)


def test_the_head_rows_of_all_records_together_are_bounded_before_they_are_read(tmp_path, monkeypatch):
    """Each record's rows were bounded, not their sum: a 1 MB history of many heads took 474 MB to read."""
    from attnviz.training import history as history_module

    _write(tmp_path)  # 3 records of 4 heads
    monkeypatch.setattr(history_module, "MAX_HISTORY_ROWS", 12)
    assert len(load_history(tmp_path).heads) == 12
    monkeypatch.setattr(history_module, "MAX_HISTORY_ROWS", 11)
    read, real = [], pd.read_parquet
    monkeypatch.setattr(pd, "read_parquet", lambda path, *a, **k: read.append(path) or real(path, *a, **k))
    with pytest.raises(InputError, match="4 rows, over the 3 left of the 11 head rows a history may hold in all"):
        load_history(tmp_path)
    assert tmp_path / HISTORY / RECORDS / "00000030" / "heads.parquet" not in read, "the row count is the metadata's"


@pytest.mark.parametrize("extra", [{"seed": 1}, {"recipe": {"d_ff": 64, "steps": 30}}], ids=["seed", "recipe"])
def test_a_history_of_another_seed_or_recipe_is_refused(tmp_path, extra):
    """A second training into the same folder had kept the first one's records under its own manifest."""
    first = {"every": 10, "seed": 0, "recipe": {"d_ff": 32, "steps": 30}}
    _write(tmp_path, manifest=first)
    with pytest.raises(InputError, match="another training"):
        _write(tmp_path, steps=(40,), manifest={**first, **extra})
    resumed = _write(tmp_path, steps=(40,), manifest={**first, "recipe": {"d_ff": 32, "steps": 40}})
    assert sorted(resumed.steps) == [10, 20, 30, 40], "a resumed training may run to more steps"


def test_the_reader_never_unpickles(tmp_path, monkeypatch):
    _write(tmp_path)
    calls = []
    real = np.load
    monkeypatch.setattr(np, "load", lambda *a, **k: calls.append(k.get("allow_pickle")) or real(*a, **k))
    load_history(tmp_path)
    assert calls and all(flag is False for flag in calls)


def test_members_are_checked_before_decompression(tmp_path):
    """A maps.npz whose member declares a huge array is refused from its header alone."""
    _write(tmp_path)
    path = tmp_path / HISTORY / RECORDS / "00000020" / MAPS
    header = np.lib.format.header_data_from_array_1_0(np.zeros((2, 2, 5, 5), dtype=np.float16))
    header["shape"] = (2, 2, 5, 5)
    with zipfile.ZipFile(path, "w") as archive, archive.open("p0_decoder.npy", "w") as member:
        np.lib.format.write_array_header_1_0(member, {**header, "descr": "<f8"})
    with pytest.raises(InputError, match="not float16"):
        load_history(tmp_path)


# ---------------------------------------------------------------------------------------------
# Formation criteria (fast, on synthetic histories)


def test_formation_step_and_the_windows(tmp_path):
    values = [[0.1, 0.2, 0.3, 0.1], [0.1, 0.2, 0.3, 0.55], [0.1, 0.2, 0.3, 0.9]]
    _write(tmp_path, values=values)
    history = load_history(tmp_path)
    assert formation_step(history, "induction", "decoder", 2, 2) == 20
    assert formation_step(history, "induction", "decoder", 2, 2, threshold=0.6) == 30
    assert formation_step(history, "induction", "decoder", 1, 1) is None
    # the held-out loss 3, 2, 1: 10% of its drop is reached at step 20, 90% at step 30
    assert loss_drop(history) == (20, 30)
    # the head's rise 0.1 -> 0.9: 10% (0.18) at step 20, 90% (0.82) at step 30
    assert rise(history, "induction", "decoder", 2, 2) == (20, 30)
    with pytest.raises(ValueError, match="no statistic"):
        formation_step(history, "nonsense", "decoder", 1, 1)


def test_anti_diagonal_share_against_a_loop():
    rng = np.random.default_rng(1)
    cross = rng.random((2, 3, 6, 7))
    cross /= cross.sum(-1, keepdims=True)
    n_src, n_tgt = 6, 6  # six letters and </s>; <s> and six letters
    expected = np.zeros((2, 3))
    for layer in range(2):
        for head in range(3):
            expected[layer, head] = np.mean([cross[layer, head, i, n_src - 1 - i] for i in range(min(n_tgt, n_src))])
    np.testing.assert_allclose(anti_diagonal_share(cross, n_src, n_tgt), expected)
    mirror = np.zeros((1, 1, 6, 7))
    for i in range(6):
        mirror[0, 0, i, 5 - i] = 1
    assert anti_diagonal_share(mirror, 6, 6)[0, 0] == 1


# ---------------------------------------------------------------------------------------------
# attnviz history


@pytest.mark.slow
def test_cli_history_writes_the_issue_arrays(tmp_path, lm_run, reverse_runs, capsys):
    out = tmp_path / "lm.npz"
    assert main(["history", str(lm_run), "--out", str(out)]) == 0
    with np.load(out, allow_pickle=False) as z:
        names = set(z.files)
        assert names == {"step", "train_loss", "heldout_loss", "manifest"} | {
            f"p{p}_{part}" for p in range(3) for part in ("tgt_tokens", "decoder")
        }
        N = len(z["step"])
        assert z["step"].tolist() == [2, 4] and z["train_loss"].shape == z["heldout_loss"].shape == (N,)
        T = len(z["p0_tgt_tokens"])
        assert z["p0_decoder"].shape == (N, 1, 2, T, T)
        assert json.loads(str(z["manifest"]))["kind"] == "language model"
    out = tmp_path / "reverse.npz"
    assert main(["history", str(reverse_runs / "recorded"), "--out", str(out)]) == 0
    with np.load(out, allow_pickle=False) as z:
        S, T = len(z["p1_src_tokens"]), len(z["p1_tgt_tokens"])
        assert z["p1_encoder"].shape == (3, 1, 2, S, S)
        assert z["p1_decoder"].shape == (3, 1, 2, T, T)
        assert z["p1_cross"].shape == (3, 1, 2, T, S)
    csv = tmp_path / "reverse.csv"
    assert main(["history", str(reverse_runs / "recorded"), "--out", str(csv)]) == 0
    table = pd.read_csv(csv)
    assert table.columns.tolist() == ["step", "kind", "layer", "head", "statistic", "value"]
    assert set(table["statistic"]) >= {"train_loss", "heldout_loss", "lr", "anti_diagonal", "previous", "entropy"}
    assert "wrote" in capsys.readouterr().out


def test_cli_history_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["history", str(tmp_path), "--out", str(tmp_path / "f.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnviz: error: no training history") and err.count("\n") == 1
    _write(tmp_path)
    assert main(["history", str(tmp_path), "--out", str(tmp_path / "f.txt")]) == 2
    assert ".npz" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["a huge integer", "statistics a number", "kind a list", "NaN"])
def test_cli_history_of_a_damaged_manifest_is_one_line_and_exit_2(tmp_path, capsys, damage):
    _write(tmp_path)
    path = tmp_path / HISTORY / MANIFEST
    manifest = json.loads(path.read_text())
    if damage == "a huge integer":
        path.write_text(json.dumps(manifest)[:-1] + ', "every": ' + "9" * 5000 + "}")
    elif damage == "kind a list":
        path.write_text(json.dumps({**manifest, "kind": [manifest["kind"]]}))
    elif damage == "NaN":
        path.write_text(json.dumps({**manifest, "every": float("inf")}))
    else:
        path.write_text(json.dumps({**manifest, "statistics": 5}))
    assert main(["history", str(tmp_path), "--out", str(tmp_path / "f.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnviz: error: the history's manifest") and err.count("\n") == 1, err


# ---------------------------------------------------------------------------------------------
# attnviz train: a folder that holds a training, a saved state, a training stopped after its last step

SMALL = ["--steps", "1", "--batch-size", "1", "--eval-n", "1"]


@pytest.mark.parametrize("held", [HISTORY, STATE_FILE, "model.safetensors"])
def test_train_refuses_a_folder_that_holds_a_training_unless_resumed(tmp_path, capsys, held):
    """A second training into the same --out had left the first one's history under the second's manifest."""
    out = tmp_path / "run"
    out.mkdir()
    if held == HISTORY:  # a history with its manifest (one with nothing in it yet is no training: test_train_cli)
        (out / HISTORY).mkdir()
        (out / HISTORY / "manifest.json").write_text("{}")
    else:
        (out / held).write_bytes(b"the first training's")
    assert main(["train", "reverse", "--out", str(out), *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnviz: error:") and err.count("\n") == 1, err
    assert f"holds a training ({held})" in err and "--resume" in err and "another --out" in err, err
    assert sorted(p.name for p in out.iterdir()) == [held], "nothing is written"


@pytest.mark.parametrize(
    "state",
    [[1, 2, 3], {"recipe": "xyz"}, {"recipe": asdict(replace(RECIPES["reverse"], batch_size=1)), "seed": 0}],
    ids=["a list", "a recipe of text", "the recipe and seed alone"],
)
def test_a_saved_state_that_is_not_a_trainings_is_exit_2_and_one_line(tmp_path, capsys, state):
    out = tmp_path / "run"
    out.mkdir()
    torch.save(state, out / STATE_FILE)
    assert main(["train", "reverse", "--out", str(out), "--resume", *SMALL]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnviz: error:") and err.count("\n") == 1 and "not a training's saved state" in err, err


def test_a_training_that_diverges_is_exit_2_and_one_line(tmp_path, capsys, monkeypatch):
    """A loss of NaN comes of the settings the user chose (--lr-scale up to 1000): it had been a bare RuntimeError,
    which the CLI reports as unforeseen (exit 3)."""
    monkeypatch.setattr(loop, "optimise", lambda *args, **kwargs: float("nan"))  # as a diverged step's loss
    with pytest.raises(InputError, match=r"^training diverged at step 1 \(loss nan\); lower --lr-scale$"):
        _train(tmp_path / "run", steps=2, every=0)
    monkeypatch.setattr(loop, "train", lambda *args, **kwargs: _train(tmp_path / "cli", steps=2, every=0))
    assert main(["train", "reverse", "--out", str(tmp_path / "cli"), *SMALL]) == 2
    err = capsys.readouterr().err
    assert err == "attnviz: error: training diverged at step 1 (loss nan); lower --lr-scale\n", err


def test_a_training_stopped_after_its_last_step_is_finished_by_resume(tmp_path, monkeypatch):
    """Killed in its final evaluation, a training had its state and history but no model, and --resume refused."""
    out = tmp_path / "run"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(seq2seq, "evaluate", killed)
    with pytest.raises(KeyboardInterrupt):
        _train(out, steps=4)
    assert sorted(p.name for p in out.iterdir()) == [HISTORY, STATE_FILE]
    monkeypatch.undo()
    _train(out, steps=4, resume=True)  # the same flags
    saved = torch.load(out / STATE_FILE, weights_only=True)["model"]
    weights = load_file(out / "model.safetensors")
    assert weights and all(torch.equal(tensor, saved[name]) for name, tensor in weights.items())
    assert load_history(out).step.tolist() == [2, 4] and (out / "README.md").read_text().strip()
    with pytest.raises(InputError, match="stopped at step 4: raise --steps to train on"):
        _train(out, steps=4, resume=True)  # finished: nothing is left to do
