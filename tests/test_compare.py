"""The comparison behind snapshot tests and `attnviz diff`: it finds every difference, names each by
kind, layer, head, query and key, tells changed inputs from changed numbers, and names broken invariants."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from conftest import TOY_SRC, TOY_TGT, toy_export

from attnviz.errors import ExportError
from attnviz.testing.atlas import compare_atlases
from attnviz.testing.compare import DEFAULT_ATOL, check_invariants, compare_exports, compare_paths


def swap_keys(export, kind: str, layer: int, head: int, query: int, k1: int, k2: int):
    """The export with two weights of one row swapped: the row still sums to 1, the values moved."""
    maps = getattr(export, kind).copy()
    maps[layer, head, query, [k1, k2]] = maps[layer, head, query, [k2, k1]]
    return dataclasses.replace(export, **{kind: maps})


def values_findings(report):
    return [f for f in report.findings if f.what == "values"]


def test_equal_exports_are_equal():
    report = compare_exports(toy_export(), toy_export())
    assert report.equal and not report.findings
    assert "EQUAL within the tolerance" in report.to_text()
    assert [line.split(":")[0] for line in report.checked] == ["encoder", "decoder", "cross"]


def test_a_perturbed_head_is_named_with_its_cell_tokens_values_and_count():
    golden = toy_export()
    now = swap_keys(golden, "cross", layer=1, head=2, query=3, k1=0, k2=4)
    report = compare_exports(golden, now, labels=("golden.npz", "this run"))
    assert not report.equal
    (finding,) = report.findings  # one head, one finding, no invariant broken (the row still sums to 1)
    assert finding.subject == "cross" and finding.data["cells_off"] == 2 and finding.data["cells"] == now.cross.size
    text = report.to_text()
    # 1-based layer and head, as the app; positions as the app's axis labels, with their tokens
    assert "cross: 2 of 160 cells differ" in text and "in 1 of 8 heads" in text
    assert "layer 2, head 3: 2 of 20 cells" in text
    worst_key = int(np.argmax(np.abs(golden.cross[1, 2, 3] - now.cross[1, 2, 3])))
    assert f'query 3 "{TOY_TGT[3]}", key {worst_key} "{TOY_SRC[worst_key]}"' in text
    assert f"A {golden.cross[1, 2, 3, worst_key]:.6g}, B {now.cross[1, 2, 3, worst_key]:.6g}" in text
    assert "tolerance: |A - B| <= 1e-05 + 0 * |B|" in text and "A: golden.npz" in text


def test_many_heads_are_counted_and_the_list_is_cut():
    golden = toy_export(layers=3, heads=8)
    cross = golden.cross.copy()
    cross[:, :, 0, :] = cross[:, :, 0, ::-1]  # every head's first row reversed
    report = compare_exports(golden, dataclasses.replace(golden, cross=cross))
    (finding,) = values_findings(report)
    assert "in 24 of 24 heads" in finding.text
    assert finding.details[-1] == "... and 16 more heads" and len(finding.details) == 9


def test_the_tolerance_decides():
    golden = toy_export()
    nudged = dataclasses.replace(golden, encoder=golden.encoder + np.float32(1e-6))  # rows still sum to 1 +- 1e-5
    assert compare_exports(golden, nudged).equal
    assert not compare_exports(golden, nudged, atol=5e-7).equal
    assert golden.encoder.min() > 1e-3
    assert compare_exports(golden, nudged, atol=0, rtol=1e-3).equal


def test_nan_equals_nan_but_not_a_number():
    """In the values' comparison NaN equals NaN; a NaN is still never a map's number (an invariant, methods too)."""
    golden = toy_export(method="gradient")  # a method's maps: no weights' invariants, finite only
    a = golden.cross.copy()
    a[0, 0, 0, 0] = np.nan
    b = a.copy()
    report = compare_exports(dataclasses.replace(golden, cross=a), dataclasses.replace(golden, cross=b))
    assert [(f.what, f.subject) for f in report.findings] == [("invariant", "cross")] * 2, report.to_text()
    assert all("1 cell not finite (NaN or infinite)" in f.text for f in report.findings)
    b[0, 0, 0, 0] = 0.5
    report = compare_exports(dataclasses.replace(golden, cross=a), dataclasses.replace(golden, cross=b))
    finding, invariant = report.findings  # the values first, then what breaks an invariant (A's NaN)
    assert finding.what == "values" and invariant.what == "invariant"
    assert finding.data["cells_off"] == 1 and finding.data["largest"] == np.inf
    strict = json.loads(json.dumps(report.to_json(), allow_nan=False))  # what --json prints is strict JSON
    assert strict["findings"][0]["largest"] == "inf" and strict["findings"][0]["worst"][0]["a"] == "nan"


def test_the_same_text_tokenised_otherwise_is_a_tokenizer_change_not_numbers():
    golden = toy_export()
    pieces = ("▁the", "▁c", "at", "▁sat", "▁down", "</s>")
    S = len(pieces)
    other = dataclasses.replace(
        toy_export(seed=5),
        src_tokens=pieces,
        src_ids=np.arange(30, 30 + S),
        encoder=np.full((2, 4, S, S), 1 / S, np.float32),
        cross=np.full((2, 4, len(TOY_TGT), S), 1 / S, np.float32),
    )
    report = compare_exports(golden, other)
    assert [f.what for f in report.findings] == ["inputs", "inputs"]
    first, skipped = report.findings
    assert first.data["cause"] == "tokenizer" and first.data["first_difference"] == 1
    assert 'the same source text "the cat sat down" was tokenised differently' in first.text
    assert '1:"▁cat"' in first.details[0] and '1:"▁c" 2:"at"' in first.details[1]
    assert "were not compared cell by cell" in skipped.text and skipped.data["not_compared"] == [
        "encoder",
        "decoder",
        "cross",
    ]


def test_another_text_and_another_greedy_output_are_named():
    golden = toy_export()
    other = dataclasses.replace(golden, src_ids=golden.src_ids + 1, manifest={**golden.manifest, "src": "a dog"})
    (finding, _) = compare_exports(golden, other).findings
    assert finding.data["cause"] == "text" and '"the cat sat down" (A) vs "a dog" (B)' in finding.text
    greedy = {**golden.manifest, "tgt": None}
    a = dataclasses.replace(golden, manifest=greedy)
    b = dataclasses.replace(golden, manifest=greedy, tgt_ids=golden.tgt_ids[::-1].copy())
    (finding, _) = compare_exports(a, b).findings
    assert finding.subject == "target" and finding.data["cause"] == "greedy output"


def test_a_language_model_against_an_encoder_decoder_names_what_each_decoder_input_is():
    """A language model's decoder input is its prompt: diff had called the two decoder inputs "the model's own
    greedy output", changed."""
    pair = toy_export()  # its target is given
    lm = dataclasses.replace(
        pair,
        encoder=None,
        cross=None,
        src_ids=None,
        src_tokens=None,
        tgt_ids=pair.tgt_ids[::-1].copy(),
        manifest={**pair.manifest, "generated": 2},
    )
    source, target, _ = compare_exports(lm, pair).findings
    assert source.text == "only B has a source side (the other model is a language model)"
    assert target.data["cause"] == "model kind"
    said = "a language model's prompt and its continuation in A and an encoder-decoder's given target in B"
    assert target.text == f"the decoder input is {said}"
    greedy = dataclasses.replace(pair, manifest={**pair.manifest, "tgt": None})
    _, target, _ = compare_exports(greedy, dataclasses.replace(lm, manifest=pair.manifest)).findings
    said = "an encoder-decoder's own greedy output in A and a language model's prompt in B"
    assert target.text == f"the decoder input is {said}"


