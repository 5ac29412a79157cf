"""The pytest plugin: an ``attention_snapshot`` fixture and the ``--attnviz-update`` flag.

pytest loads it in every run of every project where attnviz is installed (entry point
``pytest11``), so it only registers a flag, two ini settings and a fixture: numpy, torch and the
comparison are imported when a test first takes a snapshot. ``-p no:attnviz`` switches it off.

```python
def test_cross_attention(attention_snapshot):
    bundle = attnviz.load("path/to/checkpoint", device="cpu")
    attention_snapshot(attnviz.attention(bundle, "twenty-one", "einundzwanzig"))
```

The golden file is ``__snapshots__/<test module>/<test name>.npz`` next to the test module (a
folder for an atlas). A missing golden file fails the test and names the flag; ``pytest
--attnviz-update`` writes missing golden files and rewrites those that differ, except when the
``CI`` environment variable is set, where golden files are never written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

UPDATE_FLAG = "--attnviz-update"
SNAPSHOT_DIR = "__snapshots__"
MAX_STEM_BYTES = 250  # a golden file's name without ".npz" (an atlas folder's staging copy adds ".", ".new")
_written = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnviz", "attnviz attention snapshots")
    group.addoption(
        UPDATE_FLAG,
        action="store_true",
        default=False,
        help="write missing attention golden files and rewrite those that differ (never when CI is set)",
    )
    parser.addini("attnviz_atol", "absolute tolerance of attention snapshots (default 1e-5)", default="")
    parser.addini("attnviz_rtol", "relative tolerance of attention snapshots (default 0)", default="")


def in_ci() -> bool:
    """Whether the ``CI`` environment variable is set (to anything but empty, 0 or false)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _file_name(nodeid: str) -> str:
    """A file name for a test: 'TestX::test_y[en-de]' -> 'TestX.test_y[en-de]', other characters as '_'.

    A name that lost characters so ends with 8 hex digits of the test's own id, so that parameters
    told apart only by those characters ('a/b' and 'a b') keep golden files of their own. Only the
    separators of classes and tests read as '.': a '::' inside a parameter's id is a lost character
    (ids 'x::y' and 'x.y' had shared one file).
    """
    name = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
    test, bracket, params = name.partition("[")
    kept = test.replace("::", ".") + bracket + params
    safe = re.sub(r"[^\w.\[\]=+-]", "_", kept)
    if safe != kept:
        safe += "-" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return safe


def _fit(stem: str) -> str:
    """``stem`` cut to ``MAX_STEM_BYTES`` of UTF-8, ending with 8 hex digits of the whole when cut: a file name
    is at most 255 bytes, and a long parametrize id ("a" * 300) failed with OSError "File name too long"."""
    if len(stem.encode("utf-8")) <= MAX_STEM_BYTES:
        return stem
    digest = hashlib.sha256(stem.encode("utf-8")).hexdigest()[:8]
    head = stem.encode("utf-8")[: MAX_STEM_BYTES - 9].decode("utf-8", "ignore")  # never half a character
    return f"{head}-{digest}"


