"""What the manual says the shipped models answer, they answer: every line of README.md and docs/*.md
that shows a shipped model's translation beside its command, as

    attnviz translate --model en-de [flags] "TEXT"        # OUTPUT
    attnviz.translate(bundle, "TEXT"[, ...])  # 'OUTPUT'    (on a page where bundle = attnviz.load("en-de"))

is run and its output compared, and every table of shipped models states the held-out figure and
training time of the model's config.json. A retrained model changes such lines; this test names each
one to update (the ablation example had shown a head whose loss no longer changed anything).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

import attnviz
from attnviz.checkpoints.catalog import pretrained_dir
from attnviz.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHIPPED = {p.name for p in pretrained_dir().iterdir() if p.is_dir()}
COMMAND = re.compile(r"^attnviz translate (?P<args>.+?)\s+#\s*(?P<out>.+?)\s*$")
CALL = re.compile(r"^attnviz\.translate\((?P<args>bundle\b.*)\)\s+#\s*'(?P<out>.*)'\s*$")
LOADED = 'bundle = attnviz.load("en-de")'


def _lines(pattern: re.Pattern) -> list:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            if m := pattern.match(line.strip()):
                found.append(pytest.param(page, m["args"], m["out"], id=f"{page.relative_to(ROOT)}:{number}"))
    return found


def _model(args: str) -> str | None:
    words = shlex.split(args)
    return words[words.index("--model") + 1] if "--model" in words else None


COMMANDS = [c for c in _lines(COMMAND) if _model(c.values[1]) in SHIPPED]  # not a hub id: no network here
CALLS = _lines(CALL)


def test_the_manual_shows_translations_of_both_kinds():
    """The patterns still find the manual's examples: a rewording that hides them all fails here."""
    assert len(COMMANDS) >= 4 and len(CALLS) >= 3, (len(COMMANDS), len(CALLS))


@pytest.mark.parametrize(("page", "args", "expected"), COMMANDS)
def test_a_documented_command_prints_what_its_comment_says(page, args, expected, capsys):
    assert main(["translate", *shlex.split(args)]) == 0
    assert capsys.readouterr().out.strip() == expected, f"{page.name}: attnviz translate {args}"


@pytest.mark.parametrize(("page", "args", "expected"), CALLS)
def test_a_documented_call_returns_what_its_comment_says(page, args, expected):
    assert LOADED in page.read_text(encoding="utf-8"), f"{page.name} translates with a bundle it does not load"
    call = ast.parse(f"f({args})", mode="eval").body
    values = [ast.literal_eval(a) for a in call.args[1:]]
    keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert attnviz.translate(attnviz.load("en-de"), *values, **keywords) == expected, f"{page.name}: {args}"


def _table_rows() -> list:
    """Each row of a table of shipped models: a table whose header ends with the training time."""
    rows = []
    for page in PAGES:
        in_table = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if not line.startswith("|"):
                in_table = False
            elif line.startswith("| model |") and line.rstrip().endswith("| trained in |"):
                in_table = True
            elif in_table and (m := re.match(r"^\| `([\w-]+)`", line)):
                rows.append(pytest.param(m[1], line, id=f"{page.relative_to(ROOT)}:{number}"))
    return rows


@pytest.mark.parametrize(("name", "row"), _table_rows())
def test_a_model_table_states_the_shipped_cards_figures(name, row):
    """The tables of shipped models (README, models page) give the held-out figure and the training time that
    the model's config.json records: a retrained model's table row is updated with it."""
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    config = json.loads((pretrained_dir() / name / "config.json").read_text(encoding="utf-8"))
    metric = config["metrics"].get("exact_match", config["metrics"].get("repeat_accuracy"))
    assert float(re.match(r"[\d.]+", cells[-2])[0]) == metric, (name, cells[-2], metric)
    minutes = float(re.match(r"[\d.]+", cells[-1])[0])
    assert abs(minutes - config["train_minutes"]) <= max(0.05 * config["train_minutes"], 0.05), (name, cells[-1])


def test_the_tables_of_shipped_models_are_found():
    """The README's and the models page's tables list every shipped model: a reworded header fails here."""
    for page in ("README.md", "docs/models.md"):
        assert {p.values[0] for p in _table_rows() if p.id.startswith(page)} == SHIPPED, page
