"""The pytest plugin, run the way a user's project runs it: a throwaway test project under pytester,
with the plugin loaded from its pytest11 entry point (no -p, no conftest)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pandas as pd
import pytest

from attnviz.export import load_export

pytest_plugins = ["pytester"]

# pytester drops, when its fixture ends, every module imported since it began; pandas' Parquet
# engine registers types with pyarrow on import and refuses to do it twice. Importing it here, at
# collection, keeps it out of that count, whatever order the tests of this suite run in.
pd.io.parquet.get_engine("auto")

# A user's test file: random post-softmax maps, one head perturbed on request (TOY_PERTURB).
USER_TEST = """
import os

import numpy as np

from attnviz.export import AXES, AttentionExport

SRC = ("▁the", "▁cat", "▁sat", "▁down", "</s>")
TGT = ("<s>", "▁die", "▁Katze", "▁saß")


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def toy():
    rng = np.random.default_rng(0)
    S, T = len(SRC), len(TGT)
    future = np.triu(np.ones((T, T), bool), 1)
    cross = softmax(rng.normal(size=(2, 3, T, S)))
    if os.environ.get("TOY_PERTURB") == "head":  # layer 2, head 3, query 1: two keys swapped
        cross[1, 2, 1, [0, 3]] = cross[1, 2, 1, [3, 0]]
    if os.environ.get("TOY_PERTURB") == "tiny":
        cross = cross + np.float32(1e-6)
    return AttentionExport(
        encoder=softmax(rng.normal(size=(2, 3, S, S))),
        decoder=softmax(np.where(future, -np.inf, rng.normal(size=(2, 3, T, T)))),
        cross=cross,
        src_ids=np.arange(10, 10 + S),
        tgt_ids=np.arange(20, 20 + T),
        src_tokens=SRC,
        tgt_tokens=TGT,
        manifest={"model": "toy", "src": "the cat sat down", "tgt": "die Katze saß", "axes": AXES},
    )


def test_maps(attention_snapshot):
    attention_snapshot(toy())
