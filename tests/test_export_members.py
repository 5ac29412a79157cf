"""An export's members and contents are what attnviz writes, or the file is one ExportError: never a silently wrong
diff verdict, a crash deep in the comparison (exit 3), or a traceback."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import toy_export

from attnviz.cli import main
from attnviz.errors import ExportError
from attnviz.export import AXES, load_export
from attnviz.testing.compare import compare_exports


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(array), allow_pickle=False)
    return buf.getvalue()


def _zipped(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A zip of ``members`` in this order, repeated names included (zipfile warns of them, and writes them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in members:
                archive.writestr(name, data)
    return path


def _members(export) -> list[tuple[str, bytes]]:
    return [(f"{name}.npy", _npy(array)) for name, array in export.arrays().items()]


def _diff(a: Path, b: Path, capsys) -> tuple[int, str]:
    code = main(["diff", str(a), str(b)])
    out = capsys.readouterr()
    return code, out.err


def _refused_in_one_line(a: Path, b: Path, capsys, words: str) -> None:
    for x, y in ((a, b), (b, a)):
        code, err = _diff(x, y, capsys)
        assert code == 2, (x.name, y.name, err)
        assert err.count("\n") == 1 and err.startswith("attnviz: error: ") and words in err, err


# ---------------------------------------------------------------------------------------------
# 1. Members: each array once, unencrypted, a name.npy


def _other_maps():
    """The toy export's encoder maps, other numbers: a file reading them instead would differ."""
    return toy_export(seed=1).encoder


@pytest.mark.parametrize(
    ("extra", "first", "words"),
    [
        ("encoder.npy", False, "holds the array 'encoder' twice"),  # numpy reads the last of two encoder.npy
        ("encoder", False, "holds the array 'encoder' twice"),
        ("encoder", True, "holds the member 'encoder', which is not an array member"),  # numpy reads it first
        ("src_tokens", True, "holds the member 'src_tokens', which is not an array member"),
    ],
    ids=["encoder.npy twice", "encoder.npy and encoder", "encoder and encoder.npy", "src_tokens and src_tokens.npy"],
)
def test_an_array_name_twice_is_refused(tmp_path, capsys, extra, first, words):
    """Two members of one array name were read silently, one of them unchecked: diff said EQUAL, or compared
    numbers the size checks had never seen."""
    toy = toy_export()
    good = toy.save(tmp_path / "good.npz")
    other = _npy(_other_maps() if extra.startswith("encoder") else np.array(["x"] * len(toy.src_tokens)))
    members = _members(toy)
    members = [(extra, other), *members] if first else [*members, (extra, other)]
    dup = _zipped(tmp_path / "dup.npz", members)
    with pytest.raises(ExportError, match=words) as info:
        load_export(dup)
    assert str(dup) in str(info.value) and "\n" not in str(info.value)
    _refused_in_one_line(good, dup, capsys, words)


def _encrypted(path: Path, member: str) -> Path:
    """``path`` with ``member`` marked encrypted (general purpose flag bit 0), in its local and central headers."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    for signature, flag_at, name_at in ((b"PK\x03\x04", 6, 30), (b"PK\x01\x02", 8, 46)):
        start = 0
        while (start := data.find(signature, start)) != -1:
            if data[start + name_at : start + name_at + len(name)] == name:
                data[start + flag_at] |= 1
            start += 4
    path.write_bytes(bytes(data))
    return path


def test_an_encrypted_member_is_refused(tmp_path, capsys):
    """zipfile raises a RuntimeError (a password is required) for it: diff exited 3 "unexpected RuntimeError"."""
    good = toy_export().save(tmp_path / "good.npz")
    locked = _encrypted(toy_export().save(tmp_path / "locked.npz"), "encoder.npy")
    with zipfile.ZipFile(locked) as archive:
        assert archive.getinfo("encoder.npy").flag_bits & 1
    with pytest.raises(ExportError, match="encrypted"):
        load_export(locked)
    _refused_in_one_line(good, locked, capsys, "encrypted")


def test_a_member_that_is_not_an_array_is_named_as_one(tmp_path, capsys):
    """It had given numpy's "the magic string is not correct" or "EOF: reading magic string"."""
    toy = toy_export()
    good = toy.save(tmp_path / "good.npz")
    for i, (name, data) in enumerate([("notes.txt", b"hello"), ("readme", b"")]):
        odd = _zipped(tmp_path / f"odd{i}.npz", [*_members(toy), (name, data)])
        with pytest.raises(ExportError, match=rf"the member '{name}', which is not an array member \(name\.npy\)"):
            load_export(odd)
        _refused_in_one_line(good, odd, capsys, "not an array member")