def test_new_labels_on_the_same_ids_still_compare_the_maps():
    golden = toy_export()
    relabelled = dataclasses.replace(golden, src_tokens=("the", "cat", "sat", "down", "EOS"))
    relabelled = swap_keys(relabelled, "encoder", 0, 0, 0, 0, 1)
    report = compare_exports(golden, relabelled)
    assert [f.what for f in report.findings] == ["inputs", "values"]
    assert report.findings[0].data["cause"] == "labels"


@pytest.mark.parametrize(("model", "text"), [("reverse", "a b c"), ("en-de", "twenty-one")])
def test_pieces_against_words_are_named_as_such_not_as_new_labels(model, text):
    """A piece-level export against a word-level one (--words) of the same text had been blamed on "the vocabulary's
    labels changed" (reverse: the same ids), or compared as maps of other shapes (en-de); the manifests' units were
    not even in the context."""
    import attnviz

    bundle = attnviz.load(model, device="cpu")
    report = compare_exports(attnviz.attention(bundle, text), attnviz.attention(bundle, text, words=True))
    sides = [f for f in report.findings if f.what == "inputs" and f.subject in ("source", "target")]
    assert sides and all(f.data["cause"] == "units" for f in sides), report.to_text()
    assert sides[0].text == (
        "the source tokens are pieces in A and words in B (attnviz attention --words merges pieces into words): "
        "the maps are over other units"
    )
    assert [f.what for f in report.findings if f not in sides] == ["inputs"]  # the maps: not compared cell by cell
    assert {"key": "units", "a": "pieces", "b": "words"} in report.context