"""

GOLDEN = "__snapshots__/test_user_maps/test_maps.npz"


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("TOY_PERTURB", raising=False)
    pytester.makepyfile(test_user_maps=USER_TEST)
    return pytester


def test_the_plugin_is_registered_and_its_import_loads_nothing_heavy():
    (plugin,) = [e for e in entry_points(group="pytest11") if e.name == "attnviz"]
    assert plugin.value == "attnviz.testing.plugin"
    code = "import sys, attnviz.testing.plugin; print(sorted({'torch', 'numpy', 'pandas'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_a_missing_golden_file_fails_naming_the_flag_and_writes_nothing(project):
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*no golden file {GOLDEN} for this snapshot: run pytest with --attnviz-update*"])
    assert not (project.path / GOLDEN).exists()


def test_the_flag_writes_the_golden_file_and_later_runs_pass(project):
    result = project.runpytest("--attnviz-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*attnviz snapshots*", f"wrote {GOLDEN}", "*review them and commit them*"])
    golden = load_export(project.path / GOLDEN)
    assert golden.cross.shape == (2, 3, 4, 5) and golden.src_tokens[1] == "▁cat"
    project.runpytest().assert_outcomes(passed=1)


def test_a_perturbed_head_fails_with_the_readable_report(project, monkeypatch):
    project.runpytest("--attnviz-update").assert_outcomes(passed=1)
    before = (project.path / GOLDEN).read_bytes()
    monkeypatch.setenv("TOY_PERTURB", "head")
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*attention snapshot differs from its golden file",
            f"A: {GOLDEN} (golden)",
            "B: this run",
            "tolerance: |A - B| <= 1e-05 + 0 * |B| per cell",
            "DIFFERENT: 1 finding",
            "- cross: 2 of 120 cells differ (1.7%) in 1 of 6 heads; largest |A - B| *",
            '    layer 2, head 3: 2 of 20 cells; worst at query 1 "▁die", key ? "*": A *, B *, |A - B| *',
            "equal within the tolerance:",
            "  encoder: 150 cells, largest |A - B| 0.0e+00",
            "*rerun with --attnviz-update and review the golden file's diff",
        ]
    )
    out = result.stdout.str()
    assert "Traceback" not in out and "def test_maps" not in out  # the report, not a stack of frames
    assert (project.path / GOLDEN).read_bytes() == before


def test_the_flag_rewrites_a_golden_file_that_differs(project, monkeypatch):
    project.runpytest("--attnviz-update").assert_outcomes(passed=1)
    monkeypatch.setenv("TOY_PERTURB", "head")
    result = project.runpytest("--attnviz-update")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"updated {GOLDEN}"])
    project.runpytest().assert_outcomes(passed=1)
    monkeypatch.delenv("TOY_PERTURB")
    project.runpytest().assert_outcomes(failed=1)


def test_equal_within_the_tolerance_passes_and_the_ini_tolerance_applies(project, monkeypatch):
    project.runpytest("--attnviz-update").assert_outcomes(passed=1)
    monkeypatch.setenv("TOY_PERTURB", "tiny")
    project.runpytest().assert_outcomes(passed=1)
    project.makeini("[pytest]\nattnviz_atol = 1e-7\n")
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["tolerance: |A - B| <= 1e-07 + 0 * |B| per cell", "- cross: 120 of 120 cells differ*"])


def test_under_ci_golden_files_are_never_written(project, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = project.runpytest("--attnviz-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*refusing to write the golden file {GOLDEN} (--attnviz-update) because CI is set*"])
    assert not (project.path / GOLDEN).exists()

    monkeypatch.delenv("CI")
    project.runpytest("--attnviz-update").assert_outcomes(passed=1)
    before = (project.path / GOLDEN).read_bytes()
    monkeypatch.setenv("CI", "1")
    monkeypatch.setenv("TOY_PERTURB", "head")
    result = project.runpytest("--attnviz-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*because CI is set*", "- cross: 2 of 120 cells differ*"])
    assert (project.path / GOLDEN).read_bytes() == before


def test_names_of_several_snapshots_and_parametrized_tests(project):
    project.makepyfile(
        test_user_names="""
        import pytest
        from test_user_maps import toy

        @pytest.mark.parametrize("case", ["a", "b"])
        def test_p(attention_snapshot, case):
            attention_snapshot(toy())
            attention_snapshot(toy())
            attention_snapshot(toy(), name="cross")

        class TestGroup:
            def test_m(self, attention_snapshot):
                attention_snapshot(toy())
        """
    )
    project.runpytest("test_user_names.py", "--attnviz-update").assert_outcomes(passed=3)
    written = sorted(p.name for p in (project.path / "__snapshots__" / "test_user_names").iterdir())
    assert written == [
        "TestGroup.test_m.npz",
        "test_p[a]-2.npz",
        "test_p[a]-cross.npz",
        "test_p[a].npz",
        "test_p[b]-2.npz",
        "test_p[b]-cross.npz",
        "test_p[b].npz",
    ]


def test_a_snapshot_of_a_shipped_model_and_of_an_atlas_folder(project, monkeypatch):
    project.makepyfile(
        test_user_model="""
        import attnviz

        def test_reverse(attention_snapshot):
            bundle = attnviz.load("reverse", device="cpu")
            attention_snapshot(attnviz.attention(bundle, "a b c d"))
        """,
        test_user_atlas="""
        import os
        from pathlib import Path

        import pandas as pd

        def test_atlas(attention_snapshot, tmp_path):
            heads = pd.DataFrame({"kind": ["cross"] * 2, "layer": [1, 1], "head": [1, 2], "entropy": [0.5, 1.0]})
            heads.loc[1, "entropy"] += float(os.environ.get("TOY_SHIFT", "0"))
            heads.to_parquet(tmp_path / "heads.parquet")
            attention_snapshot(tmp_path)
        """,
    )
    project.runpytest("test_user_model.py", "test_user_atlas.py", "--attnviz-update").assert_outcomes(passed=2)
    assert (project.path / "__snapshots__/test_user_atlas/test_atlas/heads.parquet").is_file()
    assert load_export(project.path / "__snapshots__/test_user_model/test_reverse.npz").src_tokens[:2] == ("▁a", "▁b")
    project.runpytest("test_user_model.py", "test_user_atlas.py").assert_outcomes(passed=2)
    monkeypatch.setenv("TOY_SHIFT", "0.25")
    result = project.runpytest("test_user_atlas.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "A: __snapshots__/test_user_atlas/test_atlas (golden)",
            "- heads.parquet entropy: 1 of 2 rows differ; largest |A - B| 2.50e-01",
            "    cross layer 1 head 2: A 1, B 1.25, |A - B| 2.50e-01",
        ]
    )
    monkeypatch.setenv("TOY_SHIFT", "inf")  # an atlas load_atlas refuses had been kept as golden
    result = project.runpytest("test_user_atlas.py", "--attnviz-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*refusing to write the golden file __snapshots__/test_user_atlas/test_atlas: this run's atlas holds "
            "numbers that are not finite",
            "- invariant broken in this run: heads.parquet entropy: 1 row infinite or missing (NaN); first at cross "
            "layer 1 head 2 = inf",
        ]
    )
    golden = pd.read_parquet(project.path / "__snapshots__/test_user_atlas/test_atlas/heads.parquet")
    assert golden["entropy"].tolist() == [0.5, 1.0], "the golden atlas is kept as it was"


def test_an_unreadable_export_from_the_test_is_not_blamed_on_the_golden_file(project):
    project.makepyfile(
        test_user_file="""
        def test_file(attention_snapshot, tmp_path):
            (tmp_path / "maps.npz").write_bytes(b"PK broken")
            attention_snapshot(tmp_path / "maps.npz")
        """
    )
    result = project.runpytest("test_user_file.py", "--attnviz-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*the export this test made cannot be read: *maps.npz is not a readable attnviz export*"]
    )
    assert not (project.path / "__snapshots__").exists()


def test_the_plugin_can_be_switched_off(project):
    result = project.runpytest("-p", "no:attnviz")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'attention_snapshot' not found*"])


def test_bad_tolerances_names_and_paths_are_one_clear_error(project):
    """A tolerance that is not a number of 0 or more (inf passed every change) is a usage error; a name= is a file
    name in the snapshot folder, never a path out of it; a relative path= is the project's, wherever pytest runs."""
    project.makepyfile(
        test_user_args="""
        import pytest
        from test_user_maps import toy

        @pytest.mark.parametrize("atol", ["abc", -1.0, float("nan"), True])
        def test_atol(attention_snapshot, atol):
            attention_snapshot(toy(), atol=atol)

        def test_name(attention_snapshot):
            attention_snapshot(toy(), name="../../escaped")

        def test_path(attention_snapshot):
            attention_snapshot(toy(), path="golden/relative.npz")
        """
    )
    result = project.runpytest("test_user_args.py", "--attnviz-update")
    result.assert_outcomes(passed=1, errors=0, failed=5)
    result.stdout.fnmatch_lines(["*attention_snapshot's atol must be a finite number of 0 or more; got 'abc'*"])
    result.stdout.fnmatch_lines(["*name='../../escaped' must be letters, digits and*"])
    assert not list(project.path.parent.glob("escaped*")) and (project.path / "golden" / "relative.npz").is_file()
    project.makeini("[pytest]\nattnviz_atol = inf\n")
    result = project.runpytest("test_user_maps.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the ini setting attnviz_atol must be a finite number of 0 or more; got 'inf'*"])
    assert "Traceback" not in result.stdout.str()


