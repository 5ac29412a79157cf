"""The set-up the README promises is the set-up CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set-up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_readme_has_exactly_two_setup_commands():
    app, tests = _setup_commands()
    assert app.endswith("streamlit run app.py") and "torch==2.13.0" in app
    assert "pytest" in tests and "torch==2.13.0" in tests


def test_ci_runs_the_readme_test_command():
    _, tests = _setup_commands()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == tests, "the last line of .ci/run must be the README's test command"
