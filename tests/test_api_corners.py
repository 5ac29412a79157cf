"""Corners of the public API and of an atlas's tables: each a clear error, never a silent or meaningless answer."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import attnviz
from attnviz.atlas import load_atlas, write_atlas
from attnviz.errors import AtlasError, DeviceError, InputError

LINES = "a b c\nd e f\ng h i\nj k l\n"  # four sentences, as tests/test_atlas_hostile.py builds its atlas


@pytest.fixture(scope="module")
def reverse():
    return attnviz.load("reverse", device="cpu")


@pytest.fixture(scope="module")
def induction():
    return attnviz.load("induction", device="cpu")


@pytest.fixture(scope="module")
def encoder_only(reverse):
    """``reverse``'s tokenizer under an encoder-only config: what maps_size and unknown_pieces read, and no more."""
    cfg = dataclasses.replace(reverse.config, n_dec_layers=0)
    assert cfg.encoder_only
    return SimpleNamespace(config=cfg, tokenizer=reverse.tokenizer)


# ---------------------------------------------------------------------------------------------
# A target where the model takes none


def test_a_lone_surrogate_is_refused_with_where_it_is_not_a_native_librarys_error(reverse, induction):
    """A string holding half a surrogate pair (bytes that were not UTF-8, read with surrogateescape) had reached
    sentencepiece, whose C++ binding raised "RuntimeError: Unable to cast Python instance of type <class 'str'>"."""
    shipped = attnviz.load("en-de", device="cpu")
    for call, where in (
        (lambda: attnviz.attention(shipped, "ab\udc80c"), "source text holds U+DC80 at character 3,"),
        (lambda: attnviz.attention(shipped, "one", "tw\udc80o"), "target text holds U+DC80 at character 3,"),
        (lambda: attnviz.translate(reverse, "x\ud800"), "source text holds U+D800 at character 2,"),
        (lambda: attnviz.generate(induction, "a b \udfff", 2), "prompt text holds U+DFFF at character 5,"),
    ):
        with pytest.raises(InputError) as refused:
            call()
        assert where in str(refused.value) and str(refused.value).isascii(), refused.value  # printable anywhere


@pytest.mark.parametrize("function", [attnviz.maps_size, attnviz.unknown_pieces])
def test_a_target_for_a_language_model_is_refused_as_attention_refuses_it(induction, function):
    """maps_size had counted the prompt alone and unknown_pieces had read it alone, the target ignored."""
    with pytest.raises(InputError, match="a language model reads one text") as refused:
        function(induction, "a b c", "x y")
    with pytest.raises(InputError) as by_attention:
        attnviz.attention(induction, "a b c", "x y")
    assert str(refused.value) == str(by_attention.value)
    assert function(induction, "a b c") == function(induction, "a b c", None)  # no target: as before


def test_generate_asked_of_an_encoder_only_model_says_it_writes_nothing(encoder_only, reverse):
    """An encoder-only model (MiniLM) had been told "this model translates: use translate", and that "its decoder
    input is its translation": translate refuses it too, and it has no decoder."""
    with pytest.raises(InputError, match="^generate continues a language model's prompt; this model is encoder-only"):
        attnviz.generate(encoder_only, "a b c")
    with pytest.raises(InputError, match="^generate applies to language models; this model is encoder-only: it wr"):
        attnviz.maps_size(encoder_only, "a b c", generate=2)
    with pytest.raises(InputError, match="this model translates: use translate"):  # a translator's is unchanged
        attnviz.generate(reverse, "a b c")
    with pytest.raises(InputError, match="this model's decoder input is its translation"):
        attnviz.attention(reverse, "a b c", generate=2)


@pytest.mark.parametrize("function", [attnviz.maps_size, attnviz.unknown_pieces])
def test_a_target_for_an_encoder_only_model_is_refused(encoder_only, function):
    with pytest.raises(InputError, match="this model is encoder-only: it takes no target sentence"):
        function(encoder_only, "a b c", "x y")


# ---------------------------------------------------------------------------------------------
# An ablation of no head


@pytest.mark.parametrize("ablate", [None, "", " , ", set(), attnviz.Ablation()])
def test_comparing_the_model_with_itself_is_refused(reverse, induction, ablate):
    """No head to switch off had compared the intact model with itself: every step "unchanged"."""
    for bundle in (reverse, induction):
        with pytest.raises(InputError, match=r"name at least one head to switch off, e\.g\. (cross|decoder):1\.2"):
            attnviz.compare_ablation(bundle, "a b c a", ablate)


def test_an_ablation_of_some_head_is_still_compared(reverse):
    assert attnviz.compare_ablation(reverse, "a b c", "cross:1.2").ablation.heads == {("cross", 0, 1)}


# ---------------------------------------------------------------------------------------------
# A device the machine lacks