def test_parameters_told_apart_by_odd_characters_keep_their_own_golden_files(project):
    project.makepyfile(
        test_user_ids="""
        import pytest
        from test_user_maps import toy

        @pytest.mark.parametrize("case", ["a/b", "a_b", "a b", "x::y", "x.y"])  # '::' had read as '.'
        def test_p(attention_snapshot, case):
            attention_snapshot(toy())
        """
    )
    project.runpytest("test_user_ids.py", "--attnviz-update").assert_outcomes(passed=5)
    written = sorted(p.name for p in (project.path / "__snapshots__" / "test_user_ids").iterdir())
    assert len(written) == 5 and {"test_p[a_b].npz", "test_p[x.y].npz"} <= set(written), written
    project.runpytest("test_user_ids.py").assert_outcomes(passed=5)


def test_two_snapshots_named_for_one_golden_file_fail_rather_than_overwrite_each_other(project):
    """Each printed "wrote" and then "updated" for the same file, and the next plain run failed."""
    project.makepyfile(
        test_user_names="""
        import dataclasses
        from test_user_maps import toy

        def test_same_name(attention_snapshot):
            attention_snapshot(toy(), name="x")
            attention_snapshot(dataclasses.replace(toy(), manifest={"model": "other"}), name="x")

        def test_a_name_the_count_gives(attention_snapshot):
            attention_snapshot(toy(), name="3")
            attention_snapshot(toy())
            attention_snapshot(toy())  # the third: "-3"

        def test_one_path_for_two_on_purpose(attention_snapshot):
            attention_snapshot(toy(), path="golden/shared.npz")
            attention_snapshot(toy(), path="golden/shared.npz")
        """
    )
    result = project.runpytest("test_user_names.py", "--attnviz-update")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*attention_snapshot: this test compares with __snapshots__/test_user_names/test_same_name-x.npz twice; "
            "give each snapshot its own name=",
            "*attention_snapshot: this test compares with "
            "__snapshots__/test_user_names/test_a_name_the_count_gives-3.npz twice; give each snapshot its own name=",
        ],
        consecutive=False,
    )