@pytest.mark.parametrize(
    "break_it, invariant",
    [
        (lambda e: e.encoder.__setitem__((1, 3, 2, 0), e.encoder[1, 3, 2, 0] + 0.05), "row not summing to 1"),
        (lambda e: e.decoder.__setitem__((0, 1, 1, 3), 0.0001), "not 0 in the causal mask"),
        (lambda e: e.cross.__setitem__((1, 0, 0, 0), -0.25), "outside [0, 1]"),
        (lambda e: e.cross.__setitem__((1, 0, 0, 0), np.nan), "not finite"),
    ],
    ids=["row sum", "causal", "negative", "nan"],
)
def test_a_broken_invariant_is_named(break_it, invariant):
    golden = toy_export()
    broken = dataclasses.replace(
        golden, encoder=golden.encoder.copy(), decoder=golden.decoder.copy(), cross=golden.cross.copy()
    )
    break_it(broken)
    assert check_invariants(golden, "A") == []
    found = check_invariants(broken, "B")
    assert found and all(f.what == "invariant" for f in found)
    assert any(invariant in f.text and f.text.startswith("invariant broken in B") for f in found), [
        f.text for f in found
    ]
    report = compare_exports(golden, broken)
    assert not report.equal and any(f.what == "invariant" for f in report.findings)


def test_the_causal_finding_names_the_cell():
    golden = toy_export()
    decoder = golden.decoder.copy()
    decoder[0, 1, 1, 3] = 0.0001
    (finding,) = [f for f in check_invariants(dataclasses.replace(golden, decoder=decoder), "B") if "causal" in f.text]
    assert f'layer 1, head 2, query 1 "{TOY_TGT[1]}", key 3 "{TOY_TGT[3]}" = 0.0001' in finding.text


def test_a_methods_maps_per_layer_are_compared_with_their_tokens_and_no_invariants():
    golden = toy_export(method="rollout")
    per_layer = {kind: getattr(golden, kind).mean(1) * 3 for kind in ("encoder", "decoder", "cross")}  # (L, Q, K)
    golden = dataclasses.replace(golden, **per_layer, extras={"relevance": np.linspace(0, 1, 5, dtype=np.float32)})
    assert check_invariants(golden, "A") == []  # rows of 3: not weights
    now = dataclasses.replace(golden, cross=golden.cross.copy())
    now.cross[1, 2, 4] += 0.5
    (finding,) = compare_exports(golden, now).findings
    assert "in 1 of 2 layers" in finding.text
    assert finding.details[0].startswith(
        f'layer 2: 1 of 20 cells; worst at query 2 "{TOY_TGT[2]}", key 4 "{TOY_SRC[4]}"'
    )


def test_extras_are_compared_and_a_missing_array_is_named():
    golden = dataclasses.replace(toy_export(), extras={"relevance": np.zeros((3, 2), np.float32)})
    moved = dataclasses.replace(golden, extras={"relevance": np.eye(3, 2, dtype=np.float32)})
    (finding,) = compare_exports(golden, moved).findings
    assert finding.subject == "relevance" and "2 of 6 cells differ" in finding.text
    assert "worst at axis 0 0, axis 1 0" in finding.details[0]
    (finding,) = compare_exports(golden, toy_export()).findings
    assert finding.what == "missing" and finding.text == "relevance: only A has this array"