def _type_name(value) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _export_problem(export) -> str | None:
    """Why the comparison cannot read ``export`` (what the test made) nor a golden file hold it, or None.

    A torch tensor, a list or a non-numeric array failed deep inside numpy or the comparison, with its traceback;
    integer maps, a batch axis or an extra array of Python objects were written as a golden file that
    ``load_export`` refuses (or that compares against nothing), on every later run.
    """
    import numpy as np

    from attnviz.errors import ExportError
    from attnviz.export import ARRAY_KINDS, KIND_WORDS, STANDARD_ARRAYS, check_contents
    from attnviz.kinds import KINDS

    if not isinstance(export.manifest, dict):
        return f"the manifest is a {_type_name(export.manifest)}, not a dict"
    try:  # what the golden file holds: a numpy number in it (np.float32(0.5)) failed inside json, on writing only
        json.dumps(export.manifest, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        return f"the manifest cannot be written as JSON: {e}"
    for name in ("src_tokens", "tgt_tokens"):
        tokens = getattr(export, name)
        if tokens is None:
            continue
        if not isinstance(tokens, (tuple, list)):
            return f"{name} is a {_type_name(tokens)}, not a tuple of tokens"
        if bad := [t for t in tokens if not isinstance(t, str)]:
            return f"{name} holds {bad[0]!r}, a {_type_name(bad[0])}, not a token (text)"
    arrays = {name: getattr(export, name) for name in (*KINDS, "src_ids", "tgt_ids")}
    arrays.update({f"the extra array {name}": value for name, value in export.extras.items()})
    for label, value in arrays.items():
        if value is None:
            continue
        if not isinstance(value, np.ndarray):
            if type(value).__module__ == "torch" and hasattr(value, "device"):
                return (
                    f"{label} is a torch.Tensor ({value.dtype} on {value.device}), not a numpy array: pass "
                    "tensor.float().cpu().numpy()"
                )
            return f"{label} is a {_type_name(value)}, not a numpy array"
        kinds = ARRAY_KINDS.get(label, "biufUS")  # an extra: what the comparison reads (no complex, no objects)
        if value.dtype.kind not in kinds:
            return f"{label} holds {value.dtype} values, not {KIND_WORDS.get(kinds, 'numbers or text')}"
    for name in export.extras:
        if name in STANDARD_ARRAYS:
            return f"the extra array {name} has the name of one of the export's own arrays"
    for name in ("src_ids", "tgt_ids"):
        if arrays[name] is not None and arrays[name].ndim != 1:
            return f"{name} is shaped {arrays[name].shape}, not a list (1-D) with one entry per token"
    try:  # a batch axis, or a manifest field of another type (src as a number), had failed inside the comparison
        check_contents(export, "this run's export", finite=False)
    except ExportError as e:
        return str(e)
    return None


def _tolerance_value(value, where: str) -> float:
    """``value`` as a tolerance: a finite number of 0 or more; the test fails with one line otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not (math.isfinite(number) and number >= 0):
        pytest.fail(f"attention_snapshot: {where} must be a finite number of 0 or more; got {value!r}", pytrace=False)
    return number


class AttentionSnapshot:
    """Compares what a test computed with its golden file; see `__call__`."""

    def __init__(self, request: pytest.FixtureRequest):
        self._request = request
        self._calls = 0
        self._golden: set[str] = set()  # the golden paths this test's snapshots compared with

    @property
    def folder(self) -> Path:
        """Where this test module's golden files live: ``__snapshots__/<module>/`` beside it."""
        return self._request.path.parent / SNAPSHOT_DIR / self._request.path.stem

    def _tolerance(self, name: str, given: float | None, default: float) -> float:
        if given is not None:
            return _tolerance_value(given, f"attention_snapshot's {name.removeprefix('attnviz_')}")
        configured = self._request.config.getini(name)
        return _tolerance_value(configured, f"the ini setting {name}") if configured else default

    def __call__(
        self, actual, name: str | None = None, *, atol: float | None = None, rtol: float | None = None, path=None
    ):
        """Compare ``actual`` with its golden file; fail the test with the readable report when they differ.

        ``actual``: an [`AttentionExport`][attnviz.export.AttentionExport], or the path of an .npz export or of
        an atlas folder. ``name`` tells apart several snapshots of one test (by default the second
        is ``<test>-2``); ``path`` puts the golden file elsewhere. ``atol`` and ``rtol`` default to
        the ini settings ``attnviz_atol`` / ``attnviz_rtol``, else 1e-5 and 0. Returns the report.
        """
        from attnviz.errors import ExportError
        from attnviz.export import AttentionExport, load_export
        from attnviz.testing.compare import DEFAULT_ATOL, compare_exports

        self._calls += 1
        atol = self._tolerance("attnviz_atol", atol, DEFAULT_ATOL)
        rtol = self._tolerance("attnviz_rtol", rtol, 0.0)
        is_atlas = False
        in_memory = isinstance(actual, AttentionExport)  # not read from a file, whose format is the file's
        if not in_memory:
            if not isinstance(actual, (str, Path)):
                raise TypeError(
                    f"attention_snapshot takes an AttentionExport or the path of an export; got {type(actual).__name__}"
                )
            actual_path = Path(actual)
            if not actual_path.exists():
                pytest.fail(f"attention_snapshot: {actual_path} does not exist", pytrace=False)
            is_atlas = actual_path.is_dir()
            unreadable = None
            try:  # what the test made must be readable before it is compared, let alone kept as golden
                if is_atlas:
                    from attnviz.testing.atlas import read_atlas

                    read_atlas(actual_path)
                else:
                    actual = load_export(actual_path)
            except ExportError as e:
                unreadable = str(e)
            if unreadable is not None:  # failed outside the except: pytest would print the ExportError above it too
                pytest.fail(
                    f"attention_snapshot: the export this test made cannot be read: {unreadable}", pytrace=False
                )
        if not is_atlas and (problem := _export_problem(actual)) is not None:
            pytest.fail(f"attention_snapshot: this run's export cannot be compared or kept: {problem}", pytrace=False)
        if in_memory and "format_version" not in actual.manifest:
            # made in memory (a plain_export, a hand-built one): compared as what the flag writes, the newest format,
            # not as "format 1", a line of context against every golden file that explains nothing
            from attnviz.export import FORMAT_VERSION

            actual = dataclasses.replace(actual, manifest={**actual.manifest, "format_version": FORMAT_VERSION})
        if name is not None and (not isinstance(name, str) or not re.fullmatch(r"[\w.=+-]+", name) or ".." in name):
            pytest.fail(
                f"attention_snapshot: name={name!r} must be letters, digits and . _ = + - (a file name in the test's "
                "snapshot folder); path= puts a golden file anywhere",
                pytrace=False,
            )
        if path is None:
            stem = _file_name(self._request.node.nodeid)
            stem += f"-{name}" if name else (f"-{self._calls}" if self._calls > 1 else "")
            stem = _fit(stem)
            golden = self.folder / (stem if is_atlas else f"{stem}.npz")
        else:  # a relative path is the project's (pytest's rootdir), wherever pytest was started
            golden = Path(path) if Path(path).is_absolute() else self._request.config.rootpath / path
        shown = self._relative(golden)
        if path is None:  # a path= given may serve several snapshots on purpose: each compares with one reference
            self._take(golden, shown)
        update = self._request.config.getoption(UPDATE_FLAG)
        if not golden.exists():
            if not update:
                pytest.fail(
                    f"no golden file {shown} for this snapshot: run pytest with {UPDATE_FLAG} to write it, "
                    "then review it and commit it",
                    pytrace=False,
                )
            self._write(actual, golden, "wrote")
            return None
        labels = (f"{shown} (golden)", str(actual_path) if is_atlas else "this run")
        unreadable = None
        try:
            if is_atlas:
                from attnviz.testing.atlas import compare_atlases

                report = compare_atlases(golden, actual_path, atol, rtol, labels)
            else:
                report = compare_exports(load_export(golden), actual, atol, rtol, labels)
        except (ExportError, IsADirectoryError, NotADirectoryError) as e:
            unreadable = str(e)
        if unreadable is not None:  # handled outside the except, so that pytest prints the one line, not a chain
            if not update:
                pytest.fail(
                    f"the golden file {shown} cannot be read: {unreadable}; rewrite it with {UPDATE_FLAG}",
                    pytrace=False,
                )
            self._write(actual, golden, "rewrote unreadable")
            return None
        if report.equal:
            return report
        if update:
            self._write(actual, golden, "updated", report.to_text())
            return report
        pytest.fail(
            f"attention snapshot differs from its golden file\n{report.to_text()}\n"
            f"if the change is intended, rerun with {UPDATE_FLAG} and review the golden file's diff",
            pytrace=False,
        )

    def _take(self, golden: Path, shown: str) -> None:
        """Fail the test when another of its snapshots has compared with ``golden``, a file named for it,
        already: with --attnviz-update each had overwritten the other's file, and the next run failed
        (name="x" twice, name="3" beside the third call's automatic "-3"). Other tests' files have other
        names (a parameter's odd characters add a digest of its id: `_file_name`)."""
        key = os.path.abspath(golden)
        if key in self._golden:
            pytest.fail(
                f"attention_snapshot: this test compares with {shown} twice; give each snapshot its own name=",
                pytrace=False,
            )
        self._golden.add(key)

    def _relative(self, path: Path) -> str:
        """``path`` as the report shows it: from the project's root where it lies inside (never resolving a link,
        which may loop)."""
        root = os.path.abspath(self._request.config.rootpath)
        absolute = os.path.abspath(path)
        return os.path.relpath(absolute, root) if absolute.startswith(root + os.sep) else str(path)

    def _write(self, actual, golden: Path, action: str, report: str = "") -> None:
        if in_ci():
            pytest.fail(
                f"refusing to write the golden file {self._relative(golden)} ({UPDATE_FLAG}) because CI is set: "
                "golden files are made on a developer's machine, reviewed and committed; unset CI to write it"
                + (f"\n{report}" if report else ""),
                pytrace=False,
            )
        from attnviz.errors import ExportError
        from attnviz.export import AttentionExport
        from attnviz.kinds import KINDS
        from attnviz.testing.compare import check_invariants

        if isinstance(actual, AttentionExport):
            broken = check_invariants(actual, "this run")
        else:  # an atlas folder, read already (it was compared, or found readable)
            from attnviz.testing.atlas import atlas_invariants, read_atlas

            broken = atlas_invariants(read_atlas(Path(actual)), "this run")
        if broken:
            maps = all(finding.subject in KINDS for finding in broken)
            pytest.fail(  # a golden file that breaks them would fail every run after, however often rewritten
                f"refusing to write the golden file {self._relative(golden)}: "
                + (
                    "this run's maps are not attention weights"
                    if maps
                    else f"this run's {'export' if isinstance(actual, AttentionExport) else 'atlas'} holds numbers "
                    "that are not finite"
                )
                + "\n"
                + "\n".join(f"- {finding.text}" for finding in broken),
                pytrace=False,
            )
        golden.parent.mkdir(parents=True, exist_ok=True)
        failure = None
        try:
            if isinstance(actual, (str, Path)):  # an atlas folder
                _replace_folder(Path(actual), golden)
            elif golden.is_dir() and not golden.is_symlink():
                raise ExportError(f"{golden} is a folder, not an export file; move it away to write the golden file")
            else:
                actual.save(golden)  # a temporary file renamed over the old one: never half a golden file
        except ExportError as e:
            failure = str(e)
        if failure is not None:  # outside the except: one line, not the ExportError and then this
            pytest.fail(
                f"attention_snapshot: cannot write the golden file {self._relative(golden)}: {failure}", pytrace=False
            )
        self._request.config.stash.setdefault(_written, []).append(f"{action} {self._relative(golden)}")


def _replace_folder(source: Path, golden: Path) -> None:
    """Put a copy of the atlas folder ``source`` at ``golden``: copied whole beside it first, then swapped
    in by renames, so that the old golden folder is only removed once the new one is complete."""
    from attnviz.errors import ExportError

    if golden.is_symlink() or (golden.exists() and not golden.is_dir()):
        raise ExportError(f"{golden} is not a folder; move it away to write the atlas golden folder")
    staged = golden.with_name(f".{golden.name}.new")
    old = golden.with_name(f".{golden.name}.old")
    for leftover in (staged, old):  # a run killed half-way before
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
    shutil.copytree(source, staged)
    if golden.exists():
        golden.rename(old)
    staged.rename(golden)
    if old.exists():
        shutil.rmtree(old)


@pytest.fixture
def attention_snapshot(request: pytest.FixtureRequest) -> AttentionSnapshot:
    """Compare an attention export with this test's golden file: ``attention_snapshot(export)``."""
    return AttentionSnapshot(request)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a pytest-xdist worker: hand the golden files it wrote to the controller, whose summary lists them."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["attnviz_written"] = session.config.stash.get(_written, [])


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it
def pytest_testnodedown(node, error) -> None:
    written = getattr(node, "workeroutput", {}).get("attnviz_written", [])
    node.config.stash.setdefault(_written, []).extend(written)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    written = config.stash.get(_written, [])
    if written:
        terminalreporter.section("attnviz snapshots")
        for line in written:
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"{len(written)} golden file(s) written: review them and commit them")
