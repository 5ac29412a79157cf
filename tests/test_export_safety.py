"""Exports and golden files are safe to read and to write: hostile files end in exit 2, never a hang."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import TOY_SRC, toy_export

from attnviz.cli import main
from attnviz.errors import ExportError
from attnviz.export import load_export, write_atomically

pytest_plugins = ["pytester"]  # the snapshot plugin run on a throwaway project, in this process


def zeros_npz(path: Path, n_bytes: int) -> Path:
    """An .npz whose 'encoder' declares ``n_bytes`` of float32 zeros: about 1/1000 of that on disk."""
    path.write_bytes(_zeros_npz_bytes(n_bytes))
    return path


@functools.cache
def _zeros_npz_bytes(n_bytes: int) -> bytes:
    """The file's bytes, made once a process: deflating a GiB took 6 CPU s (2-core AMD EPYC, AVX2 only)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("encoder.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (n_bytes // 4,)})
            for _ in range(n_bytes // 2**24):
                f.write(bytes(2**24))
    return buffer.getvalue()


@pytest.mark.slow
def test_a_small_file_that_declares_a_gib_is_refused_before_it_is_decompressed(tmp_path, capsys):
    bomb = zeros_npz(tmp_path / "bomb.npz", 2**30)
    assert bomb.stat().st_size < 2 * 2**20
    with pytest.raises(ExportError, match="1,024 MB.*ATTNVIZ_MAX_EXPORT_MB"):
        load_export(bomb)
    good = toy_export().save(tmp_path / "good.npz")
    assert main(["diff", str(bomb), str(good)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "over the limit" in err


def test_the_limit_is_the_operators(tmp_path, monkeypatch):
    bomb = zeros_npz(tmp_path / "bomb.npz", 2**25)  # 32 MB
    monkeypatch.setenv("ATTNVIZ_MAX_EXPORT_MB", "16")
    with pytest.raises(ExportError, match="over the limit of 16 MB"):
        load_export(bomb)
    monkeypatch.setenv("ATTNVIZ_MAX_EXPORT_MB", "64")
    with pytest.raises(ExportError, match="no src_tokens"):  # past the bound: read, and found not to be an export
        load_export(bomb)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: dataclasses.replace(e, cross=e.cross.astype(np.complex64)), "complex64 values, not real"),
        (lambda e: dataclasses.replace(e, src_ids=e.src_ids.astype(np.float32)), "not integers"),
        (lambda e: dataclasses.replace(e, manifest={"a": json.loads("[" * 40 + "]" * 40)}), "nests deeper"),
        (lambda e: dataclasses.replace(e, src_tokens=e.src_tokens[:-1]), "its encoder maps are shaped"),
        (lambda e: dataclasses.replace(e, tgt_tokens=e.tgt_tokens + ("x",)), "its decoder maps are shaped"),
    ],
)
def test_maps_that_are_not_real_floats_and_nested_manifests_are_refused(tmp_path, change, message):
    path = tmp_path / "x.npz"
    path.write_bytes(change(toy_export()).to_bytes())
    with pytest.raises(ExportError, match=message):
        load_export(path)


def test_a_manifest_nested_past_python_s_recursion_is_refused(tmp_path):
    export = toy_export()
    arrays = export.arrays()
    arrays["manifest"] = np.array("[" * 100_000 + "]" * 100_000)
    np.savez_compressed(tmp_path / "deep.npz", **arrays)
    assert main(["diff", str(tmp_path / "deep.npz"), str(export.save(tmp_path / "good.npz"))]) == 2