# ---------------------------------------------------------------------------------------------
# 2. Maps: of a legal rank, with layers and heads, finite; a method named by a string


def _saved(path: Path, export, manifest: dict | None = None, **arrays) -> Path:
    written = {**export.arrays(), **arrays}
    if manifest is not None:
        written["manifest"] = np.array(json.dumps(manifest))
    np.savez_compressed(path, **{name: a for name, a in written.items() if a is not None})
    return path


@pytest.mark.parametrize(
    ("method", "shape_of", "words"),
    [
        (None, lambda e: e[0], "shaped (4, 5, 5), not (layer, head, query, key)"),  # 3-D weights
        (None, lambda e: e[None], "shaped (1, 2, 4, 5, 5)"),  # a batch axis
        (None, lambda e: e[0, 0], "shaped (5, 5)"),
        ("norm", lambda e: e[None], "shaped (1, 2, 4, 5, 5), not (layer, head, query, key) or, for a method"),
        (None, lambda e: e[:0], "no layer or no head"),
        (None, lambda e: e[:, :0], "no layer or no head"),
        ("norm", lambda e: e[:0], "no layer or no head"),
        ("rollout", lambda e: e[:, 0], "shaped (2, 5, 5), but its manifest names 4 axes"),
    ],
    ids=["3-D weights", "5-D weights", "2-D weights", "5-D method", "0 layers", "0 heads", "0 layers, method", "axes"],
)
def test_maps_of_another_rank_or_without_heads_are_refused(tmp_path, capsys, method, shape_of, words):
    """check_sizes read only the last two axes; diff skipped the invariants of maps that were not 4-D."""
    toy = toy_export(**({} if method is None else {"method": method}))
    bad = _saved(tmp_path / "bad.npz", toy, encoder=shape_of(toy.encoder))
    with pytest.raises(ExportError, match=rf"its encoder maps.*{re.escape(words)}"):
        load_export(bad)
    _refused_in_one_line(toy.save(tmp_path / "good.npz"), bad, capsys, "encoder maps")


def test_a_method_s_maps_per_layer_still_load(tmp_path):
    """What attnviz attribute writes: a per-layer method's maps are (layer, query, key)."""
    toy = toy_export(method="rollout")
    per_layer = dataclasses.replace(toy, encoder=toy.encoder[:, 0], decoder=toy.decoder[:, 0], cross=toy.cross[:, 0])
    axes = {kind: [a for a in AXES[kind] if a != "head"] for kind in AXES}
    per_layer = dataclasses.replace(per_layer, manifest={**toy.manifest, "axes": axes})
    loaded = load_export(per_layer.save(tmp_path / "rollout.npz"))
    assert loaded.encoder.shape == toy.encoder[:, 0].shape


