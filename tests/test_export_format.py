"""The .npz export's format versions: every version attnviz wrote still loads, a newer one is refused,
and a file that is not an export is one clear ExportError."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import toy_export

import attnviz
from attnviz.errors import ExportError
from attnviz.export import FORMAT_VERSION, FORMAT_VERSIONS, AttentionExport, load_export
from attnviz.kinds import KINDS
from attnviz.linear import use_onednn

# Files written in export format 1 (the shipped models' golden snapshots before they were retrained in
# format 3): a newer attnviz must keep reading them.
FORMAT_1 = Path(__file__).parent / "format1"


def write_format_1(export: AttentionExport, path: Path) -> None:
    """The file exactly as attnviz wrote it before format versions: the same arrays, a manifest without one."""
    arrays = {
        "encoder": export.encoder,
        "decoder": export.decoder,
        "cross": export.cross,
        "src_ids": export.src_ids,
        "tgt_ids": export.tgt_ids,
        "src_tokens": np.array(export.src_tokens, dtype=str),
        "tgt_tokens": np.array(export.tgt_tokens, dtype=str),
        "manifest": np.array(json.dumps(export.manifest, ensure_ascii=False)),
    }
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays, **export.extras)
    path.write_bytes(buf.getvalue())


def assert_same_export(a: AttentionExport, b: AttentionExport) -> None:
    for name in ("encoder", "decoder", "cross", "src_ids", "tgt_ids"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.src_tokens == b.src_tokens and a.tgt_tokens == b.tgt_tokens
    assert a.extras.keys() == b.extras.keys()


def test_every_version_written_is_listed():
    assert sorted(FORMAT_VERSIONS) == list(range(1, FORMAT_VERSION + 1))


def test_a_format_1_file_still_loads(tmp_path):
    export = dataclasses.replace(toy_export(), extras={"relevance": np.ones((2, 3), np.float32)})
    path = tmp_path / "old.npz"
    write_format_1(export, path)
    with np.load(path, allow_pickle=False) as z:
        assert "format_version" not in json.loads(str(z["manifest"]))  # really the old layout
    loaded = load_export(path)
    assert loaded.format_version == 1
    assert_same_export(loaded, export)
    np.testing.assert_array_equal(loaded.extras["relevance"], export.extras["relevance"])


@pytest.mark.parametrize("golden", sorted(FORMAT_1.glob("*/*.npz")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_format_1_files_still_load(golden):
    export = load_export(golden)
    assert export.format_version == 1 and export.encoder.ndim == 4


def test_save_writes_the_current_version_and_round_trips(tmp_path):
    export = toy_export()
    path = export.save(tmp_path / "new.npz")
    with np.load(path, allow_pickle=False) as z:
        assert json.loads(str(z["manifest"]))["format_version"] == FORMAT_VERSION
    loaded = load_export(path)
    assert loaded.format_version == FORMAT_VERSION
    assert_same_export(loaded, export)


def test_resaving_an_old_file_writes_the_current_version(tmp_path):
    write_format_1(toy_export(), tmp_path / "old.npz")
    load_export(tmp_path / "old.npz").save(tmp_path / "again.npz")
    assert load_export(tmp_path / "again.npz").format_version == FORMAT_VERSION


def _plain_exports() -> dict[str, AttentionExport]:
    """What the notebook views make of other libraries' maps: tokens and no ids."""
    from attnviz.notebook import plain_export

    toy = toy_export()
    tokens = {"src_tokens": toy.src_tokens, "tgt_tokens": toy.tgt_tokens}
    return {
        "language model": plain_export(toy.decoder, toy.tgt_tokens),
        "encoder": plain_export(toy.encoder, toy.src_tokens),
        "encoder-decoder": plain_export(encoder=toy.encoder, decoder=toy.decoder, cross=toy.cross, **tokens),
        "cross-attention alone": plain_export(cross=toy.cross, **tokens),
    }


