"""Every public name is written once (attnviz.public), and attnviz and attnviz.api agree on it."""

from __future__ import annotations

import ast
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnviz
import attnviz.api as api
from attnviz.public import PUBLIC, WHERE

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_and_the_api_expose_the_one_list():
    assert attnviz.__all__ == sorted([*WHERE, "__version__"])
    assert api.__all__ == list(PUBLIC["attnviz.api"])
    for name, module in WHERE.items():
        assert getattr(attnviz, name) is getattr(importlib.import_module(module), name), name
    assert len(WHERE) == sum(len(names) for names in PUBLIC.values()), "a name listed twice"


def test_every_public_function_and_class_of_api_py_is_listed():
    tree = ast.parse((ROOT / "attnviz" / "api.py").read_text())
    defined = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")
    }
    assert defined <= set(PUBLIC["attnviz.api"]), defined - set(PUBLIC["attnviz.api"])


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_a_new_api_function_is_its_definition_plus_one_line(tmp_path):
    """In a copy of the package: define a function in api.py, add its name to public.py; nothing else."""
    copy = tmp_path / "attnviz"
    shutil.copytree(ROOT / "attnviz", copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "api.py").open("a") as f:
        f.write('\n\ndef shout(bundle, text: str) -> str:\n    """The text, louder."""\n    return text.upper()\n')
    public = (copy / "public.py").read_text()
    (copy / "public.py").write_text(
        public.replace('        "translate",\n', '        "translate",\n        "shout",\n', 1)
    )
    check = (
        "import attnviz, attnviz.api as api; "
        "assert 'shout' in attnviz.__all__ and 'shout' in api.__all__; "
        "assert attnviz.shout(None, 'hi') == 'HI'; print('ok')"
    )
    run = subprocess.run(
        [sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