@pytest.mark.parametrize("method", [None, "attention", "norm"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_maps_that_are_not_finite_are_refused(tmp_path, capsys, method, value):
    """A NaN in both files' maps compared as equal (NaN equals NaN), and a method's maps had no check at all."""
    toy = toy_export(**({} if method is None else {"method": method}))
    cross = toy.cross.copy()
    cross[1, 2, 3, 0] = value
    bad = _saved(tmp_path / "bad.npz", toy, cross=cross)
    with pytest.raises(ExportError, match=r"its cross maps hold 1 value that is not finite \(NaN or infinite\)"):
        load_export(bad)
    code, err = _diff(bad, bad, capsys)
    assert code == 2 and "not finite" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("method", [["x"], 5, {"name": "norm"}, True])
def test_a_method_that_is_not_text_is_refused(tmp_path, capsys, method):
    """``["x"]`` was read as a method, so invariants were skipped: NaN, negative, non-causal maps compared EQUAL."""
    toy = toy_export()
    decoder = toy.decoder.copy()
    decoder[0, 0, 0, -1] = -0.5  # negative, and in the causal mask
    bad = _saved(tmp_path / "bad.npz", toy, {**toy.manifest, "method": method}, decoder=decoder)
    with pytest.raises(ExportError, match="its manifest's method is .*, not the name of a method"):
        load_export(bad)
    code, err = _diff(bad, bad, capsys)
    assert code == 2 and err.count("\n") == 1, err


def test_in_memory_method_maps_that_are_not_finite_break_an_invariant():
    """The snapshot plugin compares an export made in memory, which never passed load_export."""
    toy = toy_export(method="norm")
    cross = toy.cross.copy()
    cross[0, 0, 0, 0] = np.nan
    report = compare_exports(toy, dataclasses.replace(toy, cross=cross))
    assert any(f.what == "invariant" and "not finite" in f.text for f in report.findings), report.to_text()


# ---------------------------------------------------------------------------------------------
# 3. Manifest fields read later are of their type


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"src": 5}, "its manifest's src is 5, not a text or null"),
        ({"tgt": ["a"]}, "its manifest's tgt is a list of 1 item, not a text or null"),
        ({"tgt_truncated": "false"}, "its manifest's tgt_truncated is 'false', not true, false or a whole number"),
        ({"generated": 1.5}, "its manifest's generated is 1.5, not true, false or a whole number"),
        ({"generated": -1}, "its manifest's generated is -1"),
        ({"note": 3}, "its manifest's note is 3, not a text"),
        ({"axes": ["layer"]}, "its manifest's axes are a list of 1 item, not an object of each kind's axes"),
        ({"axes": {**AXES, "encoder": "layer"}}, "its manifest's axes of encoder are 'layer', not"),
        ({"axes": {**AXES, "encoder": AXES["decoder"]}}, "its manifest's axes of encoder are"),
        ({"axes": {**AXES, "encoder": [*AXES["encoder"], "x"]}}, "its manifest's axes of encoder are"),
        ({"axes": {**AXES, "bias": ["x"]}}, "its manifest names the axes of 'bias', which is not a kind of map"),
    ],
    ids=lambda v: str(v)[:40] if isinstance(v, dict) else None,
)
def test_manifest_fields_of_the_wrong_type_are_refused(tmp_path, capsys, changes, words):
    """``"src": 5`` with other ids had diff exit 3 ("object of type 'int' has no len()"), ``"tgt_truncated":
    "false"`` ended every row label with '→ …', and encoder axes naming decoder positions labelled cells wrongly."""
    toy = toy_export()
    other = dataclasses.replace(toy, src_ids=toy.src_ids + 1)
    bad = _saved(tmp_path / "bad.npz", other, {**toy.manifest, **changes})
    with pytest.raises(ExportError, match=re.escape(words)) as info:
        load_export(bad)
    assert "\n" not in str(info.value)
    _refused_in_one_line(toy.save(tmp_path / "good.npz"), bad, capsys, "manifest")


def test_axes_attnviz_writes_still_load(tmp_path):
    """Words (attnviz attention --words) and a per-layer method's axes, and a manifest without axes."""
    from attnviz.kinds import axis_names

    toy = toy_export()
    words = {kind: ["layer", "head", *axis_names(kind, "word")] for kind in AXES}
    for manifest in ({**toy.manifest, "axes": words}, {k: v for k, v in toy.manifest.items() if k != "axes"}):
        load_export(_saved(tmp_path / "ok.npz", toy, manifest))


# ---------------------------------------------------------------------------------------------
# 4. Which file lacks a side, when neither has ids


def test_a_language_model_against_an_encoder_decoder_names_the_right_file():
    """Both without ids (maps from another library): the language model A was said to be the one with a source."""
    from attnviz.notebook import plain_export

    toy = toy_export()
    lm = plain_export(toy.decoder, toy.tgt_tokens)
    pair = plain_export(
        encoder=toy.encoder, decoder=toy.decoder, cross=toy.cross, src_tokens=toy.src_tokens, tgt_tokens=toy.tgt_tokens
    )
    for a, b, which in ((lm, pair, "B"), (pair, lm, "A")):
        texts = [f.text for f in compare_exports(a, b).findings if f.what == "inputs" and f.subject == "source"]
        assert texts == [f"only {which} has a source side (the other model is a language model)"], texts
    encoder = plain_export(toy.encoder, toy.src_tokens)
    for a, b, which in ((encoder, pair, "B"), (pair, encoder, "A")):
        texts = [f.text for f in compare_exports(a, b).findings if f.what == "inputs" and f.subject == "target"]
        assert texts == [f"only {which} has a target side (the other model is encoder-only)"], texts


# ---------------------------------------------------------------------------------------------
# 5. Numbers in the manifest are finite


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_manifest_number_that_is_not_finite_is_refused(tmp_path, capsys, value):
    """It was shown as context: "model: nan (A) vs nan (B)"."""
    toy = toy_export()
    path = tmp_path / "bad.npz"
    arrays = toy.arrays()
    arrays["manifest"] = np.array(json.dumps(toy.manifest)[:-1] + f', "run": {{"threads": {value}}}}}')
    np.savez_compressed(path, **arrays)
    with pytest.raises(ExportError, match=r"its manifest holds a number that is not finite \(run\.threads\)"):
        load_export(path)
    _refused_in_one_line(toy.save(tmp_path / "good.npz"), path, capsys, "not finite")
