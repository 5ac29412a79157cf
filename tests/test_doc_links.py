"""Every link the docs print opens, in a real browser, the view its text names.

The docs write a link as ``page?key=value`` (``explorer?view=grid``) or, for a parameter every page
takes (``?present=1``), with no page: it is then opened on home. For each parameter the test finds the
widget keyed by it (Streamlit marks a keyed widget's box with the class ``st-key-<key>``) and reads
what it shows: that must be the link's value itself, or the name the docs give in italics just
before the link in its paragraph (*All heads (model view)* before ``explorer?view=grid``). A link value the app
set aside (its "cannot be shown here" notice) fails, and so does a parameter the page then drops
from the address bar.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from browser_wait import settled, still
from test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

from attnviz.app import registry

pytestmark = pytest.mark.slow  # a server and a browser

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
PAGE_PATHS = {page.url_path for page in registry.PAGES}
# A link in prose: an optional page name, then ?key=value&... up to a space, backtick or bracket.
LINK = re.compile(r"(?<![\w./?])(?P<page>[a-z_]*)\?(?P<query>[a-z_]+=[^\s`)&]*(?:&[a-z_]+=[^\s`)&]*)*)")
ITALIC = re.compile(r"(?<![*\w])\*([^*\n]+)\*(?!\*)")
ON = {"1", "true", "on", "yes"}


def doc_links() -> list[tuple[str, str, str, str]]:
    """(where, page, query, text before it in its paragraph) for every link the docs print, in order."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in LINK.finditer(text):
            at = match.start()
            start = text.rfind("\n\n", 0, at)
            # what the paragraph says up to the link: its last name in italics is the view it opens
            paragraph = " ".join(text[start + 1 : at].split())
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, at) + 1}"
            found.append((where, match["page"], match["query"], paragraph))
    return found


LINKS = doc_links()


def test_the_docs_print_links():
    """The collector finds the links the lecture plan relies on (the browser test is not vacuous)."""
    queries = {f"{page}?{query}" for _, page, query, _ in LINKS}
    assert {"explorer?view=grid", "?present=1"} <= queries, queries


@pytest.mark.parametrize(("where", "page", "query", "paragraph"), LINKS, ids=[f"{w} {p}?{q}" for w, p, q, _ in LINKS])
def test_every_link_names_a_page(where, page, query, paragraph):
    assert page in PAGE_PATHS, f"{where}: `{page}?{query}` names no page of the app ({sorted(PAGE_PATHS)})"


# What the widget keyed ``key`` shows: a toggle's state, the chosen radio option, tab or slider value, or
# the text in its box (a selectbox, streamlit 1.67: a combobox whose input holds the chosen option's label).
SHOWN = """(key) => {
    const box = document.querySelector('.st-key-' + CSS.escape(key));
    if (!box) return null;
    const flag = box.querySelector('input[type=checkbox]');
    if (flag) return {bool: true, text: String(flag.checked)};
    const radio = box.querySelector('input[type=radio]:checked');
    if (radio) return {text: radio.closest('label').innerText.split('\\n')[0]};
    const tab = box.querySelector('[role=tab][aria-selected=true]');
    if (tab) return {text: tab.innerText};
    const thumbs = [...box.querySelectorAll('[data-testid=stSliderThumbValue]')];
    if (thumbs.length) return {text: thumbs.map(t => t.innerText).join(',')};
    const typed = box.querySelector('textarea, input');
    if (typed) return {text: typed.value};
    return {text: box.innerText};
}"""

SET_ASIDE = ("cannot be shown here", "Set aside from the link")  # the footer's notice and caption


def _set_aside(line: str) -> bool:
    return any(s in line for s in SET_ASIDE)


@pytest.fixture(scope="module")
def server(browser_app):
    """The session's app server (conftest.browser_app), whose roots hold the shipped models."""
    return browser_app


@pytest.fixture(scope="module")
def browser_page(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield still(browser.new_context(viewport={"width": 1400, "height": 1000})).new_page()
        finally:
            browser.close()


def check_opens_as_written(page, server: str, where: str, path: str, query: str, paragraph: str) -> None:
    """Open ``path?query`` and compare each parameter's widget with the link and the name before it."""
    page.goto(f"{server}/{path}?{query}")
    settled(page, f"{where}: {path}?{query}")
    assert page.locator("[data-testid='stException']").count() == 0, f"{where}: an error on {path}?{query}"
    notices = [line for line in page.locator("[data-testid='stApp']").inner_text().splitlines() if _set_aside(line)]
    assert not notices, f"{where}: {path}?{query}: {notices}"
    kept = parse_qs(urlsplit(page.url).query)
    names = [name.strip() for name in ITALIC.findall(paragraph)][-1:]  # the name just before the link
    for key, values in parse_qs(query).items():
        value = values[-1]
        assert kept.get(key) == [value], f"{where}: the address bar lost {key}={value}: {page.url}"
        shown = page.evaluate(SHOWN, key)
        assert shown is not None, f"{where}: no widget on {path or 'home'} takes {key} (does the link name its page?)"
        if shown.get("bool"):
            assert shown["text"] == str(value.lower() in ON).lower(), f"{where}: {key}={value} shows {shown}"
        else:
            assert shown["text"].strip() in {value, *names}, (
                f"{where}: {key}={value} shows {shown['text']!r}, neither the value nor a name the text gives {names}"
            )
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"doc-link-{path or 'home'}-{re.sub(r'[^a-z0-9]+', '-', query)}.png"))


@pytest.mark.parametrize(("where", "page", "query", "paragraph"), LINKS, ids=[f"{w} {p}?{q}" for w, p, q, _ in LINKS])
def test_a_link_in_the_docs_opens_the_view_its_text_names(browser_page, server, where, page, query, paragraph):
    check_opens_as_written(browser_page, server, where, page, query, paragraph)


def test_an_old_link_with_a_label_still_opens_and_the_address_bar_then_holds_the_short_value(browser_page, server):
    page = browser_page
    page.goto(f"{server}/explorer?view=All+heads+(model+view)&contrast=each+row+to+its+maximum")
    settled(page, "explorer with labels in the link")
    notices = [line for line in page.locator("[data-testid='stApp']").inner_text().splitlines() if _set_aside(line)]
    assert not notices, notices
    assert page.evaluate(SHOWN, "view")["text"] == "All heads (model view)"
    assert page.evaluate(SHOWN, "contrast")["text"] == "each row to its maximum"
    page.wait_for_function("() => location.search.includes('view=grid')", timeout=30_000)
    kept = parse_qs(urlsplit(page.url).query)
    assert kept["view"] == ["grid"] and kept["contrast"] == ["row"], page.url

    page.locator(".st-key-view [role=combobox]").click()  # the visitor picks another view
    page.get_by_role("option", name="Head statistics").click()
    settled(page, "explorer, view picked")
    page.wait_for_function("() => location.search.includes('view=stats')", timeout=30_000)
    assert parse_qs(urlsplit(page.url).query)["view"] == ["stats"], page.url
