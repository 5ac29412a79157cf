"""The import contracts in pyproject.toml hold, and they can fail: a forbidden import turns them red.

The README's test command runs `lint-imports` on the tree itself; these tests run it on a copy of
the tree with one forbidden import added per contract, so a contract that silently stopped
checking anything would show here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")

# (file, line added at its end, the contract it breaks)
VIOLATIONS = {
    "core imports streamlit": ("attnviz/model.py", "import streamlit", "Only the app and its pages import Streamlit"),
    "api imports the app": ("attnviz/api.py", "import attnviz.app", "Layers:"),
    "the testing wing imports the CLI above it": ("attnviz/testing/compare.py", "import attnviz.cli", "Layers:"),
    "a lesson imports the importers": (
        "attnviz/lessons/mechanics.py",
        "import attnviz.checkpoints.files",
        "The lessons and the checkpoint importers know nothing of each other",
    ),
    "a method imports the importers": (
        "attnviz/methods/norm.py",
        "import attnviz.checkpoints.files",
        "The research methods use the core only, not the importers or training",
    ),
}


def _lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # the copy, not the installed package, is analysed
    return subprocess.run([str(LINT)], cwd=tree, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def tree(tmp_path) -> Path:
    if not LINT.exists():
        pytest.skip("import-linter is not installed: pip install -e '.[test]'")
    copy = tmp_path / "tree"
    for name in ("attnviz", "pages"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def test_the_contracts_hold_on_the_tree(tree):
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


@pytest.mark.parametrize("violation", VIOLATIONS)
def test_a_forbidden_import_breaks_its_contract(tree, violation):
    file, line, contract = VIOLATIONS[violation]
    with open(tree / file, "a") as f:
        f.write(f"\n{line}\n")
    result = _lint(tree)
    assert result.returncode != 0, result.stdout
    broken = [ln for ln in result.stdout.splitlines() if ln.endswith("BROKEN")]
    assert len(broken) == 1 and "1 broken" in result.stdout, result.stdout
    assert contract in result.stdout.split("Broken contracts", 1)[1], result.stdout