def test_an_extra_that_is_not_finite_breaks_an_invariant_in_each_file_that_holds_it():
    """NaN in an extra (grad-attention's source_relevance) had equalled NaN: `attnviz diff` said EQUAL, and the snapshot
    plugin kept such a golden file. Its cell is named by the extra's axes, with the token where the manifest says."""
    golden = toy_export()
    relevance = np.full(len(TOY_SRC), 1 / len(TOY_SRC), np.float32)
    relevance[1] = np.nan
    manifest = {**golden.manifest, "axes": {**golden.manifest.get("axes", {}), "source_relevance": ["source position"]}}
    a = dataclasses.replace(golden, extras={"source_relevance": relevance}, manifest=manifest)
    report = compare_exports(a, dataclasses.replace(a, extras={"source_relevance": relevance.copy()}))
    assert [(f.what, f.subject, f.data["file"]) for f in report.findings] == [
        ("invariant", "source_relevance", "A"),
        ("invariant", "source_relevance", "B"),
    ], report.to_text()
    assert report.findings[0].text == (
        f"invariant broken in A: source_relevance: 1 cell not finite (NaN or infinite) of {len(TOY_SRC)}; first at "
        f'source position 1 "{TOY_SRC[1]}" = nan'
    )
    relevance[1] = np.inf
    assert not check_invariants(dataclasses.replace(a, extras={"count": np.arange(3)}), "A")  # whole numbers: finite
    assert "1 cell not finite" in check_invariants(dataclasses.replace(a, extras={"r": relevance}), "A")[0].text


def test_another_shape_is_named_and_not_compared():
    report = compare_exports(toy_export(), toy_export(layers=3))
    assert {f.what for f in report.findings} == {"shape"}
    assert "encoder: shapes differ, (2, 4, 5, 5) (A) vs (3, 4, 5, 5) (B), axes (layer, head" in report.to_text()


def test_manifest_differences_are_context_not_differences():
    a = toy_export(versions={"torch": "2.13.0"}, run={"device": "cpu", "threads": 2})
    b = toy_export(versions={"torch": "2.4.1"}, run={"device": "cuda:0", "threads": 2}, format_version=2)
    report = compare_exports(a, b)
    assert report.equal
    assert [c["key"] for c in report.context] == ["format_version", "versions.torch", "run.device"]
    assert "versions.torch: '2.13.0' (A) vs '2.4.1' (B)" in report.to_text()
    older = compare_exports(toy_export(), b)  # a file from before the run was recorded
    assert "  run: recorded in B only" in older.to_text().splitlines()


def test_json_holds_the_same_facts():
    golden = toy_export()
    report = compare_exports(golden, swap_keys(golden, "decoder", 1, 0, 3, 0, 2))
    data = json.loads(json.dumps(report.to_json()))
    assert data["equal"] is False and data["atol"] == DEFAULT_ATOL
    (finding,) = data["findings"]
    assert finding["what"] == "values" and finding["array"] == "decoder" and finding["cells_off"] == 2
    assert finding["worst"][0]["index"][:3] == [1, 0, 3] and finding["text"] == report.findings[0].text


def test_compare_paths_reads_files_and_refuses_a_file_against_a_folder(tmp_path):
    toy_export().save(tmp_path / "a.npz")
    swap_keys(toy_export(), "cross", 0, 0, 0, 0, 1).save(tmp_path / "b.npz")
    report = compare_paths(tmp_path / "a.npz", tmp_path / "b.npz")
    assert not report.equal and report.a.endswith("a.npz")
    with pytest.raises(ExportError, match="cannot compare the folder"):
        compare_paths(tmp_path / "a.npz", tmp_path)


# ---------------------------------------------------------------------------------------------
# Atlases: heads.parquet keyed on kind/layer/head


def make_atlas(folder, seed: int = 0, sentences=("the cat sat", "a dog ran")):
    rng = np.random.default_rng(seed)
    rows = [(kind, layer, head) for kind in ("encoder", "decoder", "cross") for layer in (1, 2) for head in (1, 2, 3)]
    heads = pd.DataFrame(rows, columns=["kind", "layer", "head"])
    heads["entropy"] = rng.uniform(0, 2, len(heads))
    heads["mean_distance"] = rng.uniform(0, 5, len(heads))
    heads["confidence"] = rng.uniform(0, 1, len(heads))
    folder.mkdir()
    heads.to_parquet(folder / "heads.parquet")
    # as docs/atlas.md has them: the text in inputs.parquet, a row per sentence and head in sentences.parquet
    lines = range(1, len(sentences) + 1)
    pd.DataFrame({"line": lines, "src": list(sentences)}).to_parquet(folder / "inputs.parquet")
    per_sentence = pd.DataFrame([(line, *row) for line in lines for row in rows], columns=["line", *heads.columns[:3]])
    per_sentence["queries"] = 3
    per_sentence["entropy"] = rng.uniform(0, 2, len(per_sentence)).astype(np.float32)
    per_sentence.to_parquet(folder / "sentences.parquet")
    (folder / "manifest.json").write_text(json.dumps({"model": "toy", "versions": {"torch": "2.13.0"}}))
    return folder


