"""`attnviz diff` on real atlas folders: inputs from inputs.parquet and the manifest, statistics row by row."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from attnviz.cli import main
from attnviz.testing.atlas import compare_atlases

LINES = ["a b c d", "d c b a", "", "b b a"]


@pytest.fixture(scope="module")
def atlases(tmp_path_factory):
    """Three atlases of the reverse model: A (fp32), BF (bf16, same corpus), C (line 4 changed by one token)."""
    root = tmp_path_factory.mktemp("atlases")
    (root / "c.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    (root / "c2.txt").write_text("\n".join([*LINES[:3], "b b c"]) + "\n", encoding="utf-8")
    for name, corpus, extra in (("A", "c.txt", []), ("BF", "c.txt", ["--precision", "bf16"]), ("C", "c2.txt", [])):
        args = ["atlas", "--model", "reverse", "--corpus", str(root / corpus), "--out", str(root / name), *extra]
        assert main([*args, "--device", "cpu"]) in (0, None)
    return root


def copy_of(atlases, tmp_path, name="A"):
    return shutil.copytree(atlases / name, tmp_path / f"{name}-copy")


def rewrite(folder, table, change):
    path = folder / f"{table}.parquet"
    change(pd.read_parquet(path)).to_parquet(path)


def rewrite_manifest(folder, change):
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def test_a_bf16_atlas_of_the_same_corpus_differs_in_statistics_not_in_inputs(atlases):
    report = compare_atlases(atlases / "A", atlases / "BF", atol=1e-5)
    assert not report.equal
    assert [f for f in report.findings if f.what == "inputs"] == [], report.to_text()
    subjects = {f.subject for f in report.findings}
    assert {"sentences.parquet:entropy", "heads.parquet:entropy"} <= subjects, report.to_text()
    (entropy,) = [f for f in report.findings if f.subject == "sentences.parquet:entropy"]
    assert entropy.details[0].startswith("line "), entropy.details  # named by its keys, never "sentence row 52"
    assert " layer " in entropy.details[0] and " head " in entropy.details[0]
    assert "sentence row" not in report.to_text()
    loose = compare_atlases(atlases / "A", atlases / "BF", atol=0.05)
    assert loose.equal, loose.to_text()


def test_rows_and_columns_of_sentences_parquet_in_another_order_are_equal(atlases, tmp_path):
    b = copy_of(atlases, tmp_path)
    rewrite(b, "sentences", lambda s: s.iloc[::-1, ::-1].reset_index(drop=True))
    rewrite(b, "inputs", lambda s: s.iloc[::-1].reset_index(drop=True))
    report = compare_atlases(atlases / "A", b, atol=1e-5)
    assert report.equal, report.to_text()


def test_a_sentence_statistic_that_moved_is_named_by_line_kind_layer_and_head(atlases, tmp_path):
    b = copy_of(atlases, tmp_path)

    def nudge(s):
        row = (s["line"] == 2) & (s["kind"] == "decoder") & (s["layer"] == 1) & (s["head"] == 3)
        s.loc[row, "entropy"] += 0.01
        return s

    rewrite(b, "sentences", nudge)
    (finding,) = compare_atlases(atlases / "A", b, atol=1e-4).findings
    assert finding.subject == "sentences.parquet:entropy"
    assert finding.text.startswith("sentences.parquet entropy: 1 of 72 rows differ"), finding.text
    assert finding.details[0].startswith("line 2, decoder layer 1 head 3: A "), finding.details


def test_sentence_rows_and_heads_only_one_side_has_are_listed(atlases, tmp_path):
    b = copy_of(atlases, tmp_path)
    rewrite(b, "sentences", lambda s: s[~((s["kind"] == "cross") & (s["head"] == 4))])
    rewrite(b, "heads", lambda h: h[~((h["kind"] == "cross") & (h["head"] == 4))])
    report = compare_atlases(atlases / "A", b, atol=1e-5)
    texts = [f.text for f in report.findings]
    assert any(t.startswith("sentences.parquet: 6 rows only in A: line 1, cross layer 1 head 4") for t in texts), texts
    assert any(t.startswith("heads.parquet: 2 heads only in A: cross layer 1 head 4") for t in texts), texts


def test_another_corpus_is_a_difference_of_inputs_whatever_the_tolerance(atlases, capsys):
    report = compare_atlases(atlases / "A", atlases / "C", atol=1)
    assert not report.equal, report.to_text()
    inputs = [f for f in report.findings if f.what == "inputs"]
    (lines,) = [f for f in inputs if f.subject == "inputs.parquet"]
    assert lines.details == ("line 4: src 'b b a' (A) vs 'b b c' (B)",), report.to_text()
    assert any("corpus" in f.text and "sha256" in f.text for f in inputs), report.to_text()
    assert main(["diff", str(atlases / "A"), str(atlases / "C"), "--atol", "1"]) == 1
    assert "EQUAL" not in capsys.readouterr().out


def test_another_corpus_hash_alone_is_a_difference_of_inputs(atlases, tmp_path):
    b = copy_of(atlases, tmp_path)
    rewrite_manifest(b, lambda m: m["corpus"].update(sha256="0" * 64))
    (finding,) = compare_atlases(atlases / "A", b, atol=1e-5).findings
    assert finding.what == "inputs" and "corpus" in finding.text and "0000000000" in finding.text, finding.text


def test_the_context_says_what_each_atlas_was_built_from(atlases, tmp_path):
    report = compare_atlases(atlases / "A", atlases / "BF", atol=0.05)
    assert "  precision: 'fp32' (A) vs 'bf16' (B)" in report.to_text().splitlines(), report.to_text()
    b = copy_of(atlases, tmp_path)

    def other_run(m):
        m["corpus"]["file"] = "renamed.txt"
        m.update(engine="ray", device="cuda:0", limit=10, unknown="kept", targets={"file": "t.txt", "sha256": None})

    rewrite_manifest(b, other_run)
    keys = [c["key"] for c in compare_atlases(atlases / "A", b, atol=1e-5).context]
    for key in ("corpus.file", "targets.file", "limit", "unknown", "engine", "device"):
        assert key in keys, keys


def test_integer_and_flag_columns_are_compared_exactly(atlases, tmp_path):
    b = copy_of(atlases, tmp_path)
    rewrite(b, "sentences", lambda s: s.assign(queries=s["queries"] + (s.index == 5)))
    rewrite(b, "heads", lambda h: h.assign(sentences=h["sentences"] + (h.index == 0)))
    report = compare_atlases(atlases / "A", b, atol=1)
    subjects = {f.subject for f in report.findings}
    assert {"sentences.parquet:queries", "heads.parquet:sentences"} <= subjects, report.to_text()
    c = copy_of(atlases, tmp_path, "BF")
    rewrite(c, "sentences", lambda s: s.assign(positional=s["positional"].where(s.index != 0, ~s["positional"])))
    flagged = compare_atlases(atlases / "BF", c, atol=1)
    assert [f.subject for f in flagged.findings] == ["sentences.parquet:positional"], flagged.to_text()


def test_the_equal_section_names_every_file_compared(atlases, tmp_path):
    b = copy_of(atlases, tmp_path)
    report = compare_atlases(atlases / "A", b, atol=1e-5)
    assert report.equal
    for table in (
        "manifest.json corpus: the same file, sha256 ",
        "inputs.parquet",
        "sentences.parquet",
        "heads.parquet",
    ):
        assert any(line.startswith(table) for line in report.checked), report.checked
    assert any(line.startswith("sentences.parquet entropy: 72 rows") for line in report.checked), report.checked


def test_the_cli_exit_codes_on_atlases(atlases, tmp_path, capsys):
    b = copy_of(atlases, tmp_path)
    assert main(["diff", str(atlases / "A"), str(b)]) == 0
    assert main(["diff", str(atlases / "A"), str(atlases / "BF")]) == 1
    (b / "heads.parquet").unlink()
    assert main(["diff", str(atlases / "A"), str(b)]) == 2
    capsys.readouterr()


def test_a_line_only_one_side_has_is_named_and_its_rows_are_left_out(atlases, tmp_path):
    b = copy_of(atlases, tmp_path)  # as if built with --limit 2
    rewrite(b, "inputs", lambda s: s[s["line"] != 4])
    rewrite(b, "sentences", lambda s: s[s["line"] != 4])
    report = compare_atlases(atlases / "A", b, atol=1e-5)
    assert [(f.what, f.subject) for f in report.findings] == [
        ("inputs", "inputs.parquet"),
        ("inputs", "sentences.parquet"),
        ("inputs", "heads.parquet"),
        ("inputs", "distances.parquet"),
    ], report.to_text()
    assert report.findings[0].details == ("line 4: only in A ('b b a')",)
    assert "sentences.parquet entropy: 48 rows, largest |A - B| 0.0e+00" in report.checked


def test_without_inputs_parquet_the_corpus_hash_decides(atlases, tmp_path):
    """An atlas folder without inputs.parquet (a hand-made one): its statistics are compared unless the
    manifests hash the corpus differently, and then nothing says which lines to trust."""
    a, b = copy_of(atlases, tmp_path), copy_of(atlases, tmp_path, "BF")
    (b / "inputs.parquet").unlink()
    report = compare_atlases(a, b, atol=0.05)
    assert [f.text for f in report.findings] == ["inputs.parquet: only A has it"], report.to_text()
    (a / "inputs.parquet").unlink()
    assert compare_atlases(a, b, atol=0.05).equal
    rewrite_manifest(b, lambda m: m["corpus"].update(sha256="0" * 64))
    report = compare_atlases(a, b, atol=0.05)
    assert [f.subject for f in report.findings] == ["manifest.json:corpus", "sentences.parquet"], report.to_text()
    assert "not compared" in report.findings[1].text


def test_a_divergence_between_two_heads_that_moved_is_named_by_the_pair(atlases, tmp_path):
    """distances.parquet is compared as heads.parquet is: a changed divergence is a finding, named by its pair."""
    b = copy_of(atlases, tmp_path)

    def nudge(d):
        pair = (d["kind"] == "encoder") & (d["layer_a"] == 1) & (d["head_a"] == 1)
        pair &= (d["layer_b"] == 2) & (d["head_b"] == 2)
        assert pair.sum() == 1
        d.loc[pair, "js_divergence"] += 0.01
        return d.iloc[::-1].reset_index(drop=True)  # rows in another order are still matched on their keys

    rewrite(b, "distances", nudge)
    (finding,) = compare_atlases(atlases / "A", b, atol=1e-4).findings
    assert finding.subject == "distances.parquet:js_divergence", finding
    assert finding.text.startswith("distances.parquet js_divergence: 1 of "), finding.text
    assert finding.details[0].startswith("encoder layer 1 head 1 and layer 2 head 2: A "), finding.details
    assert compare_atlases(atlases / "A", b, atol=0.05).equal


def test_distances_are_compared_in_bf16_and_named_among_the_equal_files(atlases, tmp_path):
    report = compare_atlases(atlases / "A", atlases / "BF", atol=1e-5)
    assert "distances.parquet:js_divergence" in {f.subject for f in report.findings}, report.to_text()
    equal = compare_atlases(atlases / "A", copy_of(atlases, tmp_path), atol=1e-5)
    assert any(line.startswith("distances.parquet js_divergence: ") for line in equal.checked), equal.checked


def test_distances_only_one_side_has_and_distances_of_other_inputs(atlases, tmp_path):
    """A pair only one side has is listed; where lines differ distances are not compared (they pool every
    sentence, as heads.parquet does); a folder without distances.parquet is said, not an error."""
    b = copy_of(atlases, tmp_path)
    rewrite(b, "distances", lambda d: d[~((d["layer_a"] == 2) & (d["head_a"] == 3))])
    report = compare_atlases(atlases / "A", b, atol=1e-5)
    assert [f.subject for f in report.findings] == ["distances.parquet"], report.to_text()
    assert "only in A: " in report.findings[0].text and " layer 2 head 3 and " in report.findings[0].text
    (b / "distances.parquet").unlink()
    report = compare_atlases(atlases / "A", b, atol=1e-5)
    assert [f.text for f in report.findings] == ["distances.parquet: only A has it"], report.to_text()
    report = compare_atlases(atlases / "A", atlases / "C", atol=1e-5)
    assert ("inputs", "distances.parquet") in {(f.what, f.subject) for f in report.findings}, report.to_text()