def test_update_refuses_to_keep_maps_that_are_not_attention_weights(project):
    project.makepyfile(
        test_user_bad="""
        import dataclasses
        from test_user_maps import toy

        def test_rows(attention_snapshot):
            export = toy()
            attention_snapshot(dataclasses.replace(export, cross=export.cross * 0.5))
        """
    )
    result = project.runpytest("test_user_bad.py", "--attnviz-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*refusing to write the golden file*: this run's maps are not attention weights*"])
    assert not (project.path / "__snapshots__" / "test_user_bad").exists()


def test_update_refuses_to_keep_an_extra_that_is_not_finite(project):
    """It had been written, and every later run passed: NaN equals NaN in the comparison."""
    project.makepyfile(
        test_user_nan="""
        import dataclasses
        import numpy as np
        from test_user_maps import toy

        def test_relevance(attention_snapshot):
            attention_snapshot(dataclasses.replace(toy(), extras={"relevance": np.array([0.5, np.nan], np.float32)}))
        """
    )
    result = project.runpytest("test_user_nan.py", "--attnviz-update")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*refusing to write the golden file*: this run's export holds numbers that are not finite",
            "- invariant broken in this run: relevance: 1 cell not finite (NaN or infinite) of 2; first at axis 0 1 = "
            "nan",
        ]
    )
    assert not (project.path / "__snapshots__" / "test_user_nan").exists()


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_the_update_summary_lists_what_xdist_workers_wrote(project):
    pytest.importorskip("xdist")
    result = project.runpytest("-n", "2", "-p", "xdist", "--attnviz-update")
    result.stdout.fnmatch_lines(["*attnviz snapshots*", f"wrote {GOLDEN}", "1 golden file(s) written*"])


def test_maps_that_are_not_numpy_attention_are_one_clear_line_and_never_kept(project):
    """A torch tensor (bfloat16, on any device), a list, a batch axis, integer maps, an extra of Python objects, a
    manifest with a numpy number, a field of another type or tokens that are not text failed deep inside numpy, json
    or the comparison, or were written as a golden file that no later run could read."""
    project.makepyfile(
        test_user_kinds="""
        import dataclasses

        import numpy as np
        import pytest
        import torch
        from test_user_maps import toy

        CASES = {
            "tensor": lambda e: {"cross": torch.from_numpy(e.cross)},
            "bfloat16": lambda e: {"cross": torch.from_numpy(e.cross).bfloat16()},
            "list": lambda e: {"cross": e.cross.tolist()},
            "batch": lambda e: {"cross": e.cross[None]},
            "two-d": lambda e: {"cross": e.cross[0, 0]},
            "ints": lambda e: {"cross": (e.cross > 0.5).astype(np.int64)},
            "objects": lambda e: {"extras": {"score": np.array([{}], dtype=object)}},
            "complex": lambda e: {"extras": {"score": np.array([1j])}},
            "ids": lambda e: {"src_ids": e.src_ids.astype(np.float32)},
            "clash": lambda e: {"extras": {"cross": e.cross}},
            "manifest": lambda e: {"manifest": None},
            "json": lambda e: {"manifest": {**e.manifest, "temperature": np.float32(0.5)}},
            "tokens": lambda e: {"src_tokens": tuple(range(5))},
            "src": lambda e: {"manifest": {**e.manifest, "src": 5}},
            "truncated": lambda e: {"manifest": {**e.manifest, "tgt_truncated": "false"}},
            "no-layers": lambda e: {"cross": e.cross[:0]},
        }

        @pytest.mark.parametrize("case", CASES)
        def test_kind(attention_snapshot, case):
            export = toy()
            attention_snapshot(dataclasses.replace(export, **CASES[case](export)))
        """
    )
    for flag in ((), ("--attnviz-update",)):
        result = project.runpytest("test_user_kinds.py", *flag)
        result.assert_outcomes(failed=16)
        out = result.stdout.str()
        assert "Traceback" not in out and "Error: " not in out and "attnviz/testing" not in out, out
        assert out.count("attention_snapshot: this run's export cannot be compared or kept:") == 16, out
        result.stdout.fnmatch_lines(
            [
                "*cross is a torch.Tensor (torch.float32 on cpu), not a numpy array: pass tensor.float().cpu().numpy()",
                "*cross is a torch.Tensor (torch.bfloat16 on cpu), not a numpy array*",
                "*cross is a list, not a numpy array*",
                "*its cross maps are shaped (1, 2, 3, 4, 5), not (layer, head, query, key)*",
                "*its cross maps are shaped (4, 5), not (layer, head, query, key)*",
                "*cross holds int64 values, not real floating-point numbers*",
                "*the extra array score holds object values, not numbers or text*",
                "*the extra array score holds complex128 values, not numbers or text*",
                "*src_ids holds float32 values, not integers*",
                "*the extra array cross has the name of one of the export's own arrays*",
                "*the manifest is a NoneType, not a dict*",
                "*the manifest cannot be written as JSON: Object of type float32 is not JSON serializable*",
                "*src_tokens holds 0, a int, not a token (text)*",
                "*its manifest's src is 5, not a text or null*",
                "*its manifest's tgt_truncated is 'false', not true, false or a whole number*",
                "*its cross maps have no layer or no head (shaped (0, 3, *))*",
            ],
            consecutive=False,
        )
    assert not (project.path / "__snapshots__" / "test_user_kinds").exists()