def rewrite_heads(folder, change):
    heads = pd.read_parquet(folder / "heads.parquet")
    heads = change(heads)
    heads.to_parquet(folder / "heads.parquet")


def test_equal_atlases_even_in_another_row_order(tmp_path):
    a, b = make_atlas(tmp_path / "a"), make_atlas(tmp_path / "b")
    rewrite_heads(b, lambda h: h.iloc[::-1])
    report = compare_atlases(a, b, DEFAULT_ATOL)
    assert report.equal, report.to_text()
    assert any(line.startswith("heads.parquet entropy: 18 rows") for line in report.checked)


def test_an_atlas_statistic_that_moved_is_named_by_head(tmp_path):
    a, b = make_atlas(tmp_path / "a"), make_atlas(tmp_path / "b")

    def nudge(h):
        row = (h["kind"] == "cross") & (h["layer"] == 2) & (h["head"] == 3)
        h.loc[row, "entropy"] += 0.01
        return h

    rewrite_heads(b, nudge)
    report = compare_paths(a, b)
    (finding,) = report.findings
    assert finding.text.startswith("heads.parquet entropy: 1 of 18 rows differ; largest |A - B| 1.00e-02")
    assert finding.details[0].startswith("cross layer 2 head 3: A ")


def test_atlas_heads_and_columns_only_on_one_side(tmp_path):
    a, b = make_atlas(tmp_path / "a"), make_atlas(tmp_path / "b")
    rewrite_heads(b, lambda h: h[h["head"] != 3].drop(columns="confidence"))
    texts = [f.text for f in compare_atlases(a, b, DEFAULT_ATOL).findings]
    assert (
        "heads.parquet: 6 heads only in A: cross layer 1 head 3, cross layer 2 head 3, decoder layer 1 head 3"
        in texts[0]
    )
    assert "heads.parquet: only A has the column 'confidence'" in texts


def test_atlases_of_other_sentences_are_not_compared_head_by_head(tmp_path):
    a = make_atlas(tmp_path / "a")
    b = make_atlas(tmp_path / "b", seed=1, sentences=("the cat sat", "a bird flew"))
    report = compare_atlases(a, b, DEFAULT_ATOL)
    assert [f.what for f in report.findings] == ["inputs", "values", "inputs", "inputs"], report.to_text()
    assert "built from different inputs: the inputs of 1 line differ" in report.findings[0].text
    assert report.findings[0].details[0] == "line 2: src 'a dog ran' (A) vs 'a bird flew' (B)"
    assert report.findings[1].subject == "sentences.parquet:entropy"  # line 1, the same text, has other numbers
    assert "rows of 1 line not compared" in report.findings[2].text and "not compared" in report.findings[3].text


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: (f / "heads.parquet").unlink(), "has no heads.parquet"),
        (lambda f: (f / "heads.parquet").write_bytes(b"PAR1 not really"), "not a readable Parquet table"),
        (lambda f: pd.DataFrame({"kind": ["encoder"]}).to_parquet(f / "heads.parquet"), "no layer, head column"),
        (lambda f: (f / "manifest.json").write_text("{"), "manifest.json is not valid JSON"),
        (lambda f: (f / "manifest.json").write_text('{"complete": false}'), "holds an unfinished atlas"),
    ],
    ids=["no heads", "not parquet", "no key columns", "bad manifest", "unfinished"],
)
def test_a_broken_atlas_is_one_clear_error(tmp_path, damage, message):
    a, b = make_atlas(tmp_path / "a"), make_atlas(tmp_path / "b")
    damage(b)
    with pytest.raises(ExportError, match=message):
        compare_paths(a, b)


def test_a_statistic_stored_as_text_or_gone_infinite_differs(tmp_path):
    """'0.5' and 0.5 print alike, so text against numbers is its own finding; an infinite gap reads inf."""
    a, b, c = make_atlas(tmp_path / "a"), make_atlas(tmp_path / "b"), make_atlas(tmp_path / "c")
    rewrite_heads(b, lambda h: h.assign(entropy=h["entropy"].astype(str)))
    (finding,) = compare_atlases(a, b, DEFAULT_ATOL).findings
    assert finding.text.startswith("heads.parquet entropy: numbers in A, ") and "in B" in finding.text
    rewrite_heads(c, lambda h: h.assign(entropy=[np.inf] + h["entropy"].tolist()[1:]))
    finding, invariant = compare_atlases(a, c, DEFAULT_ATOL).findings
    assert finding.text.endswith("largest |A - B| inf"), finding.text
    assert invariant.what == "invariant" and invariant.data == {
        "table": "heads",
        "column": "entropy",
        "file": "B",
        "rows": 1,
    }


