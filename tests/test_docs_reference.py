"""The API reference renders cleanly: one docstring style that mkdocstrings-python reads.

Docstrings are Markdown in the Google style (mkdocs.yml, ``docstring_style: google``): a code example
is a fenced block, and a cross-reference is a mkdocs-autorefs link, ``[`name`][attnviz.module.name]``,
to an object the reference renders, or plain code (`` `name` ``) to one it does not. Sphinx roles
and doctest prompts are not read by the renderer: they show as literal text, and an example run
together into one paragraph.

The quick tests read the sources; the slow one builds the manual with ``mkdocs build --strict`` (which
fails on a cross-reference that does not resolve) and reads the built pages, the reference first.
"""

from __future__ import annotations

import ast
import html
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("attnviz", "pages", "app.py", "benchmarks")

ROLE_NAMES = "func|class|data|mod|meth|attr|exc|obj|const|ref"
# A Sphinx role, as :func:`x` or :py:class:`x`: mkdocstrings shows it as literal text.
ROLE = re.compile(rf":(?:py:)?(?:{ROLE_NAMES})\s*:`")
# The same in a built page, where Markdown has made the backticks a <code> element.
BUILT_ROLE = re.compile(rf":(?:py:)?(?:{ROLE_NAMES}):(?=[~\w])")
FENCE = re.compile(r"^\s*```")
# An autorefs link: [`text`][attnviz.x.y], or [`attnviz.x.y`][] whose text is the target.
AUTOREF = re.compile(r"\[([^\[\]]+)\]\[([\w.]*)\]")
# A line of Python in a paragraph: a doctest prompt, an import, or a name bound to a call.
CODE_LINE = re.compile(r"^\s*(?:>>>|import [A-Za-z_]|from [\w.]+ import |[A-Za-z_][\w.]*(?:\[[^\]]*\])? = [\w.]+\()")


def source_files() -> list[Path]:
    files = []
    for name in SOURCES:
        path = ROOT / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring in ``path``: modules, classes, functions and attributes.

    An attribute's docstring is a string statement after its assignment, as griffe reads it: every
    string that stands alone as a statement is one.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.append((node.lineno, node.value.value))
    return found


def fenced_blocks(doc: str) -> list[str]:
    """The code of each fenced block in a docstring, dedented, one string per block."""
    blocks, current = [], None
    for line in doc.expandtabs().split("\n"):
        if FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def outside_fences(doc: str) -> list[str]:
    """The lines of a docstring that are prose, not inside a fenced block."""
    lines, inside = [], False
    for line in doc.split("\n"):
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            lines.append(line)
    return lines


def indented_blocks(doc: str) -> list[str]:
    """Lines that Markdown would read as an indented code block: four spaces deeper than the prose,
    after a blank line, outside a fence (write a fenced block instead)."""
    text = doc.split("\n", 1)
    if len(text) < 2:
        return []
    rest = text[1].expandtabs().split("\n")
    body = [line for line in rest if line.strip() and not FENCE.match(line)]
    if not body:
        return []
    base = min(len(line) - len(line.lstrip()) for line in body)
    found, previous, inside = [], "", False
    for line in rest:
        if FENCE.match(line):
            inside = not inside
        elif not inside and line.strip() and not previous.strip() and len(line) - len(line.lstrip()) >= base + 4:
            found.append(line.strip())
        previous = line
    return found


def each_docstring():
    for path in source_files():
        for line, doc in docstrings(path):
            yield f"{path.relative_to(ROOT)}:{line}", doc


def test_no_sphinx_roles_in_sources():
    """No :func:, :class:, :data:, :mod:, :meth: or :attr: anywhere in the code, docstrings or comments."""
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in source_files()
        for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1)
        if ROLE.search(line)
    ]
    assert not found, "Sphinx roles, which the reference shows as literal text:\n" + "\n".join(found)


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_examples_are_fenced():
    """Every example is a fenced block: no doctest prompt, reST literal block or indented block outside one."""
    problems = []
    for where, doc in each_docstring():
        if sum(1 for line in doc.split("\n") if FENCE.match(line)) % 2:
            problems.append(f"{where}: a fence is not closed")
            continue
        for line in outside_fences(doc):
            if line.lstrip().startswith(">>>"):
                problems.append(f"{where}: doctest prompt outside a fence: {line.strip()}")
            elif line.rstrip().endswith("::") or re.match(r"\s*\.\. \w+", line):
                problems.append(f"{where}: reStructuredText block: {line.strip()}")
        problems += [f"{where}: indented block, not fenced: {line}" for line in indented_blocks(doc)]
    assert not problems, "\n".join(problems)


