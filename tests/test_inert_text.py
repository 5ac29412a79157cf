"""Text from a link, a text box or a file is shown as text: markdown and HTML in it stay inert."""

from __future__ import annotations

import re

import pytest
from conftest import open_from_link
from streamlit.testing.v1 import AppTest

from attnviz.app import registry
from attnviz.app.text import escape_markdown

pytestmark = pytest.mark.usefixtures("fresh_streamlit_caches")

LINK = "[Session expired: log in again](https://evil.example/login)"
IMAGE = "![t](http://evil.example/track.png)"
HTML = "<img src=http://evil.example/x.png><a href='https://evil.example'>x</a>"
ACTIVE = re.compile(r"(?<!\\)\]\(")  # "](" not escaped: a link or an image that markdown would draw
TAG = re.compile(r"(?<!\\)<[a-z]")  # "<img", "<a" not escaped: HTML (inert without unsafe_allow_html, even so)


def rendered_markdown(text: str) -> str:
    """What markdown shows of ``text``: each backslash-escaped character as itself (word joiners are invisible)."""
    return re.sub(r"\\(.)", r"\1", text).replace("\u2060", "")


@pytest.mark.parametrize(
    "text",
    [
        LINK,
        IMAGE,
        HTML,
        "1. a list\n- item\n# heading",
        "$x^2$ :material/home: ~~s~~ **b** _i_ `c` |t|",
        "Donnerstag, 2.",
    ],
)
def test_escaped_markdown_shows_exactly_what_was_typed(text):
    escaped = escape_markdown(text)
    assert rendered_markdown(escaped) == text
    assert not ACTIVE.search(escaped) and not TAG.search(escaped)
    assert escape_markdown("Donnerstag, 2. Juli 1998") == "Donnerstag, 2. Juli 1998", "plain text stays plain"


def shown_texts(at: AppTest) -> list[str]:
    """Every text element's markdown source: markdown, captions, alerts, toasts."""
    elements = [*at.markdown, *at.caption, *at.error, *at.warning, *at.info, *at.success]
    return [e.value for e in elements] + [t.proto.body for t in at.get("toast")]


@pytest.mark.slow
@pytest.mark.parametrize("page", [page.path for page in registry.PAGES])
def test_a_crafted_link_shows_no_link_or_image_on_any_page(page):
    params = {key: LINK for key in ("src", "tgt", "cmp_src", "at_folder", "at_pasted", "wt_stage", "model_path")}
    params.update({"head": IMAGE, "layer": HTML, "kind": IMAGE, "view": LINK, "contrast": IMAGE})
    at = open_from_link(page, params)
    assert not at.exception, [e.value for e in at.exception]
    texts = [t for t in shown_texts(at) if "evil.example" in t]
    for text in texts:
        assert not ACTIVE.search(text), (page, text)
        assert not TAG.search(text), (page, text)


def test_bare_addresses_do_not_become_links():
    for text in ("https://evil.example/login", "www.evil.example", "someone@evil.example"):
        escaped = escape_markdown(text)
        assert rendered_markdown(escaped) == text
        assert not re.search(r"://|www\.|\w@", escaped, re.IGNORECASE), escaped