@pytest.mark.slow
def test_fifos_are_refused_by_diff_and_by_out_without_hanging(tmp_path):
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)
    good = toy_export().save(tmp_path / "good.npz")
    with pytest.raises(ExportError, match="FIFO"):
        load_export(fifo)
    for args in (
        ["diff", str(fifo), str(good)],
        ["attention", "--model", "reverse", "--src", "a b", "--out", str(fifo)],
    ):
        run = subprocess.run(
            [sys.executable, "-m", "attnviz.cli", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert run.returncode == 2, run.stderr
        assert "FIFO" in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.npz"
    path.write_bytes(b"the earlier, good file")

    def crash(fd):  # the process dies between writing and renaming
        raise OSError("killed")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError):
        write_atomically(path, b"half")
    assert path.read_bytes() == b"the earlier, good file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]
    monkeypatch.undo()
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"


PLUGIN_TEST = """
from conftest_export import export


def test_snapshot(attention_snapshot):
    attention_snapshot(export())
"""


def run_plugin(pytester, *flags: str):
    """pytest on the throwaway project, in this process (pytester): the plugin from its entry point, as a
    user's run loads it. A pytest subprocess each time had cost three imports of torch, about 20 s of the
    test's 27 on a 2-core AMD EPYC with AVX2 only."""
    return pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", *flags, "test_x.py")


@pytest.mark.slow
def test_the_plugin_never_deletes_a_folder_and_replaces_a_golden_file_whole(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)  # the plugin refuses --attnviz-update under CI
    folder = pytester.path
    (folder / "test_x.py").write_text(PLUGIN_TEST)
    source = Path(__file__).with_name("conftest.py")
    (folder / "conftest_export.py").write_text(
        f"import sys\nsys.path.insert(0, {str(source.parent)!r})\nfrom conftest import toy_export as export\n"
    )
    golden = folder / "__snapshots__" / "test_x" / "test_snapshot.npz"
    golden.mkdir(parents=True)
    (golden / "keep.txt").write_text("someone's files")
    run = run_plugin(pytester, "--attnviz-update")
    out = "\n".join(run.outlines)
    assert run.ret == 1 and "is a folder, not an export file" in out, out
    assert (golden / "keep.txt").read_text() == "someone's files", "a folder is never deleted"
    (golden / "keep.txt").unlink()
    golden.rmdir()
    zeros_npz(golden, 2**30)  # a hostile golden file from a pull request: repaired by an update
    assert run_plugin(pytester).ret == 1
    run = run_plugin(pytester, "--attnviz-update")
    assert run.ret == 0, "\n".join(run.outlines)
    assert load_export(golden).src_tokens == toy_export().src_tokens
    assert sorted(p.name for p in golden.parent.iterdir()) == ["test_snapshot.npz"], "no temporary file left"


def _saved(path: Path, export, **arrays) -> Path:
    """``export``'s arrays, with ``arrays`` put in (None: left out), written as numpy writes them."""
    written = {**export.arrays(), **arrays}
    np.savez_compressed(path, **{name: a for name, a in written.items() if a is not None})
    return path


def _language_model(export):
    return dataclasses.replace(export, encoder=None, cross=None, src_ids=None, src_tokens=None)


def _encoder_only(export):
    return dataclasses.replace(export, decoder=None, cross=None, tgt_ids=None, tgt_tokens=None)


@pytest.mark.parametrize("side", ["src", "tgt"])
def test_ids_without_their_tokens_are_refused_in_one_line(tmp_path, capsys, side):
    """A language model's file with a src_ids array (or an encoder's with tgt_ids) had diff crash with a
    TypeError (exit 3) against a file with that side's tokens, and say EQUAL against one without its ids."""
    toy = toy_export()
    plain = _language_model(toy) if side == "src" else _encoder_only(toy)
    odd = _saved(tmp_path / "odd.npz", plain, **{f"{side}_ids": getattr(toy, f"{side}_ids")})
    with pytest.raises(ExportError, match=f"has {side}_ids but no {side}_tokens"):
        load_export(odd)
    for other in (plain.save(tmp_path / "plain.npz"), toy.save(tmp_path / "whole.npz")):
        for a, b in ((odd, other), (other, odd)):
            assert main(["diff", str(a), str(b)]) == 2, (a.name, b.name)
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith("attnviz: error: ") and f"no {side}_tokens" in err, err


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("src_tokens", np.array("".join("x" * len(TOY_SRC)))),  # 0-d: had been read as a token per character
        ("src_tokens", np.array([[t] for t in TOY_SRC])),  # 2-D: had been read as tokens that are lists
        ("src_ids", np.arange(len(TOY_SRC)).reshape(1, -1)),  # diff had called the same tokens "tokenised differently"
        ("tgt_ids", np.array(7)),
    ],
    ids=["tokens 0-d", "tokens 2-D", "ids 2-D", "ids 0-d"],
)
def test_tokens_and_ids_that_are_not_a_list_are_refused(tmp_path, name, value):
    path = _saved(tmp_path / "x.npz", toy_export(), **{name: value})
    with pytest.raises(ExportError, match=rf"the array '{name}' is shaped {re.escape(str(value.shape))}, not a list"):
        load_export(path)


def test_files_without_ids_or_of_one_side_still_load(tmp_path):
    """What the refusals above leave: maps from another library have tokens and no ids, and a language
    model's or an encoder's file has one side."""
    toy = toy_export()
    for export in (
        dataclasses.replace(toy, src_ids=None, tgt_ids=None),
        _language_model(toy),
        _encoder_only(toy),
    ):
        loaded = load_export(export.save(tmp_path / "x.npz"))
        assert (loaded.src_tokens, loaded.tgt_tokens) == (export.src_tokens, export.tgt_tokens)
        assert (loaded.src_ids is None, loaded.tgt_ids is None) == (export.src_ids is None, export.tgt_ids is None)