@pytest.mark.parametrize("name", _plain_exports())
def test_a_plain_export_round_trips_through_its_file(name, tmp_path, capsys):
    """A view's export of plain maps has no ids: load_export, head_view(path) and attnviz diff had all refused
    the file its own save() wrote."""
    from attnviz.cli import main
    from attnviz.notebook import head_view

    export = _plain_exports()[name]
    assert export.src_ids is None and export.tgt_ids is None
    path = export.save(tmp_path / "plain.npz")
    loaded = load_export(path)
    assert_same_export(loaded, export)
    view = head_view(path, mode="widget")
    assert view.spec["kinds"] == [kind for kind in KINDS if getattr(export, kind) is not None]
    assert list(loaded.manifest["axes"]) == view.spec["kinds"], "the manifest names the axes of the maps it holds"
    assert main(["diff", str(path), str(path)]) == 0
    assert "EQUAL" in capsys.readouterr().out


def test_a_file_with_maps_but_not_their_tokens_is_still_refused(tmp_path):
    path = tmp_path / "ids only.npz"
    arrays = toy_export().arrays()
    del arrays["src_tokens"]
    np.savez_compressed(path, **arrays)
    with pytest.raises(ExportError, match="is not an attnviz export: no src_tokens in it"):
        load_export(path)
    arrays = {"decoder": toy_export().decoder, "manifest": np.array("{}")}  # neither ids nor tokens
    np.savez_compressed(path, **arrays)
    with pytest.raises(ExportError, match="is not an attnviz export: no tgt_tokens in it"):
        load_export(path)


def test_token_labels_keep_their_nul_characters(tmp_path):
    """numpy's unicode arrays drop a string's trailing NULs: a typed word "cat\\x00" had come back as "cat"."""
    tokens = ("cat\x00", "\x00", "a\x00b", "sat\x00\x00", "</s>")
    export = dataclasses.replace(toy_export(), src_tokens=tokens)
    loaded = load_export(export.save(tmp_path / "nul.npz"))
    assert loaded.src_tokens == tokens and loaded.tgt_tokens == export.tgt_tokens
    assert "tgt_token_lengths" not in np.load(tmp_path / "nul.npz").files  # only where a token needs it
    write_format_1(export, tmp_path / "old.npz")  # a file written before: read as it was, NULs and all dropped
    assert load_export(tmp_path / "old.npz").src_tokens == ("cat", "", "a\x00b", "sat", "</s>")


@pytest.mark.parametrize(
    "lengths", [[4, 1, 3, 99, 4], [4, 1, 3, 5], [2, 1, 3, 5, 4], [-1, 1, 3, 5, 4]], ids=["wide", "few", "short", "-1"]
)
def test_token_lengths_that_do_not_fit_the_tokens_are_refused(lengths, tmp_path):
    export = dataclasses.replace(toy_export(), src_tokens=("cat\x00", "\x00", "a\x00b", "sat\x00\x00", "</s>"))
    arrays = export.arrays()
    arrays["src_token_lengths"] = np.array(lengths)
    np.savez_compressed(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ExportError, match="src_token_lengths does not give a length for each of its 5 src_tokens"):
        load_export(tmp_path / "bad.npz")


def test_the_writer_keeps_its_temporary_name_short(tmp_path):
    """The temporary file had been ".NAME.PID.tmp": past the 255-byte limit when NAME came near it, an error
    naming a file the user never typed."""
    from attnviz.export import write_atomically

    path = tmp_path / ("a" * 250 + ".npz")
    assert toy_export().save(path) == path
    assert load_export(path).src_tokens == toy_export().src_tokens
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name], "no temporary file left"
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"