def _resolves(package: griffe.Module, path: str) -> bool:
    try:
        obj = package[path.removeprefix("attnviz.")] if path != "attnviz" else package
        if obj.is_alias:
            obj.final_target  # noqa: B018 - raises when the alias leads nowhere
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return True


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_cross_references_name_real_objects():
    """Every autorefs link in a docstring names an object of attnviz that exists.

    The strict build checks the links of the docstrings the reference renders; this checks the
    others too, without building, so that rendering one more object cannot bring a broken link.
    """
    package = griffe.load("attnviz", search_paths=[str(ROOT)], resolve_aliases=False)
    broken = []
    for where, doc in each_docstring():
        for line in outside_fences(doc):
            for text, target in AUTOREF.findall(line):
                target = target or text.strip("`")
                if re.fullmatch(r"attnviz(\.\w+)*", target) and not _resolves(package, target):
                    broken.append(f"{where}: [{text}][{target}]")
    assert not broken, "links to objects that do not exist:\n" + "\n".join(broken)


class _Page(HTMLParser):
    """The text of every <pre> and every <p>, and the ids of the objects mkdocstrings rendered."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.pre, self.paragraphs, self.ids, self.text = [], [], [], []
        self._open: list[str] = []
        self._buffers: dict[str, list[str]] = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if re.fullmatch(r"attnviz(\.\w+)*", attrs.get("id") or ""):  # an object's heading, or a module's anchor
            self.ids.append(attrs["id"])
        if tag in ("pre", "p"):
            self._open.append(tag)
            self._buffers[tag] = []

    def handle_endtag(self, tag):
        if tag in ("pre", "p") and tag in self._open:
            self._open.remove(tag)
            (self.pre if tag == "pre" else self.paragraphs).append("".join(self._buffers.pop(tag)))

    def handle_data(self, data):
        self.text.append(data)
        for tag in self._open:
            self._buffers[tag].append(data)


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def page_problems(page: _Page, page_html: str) -> list[str]:
    """What is wrong with any built page: raw Sphinx roles, and code run together into a paragraph."""
    text = "".join(page.text)
    problems = [
        f"raw Sphinx role: ...{text[max(0, m.start() - 40) : m.end() + 40]}..." for m in BUILT_ROLE.finditer(text)
    ]
    problems += [
        f"nested blockquotes (a doctest prompt read as Markdown): {m.group(0)[:80]}"
        for m in re.finditer(r"<blockquote>\s*<blockquote>.{0,80}", page_html, re.S)
    ]
    for paragraph in page.paragraphs:
        code = [line for line in paragraph.split("\n") if CODE_LINE.match(line)]
        if code:
            problems.append(f"code in a paragraph, not a code block: {code[0].strip()[:100]}")
    return problems


def reference_problems(page_html: str, package: griffe.Module) -> list[str]:
    """What is wrong with the built reference page: what is wrong with any page, and a docstring's
    example (a fenced block) that is not a code block (<pre>) of the page."""
    page = _Page()
    page.feed(page_html)
    problems = page_problems(page, page_html)
    blocks = {_squash(html.unescape(text)) for text in page.pre}
    if not page.ids:
        problems.append("no object of attnviz rendered: the reference is empty")
    for path in dict.fromkeys(page.ids):
        obj = package[path.removeprefix("attnviz.")] if path != "attnviz" else package
        doc = obj.docstring.value if obj.docstring else ""
        for example in fenced_blocks(doc):
            if _squash(example) not in blocks:
                problems.append(f"{path}: example not in a code block: {_squash(example)[:100]}")
    return problems


def build_site(site: Path) -> None:
    """Build the manual into ``site``. Not with -q: mkdocs 1.6's --quiet hides warnings from strict
    mode, and an unresolved cross-reference would pass (github.com/mkdocs/mkdocs/issues/4126)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.slow
def test_built_reference_renders_cleanly(tmp_path):
    """The built API reference: the strict build passes, no raw role, every example a code block.

    The other pages of the manual are read for raw roles and run-together code too.
    """
    site = tmp_path / "site"
    build_site(site)
    page_html = (site / "reference" / "index.html").read_text(encoding="utf-8")
    package = griffe.load("attnviz", search_paths=[str(ROOT)])
    problems = reference_problems(page_html, package)
    for other in sorted(site.rglob("*.html")):
        if other.parent.name != "reference":
            page = _Page()
            text = other.read_text(encoding="utf-8")
            page.feed(text)
            problems += [f"{other.relative_to(site)}: {problem}" for problem in page_problems(page, text)]
    assert not problems, "\n".join(problems)
    page = _Page()
    page.feed(page_html)
    assert any(line.strip() == "import attnviz" for block in page.pre for line in block.split("\n")), (
        "attnviz.api's example is not in a code block"
    )