def test_an_unreadable_golden_file_is_one_message_not_a_chain_of_two(project):
    project.runpytest("--attnviz-update").assert_outcomes(passed=1)
    (project.path / GOLDEN).write_bytes(b"PK truncated")
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"the golden file {GOLDEN} cannot be read: *; rewrite it with --attnviz-update"])
    assert "During handling" not in result.stdout.str() and result.stdout.str().count("is not a readable") == 1


def test_a_long_parameter_id_keeps_a_golden_file_of_its_own(project):
    """A file name is at most 255 bytes: a long id failed with OSError "File name too long", on reading and writing."""
    project.makepyfile(
        test_user_long="""
        import pytest
        from test_user_maps import toy

        @pytest.mark.parametrize("case", [1, 2, 3], ids=["a" * 300, "a" * 299 + "b", "ä" * 200])
        def test_p(attention_snapshot, case):
            attention_snapshot(toy())
            attention_snapshot(toy())
        """
    )
    result = project.runpytest("test_user_long.py")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["*no golden file __snapshots__/test_user_long/test_p[[]aaa*"])
    project.runpytest("test_user_long.py", "--attnviz-update").assert_outcomes(passed=3)
    written = sorted(p.name for p in (project.path / "__snapshots__" / "test_user_long").iterdir())
    assert len(written) == 6 and all(len(name.encode()) <= 255 for name in written), written
    project.runpytest("test_user_long.py").assert_outcomes(passed=3)


def test_long_tokens_and_manifest_values_are_cut_in_the_report(project, monkeypatch):
    """A golden file may hold a token or a manifest value of a megabyte (up to the manifest's million characters):
    the report printed each whole, twice in a row for a changed token."""
    project.makepyfile(
        test_user_long_values="""
        import dataclasses
        import os

        from test_user_maps import SRC, toy

        def test_values(attention_snapshot):
            export = toy()
            if os.environ.get("TOY_PERTURB") == "long":
                manifest = {**export.manifest, "model": "m" * 500_000}
                export = dataclasses.replace(export, src_tokens=("x" * 1_000_000, *SRC[1:]), manifest=manifest)
            attention_snapshot(export)
        """
    )
    project.runpytest("test_user_long_values.py", "--attnviz-update").assert_outcomes(passed=1)
    monkeypatch.setenv("TOY_PERTURB", "long")
    result = project.runpytest("test_user_long_values.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            '    B (5 tokens): 0:"xxx*"... (1,000,000 characters) 1:"▁cat" *',
            "  model: 'toy' (A) vs 'mmm*... (500,002 characters) (B)",
        ]
    )
    assert len(result.stdout.str()) < 20_000


def test_an_export_made_in_the_test_is_not_reported_as_an_old_file_format(project, monkeypatch):
    """An export built in memory (the toy's, a notebook's plain_export) has no format_version; it was reported as
    format 1 against its golden file's, a line of context on every failure that explained nothing."""
    project.runpytest("--attnviz-update").assert_outcomes(passed=1)
    monkeypatch.setenv("TOY_PERTURB", "head")
    result = project.runpytest()
    result.assert_outcomes(failed=1)
    assert "format_version" not in result.stdout.str() and "context (" not in result.stdout.str()