def test_a_device_error_is_a_value_error_as_every_other_bad_argument():
    """`except ValueError` in a notebook had caught a bad text or method, and not device="cuda" on a laptop."""
    assert issubclass(DeviceError, ValueError) and issubclass(DeviceError, attnviz.AttnvizError)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        attnviz.load("reverse", device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with a GPU loads onto it")
def test_cuda_on_a_machine_without_a_gpu_is_a_value_error():
    with pytest.raises(ValueError, match="no CUDA GPU is available"):
        attnviz.load("reverse", device="cuda")


@pytest.mark.parametrize("name", [None, 5, ["reverse"], b"reverse"])
def test_a_model_name_that_is_not_text_is_refused(name):
    """load(None) had looked for a model named 'None', load(["reverse"]) for one named "['reverse']"."""
    with pytest.raises(InputError, match="the model to load is a name or a folder"):
        attnviz.load(name, device="cpu")


def test_a_model_folder_given_as_a_path_loads(reverse):
    assert attnviz.load(Path(reverse.path), device="cpu").sha256 == reverse.sha256


# ---------------------------------------------------------------------------------------------
# An atlas folder whose tables disagree with each other or with its manifest


@pytest.fixture(scope="module")
def finished(reverse, tmp_path_factory):
    root = tmp_path_factory.mktemp("atlas")
    (root / "corpus.txt").write_text(LINES)
    write_atlas(reverse, root / "corpus.txt", root / "atlas")
    return root / "atlas"


@pytest.fixture
def atlas(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "atlas"))


def _counts(folder: Path, **counts) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["counts"].update(counts)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _rows(folder: Path, table: str, start: int, stop: int | None = None) -> None:
    """``table`` cut to its rows from ``start`` to ``stop`` (the end, without it)."""
    frame = pq.read_table(folder / f"{table}.parquet")
    stop = frame.num_rows if stop is None else stop
    pq.write_table(frame.slice(start, stop - start), folder / f"{table}.parquet")


def _duplicate(folder: Path, table: str) -> None:
    """``table`` with its first row given twice."""
    frame = pq.read_table(folder / f"{table}.parquet")
    pq.write_table(pa.concat_tables([frame, frame.slice(0, 1)]), folder / f"{table}.parquet")


def _value(folder: Path, table: str, column: str, value) -> None:
    frame = pq.read_table(folder / f"{table}.parquet").to_pandas()
    frame[column] = value
    frame.to_parquet(folder / f"{table}.parquet", index=False)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: _counts(f, sentences=10), "manifest counts 10 sentences and inputs.parquet holds 4"),
        (lambda f: _counts(f, sentences=-3), "manifest counts -3 sentences and inputs.parquet holds 4"),
        (lambda f: _counts(f, lines=1), "manifest counts 4 sentences in 1 line"),
        (lambda f: _rows(f, "inputs", 0, 2), "manifest counts 4 sentences and inputs.parquet holds 2"),
        (lambda f: [_rows(f, t, 0, 0) for t in ("inputs", "sentences")], "holds no sentence"),
        (lambda f: [_rows(f, t, 0, 0) for t in ("heads", "sentences", "distances", "mds")], "holds no head"),
        (lambda f: _rows(f, "heads", 0, 0), "holds no head"),
        (lambda f: _rows(f, "heads", 0, 3), "has heads that heads.parquet lacks: encoder layer 1 head 4 and 20 more"),
        (
            lambda f: _rows(f, "sentences", 0, 5),
            "heads that sentences.parquet lacks: encoder layer 2 head 2 and 18 more",
        ),
        (lambda f: _rows(f, "sentences", 24), "sentences.parquet holds other sentences than inputs.parquet"),
        (lambda f: _duplicate(f, "sentences"), "sentences.parquet has 97 rows for 4 sentences of 24 heads"),
        (
            lambda f: _rows(f, "mds", 1),
            "heads.parquet has heads that mds.parquet lacks: encoder layer 1 head 1: compute",
        ),
        (lambda f: _duplicate(f, "mds"), "mds.parquet has 25 rows for 24 heads"),
        (lambda f: _rows(f, "distances", 1), "63 rows for the 8 encoder heads (one per ordered pair: 64)"),
        (lambda f: _value(f, "heads", "sentences", 3), "heads.parquet counts 3 sentences for encoder layer 1 head 1"),
        (lambda f: _value(f, "heads", "sentences", float("nan")), "heads.parquet counts nan sentences for encoder"),
        (lambda f: _value(f, "heads", "sentences", pd.array([pd.NA] * 24, "Int64")), "counts nan sentences"),
        (lambda f: _value(f, "mds", "x", float("nan")), "mds.parquet has x missing in a row"),
        (lambda f: _value(f, "distances", "js_divergence", float("nan")), "has js_divergence missing in a row"),
    ],
    ids=[
        "more sentences counted",
        "a negative count",
        "more sentences than lines",
        "inputs cut",
        "no sentence",
        "no head anywhere",
        "no head in heads",
        "heads cut",
        "sentences cut",
        "a sentence's rows gone",
        "a sentence row twice",
        "mds cut",
        "a place twice",
        "distances cut",
        "a head's count",
        "no count",
        "no whole count",
        "nan place",
        "nan divergence",
    ],
)
def test_an_atlas_whose_tables_disagree_is_refused_in_one_line(atlas, damage, message):
    """Each had been read as an atlas: counts the pages showed, heads never drawn, means of the wrong sentences."""
    damage(atlas)
    with pytest.raises(AtlasError, match="compute it again") as refused:
        load_atlas(atlas)
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_table_is_refused_in_one_line(atlas, damage):
    path = atlas / "sentences.parquet"
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(AtlasError, match="sentences.parquet") as refused:
        load_atlas(atlas)
    assert "\n" not in str(refused.value)


def test_a_computed_atlas_passes_its_own_checks(reverse, induction):
    """The checks refuse nothing an atlas holds by design: a one-token sentence, a language model's roles."""
    for bundle, texts in ((reverse, ["a", "a b c"]), (induction, ["a b c a b c", "d e d e"])):
        atlas = attnviz.compute_atlas(bundle, texts)
        assert len(atlas.inputs) == atlas.manifest["counts"]["sentences"] == len(texts)