def test_an_atlas_broken_alike_on_both_sides_is_not_equal(tmp_path):
    """NaN had equalled NaN and inf inf, in tables `load_atlas` refuses: `attnviz diff A B` said EQUAL. A statistic
    that may be undefined (induction, on a sentence with no repeated token) stays NaN on both sides, and equal."""
    folders = [make_atlas(tmp_path / "a"), make_atlas(tmp_path / "b")]
    for folder in folders:
        rewrite_heads(folder, lambda h: h.assign(entropy=[np.nan] + h["entropy"].tolist()[1:], induction=np.nan))
        sentences = pd.read_parquet(folder / "sentences.parquet")
        sentences.loc[3, "entropy"] = np.inf
        sentences.to_parquet(folder / "sentences.parquet")
    line, kind, layer, head = sentences.loc[3, ["line", "kind", "layer", "head"]]
    report = compare_paths(*folders)
    texts = [f.text for f in report.findings]
    assert [f.what for f in report.findings] == ["invariant"] * 4, report.to_text()
    assert texts[0] == (
        "invariant broken in A: sentences.parquet entropy: 1 row infinite or missing (NaN); first at "
        f"line {line}, {kind} layer {layer} head {head} = inf"
    ), texts
    assert texts[1].startswith("invariant broken in A: heads.parquet entropy: 1 row infinite or missing (NaN); first")
    assert texts[2:] == [t.replace(" in A: ", " in B: ") for t in texts[:2]]
    assert not any("induction" in t for t in texts)


@pytest.mark.parametrize(
    "extra",
    [np.array([1 + 2j]), np.zeros(2, dtype="V4"), np.zeros(2, dtype=[("x", "<f4"), ("y", "<i4")])],
    ids=["complex", "void", "records"],
)
def test_an_extra_array_of_no_real_numbers_is_one_clear_error(extra):
    """Complex values were compared by their real part alone (1+2j equal to 1+5j), void and records crashed."""
    a, b = toy_export(), toy_export()
    a, b = dataclasses.replace(a, extras={"x": extra}), dataclasses.replace(b, extras={"x": extra.copy()})
    with pytest.raises(ExportError, match="x in A holds .* values: attnviz compares real numbers and strings only"):
        compare_exports(a, b)


def test_an_infinite_or_nan_gap_reads_inf_and_shares_read_as_shares():
    golden = toy_export()
    cross = golden.cross.copy()
    cross[0, 0, 0, 0] = np.inf
    (finding,) = values_findings(compare_exports(golden, dataclasses.replace(golden, cross=cross)))
    assert finding.text.endswith("largest |A - B| inf") and "|A - B| inf" in finding.details[0], finding.text
    assert finding.data["largest"] == np.inf
    cross[0, 0, 0, 0] = np.nan
    (finding,) = values_findings(compare_exports(golden, dataclasses.replace(golden, cross=cross)))
    assert finding.text.endswith("largest |A - B| inf") and "|A - B| inf" in finding.details[0], finding.details
    every = compare_exports(golden, dataclasses.replace(golden, cross=golden.cross * 0.5))
    assert "cells differ (100%)" in values_findings(every)[0].text


def test_maps_from_another_library_are_compared_by_their_tokens():
    """Plain maps (attnviz.notebook.plain_export) have tokens and no ids: two texts with equal maps are not equal."""
    from attnviz.notebook.data import plain_export

    maps = [np.tril(np.ones((1, 2, 3, 3), np.float32)) / np.arange(1, 4, dtype=np.float32)[:, None]]
    a = plain_export(maps, ["the", "cat", "sat"], kind="decoder")
    assert compare_exports(a, plain_export(maps, ["the", "cat", "sat"], kind="decoder")).equal
    report = compare_exports(a, plain_export(maps, ["the", "dog", "sat"], kind="decoder"))
    assert not report.equal
    texts = [f.text for f in report.findings if f.what == "inputs"]
    assert any("tokens differ from position 1" in text for text in texts), texts