def test_a_dangling_link_as_the_output_is_named_as_one(tmp_path, capsys):
    from attnviz.cli import main

    link = tmp_path / "maps.npz"
    link.symlink_to(tmp_path / "gone" / "maps.npz")
    with pytest.raises(ExportError, match=r"maps.npz is a dangling symbolic link \(to .*gone/maps.npz"):
        toy_export().save(link)
    assert main(["attention", "--model", "reverse", "--device", "cpu", "--src", "a b", "--out", str(link)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a dangling symbolic link" in err, err


def test_a_folder_that_takes_no_file_is_named_not_the_temporary_file():
    """The error had named the writer's own temporary file ('/proc/.attnviz-123-ab12cd34.tmp'), never given."""
    with pytest.raises(ExportError) as caught:
        toy_export().save("/proc/maps.npz")  # no file can be made in /proc, even by root
    assert str(caught.value).startswith("/proc/maps.npz cannot be written: its folder takes no new file (")
    assert ".tmp" not in str(caught.value)


def _with_manifest(tmp_path: Path, **changes) -> Path:
    export = toy_export()
    path = tmp_path / "changed.npz"
    arrays = export.arrays()
    arrays["manifest"] = np.array(json.dumps({**export.manifest, **changes}))
    np.savez_compressed(path, **arrays)
    return path


def test_a_newer_version_is_refused_with_a_clear_message(tmp_path):
    path = _with_manifest(tmp_path, format_version=FORMAT_VERSION + 1)
    with pytest.raises(ExportError, match=rf"newer attnviz \(export format {FORMAT_VERSION + 1}.*upgrade attnviz"):
        load_export(path)


@pytest.mark.parametrize("version", ["2", 0, 1.5, None])
def test_an_unreadable_version_is_refused(tmp_path, version):
    with pytest.raises(ExportError, match="unreadable format_version"):
        load_export(_with_manifest(tmp_path, format_version=version))


def _corrupt(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{kind}.npz"
    good = toy_export().to_bytes()
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("encoder,decoder\n1,2\n")
    elif kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "foreign npz":
        np.savez(path, weights=np.ones(3))
    elif kind == "npy":
        with open(path, "wb") as f:
            np.save(f, np.ones(3))
    elif kind == "pickled manifest":
        arrays = toy_export().arrays()
        arrays["manifest"] = np.array([{"a": 1}], dtype=object)
        np.savez(path, **arrays)
    elif kind == "manifest not json":
        arrays = toy_export().arrays()
        arrays["manifest"] = np.array("{not json")
        np.savez(path, **arrays)
    elif kind == "npy declaring 7 TiB":
        header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }"
        header += " " * (118 - len(header)) + "\n"
        path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(100))
    elif kind == "flipped bytes":
        data = bytearray(good)
        start = data.index(b"encoder.npy") + 200  # inside the compressed member
        data[start : start + 64] = bytes(64)
        path.write_bytes(bytes(data))
    return path


CORRUPT = {
    "empty": "is not an .npz file",
    "text": "is not an .npz file",
    "truncated": "not a readable attnviz export",
    "foreign npz": "is not an attnviz export: no encoder",
    "npy": "holds one array",
    "npy declaring 7 TiB": "holds one array",  # its header alone: refused before numpy allocates it
    "pickled manifest": "not a readable attnviz export",
    "manifest not json": "not a readable attnviz export",
    "flipped bytes": "not a readable attnviz export",
}


@pytest.mark.parametrize("kind", CORRUPT)
def test_a_file_that_is_not_an_export_is_one_clear_error(kind, tmp_path):
    path = _corrupt(kind, tmp_path)
    with pytest.raises(ExportError, match=CORRUPT[kind]) as info:
        load_export(path)
    assert str(path) in str(info.value)


def test_the_manifest_records_what_judges_a_difference():
    bundle = attnviz.load("reverse", device="cpu")
    manifest = attnviz.attention(bundle, "a b c").manifest
    assert manifest["format_version"] == FORMAT_VERSION
    assert {"python", "attnviz", "torch", "numpy", "sentencepiece", "cuda"} <= set(manifest["versions"])
    run = manifest["run"]
    assert run["device"] == "cpu" and run["dtype"] == "float32" and run["attention_kernel"] == "explicit"
    assert run["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert run["threads"] == torch.get_num_threads() and run["device_name"]
    assert run["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    with use_onednn(False):
        assert attnviz.attention(bundle, "a b c").manifest["run"]["onednn"] is False
    with use_onednn(True):
        from attnviz.linear import onednn_supported

        assert attnviz.attention(bundle, "a b c").manifest["run"]["onednn"] is onednn_supported()
