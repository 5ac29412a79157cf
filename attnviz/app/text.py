"""Text from outside the app (a link, a text box, a file) shown as text: never as markdown or HTML."""

from __future__ import annotations

import re

MARKDOWN_SPECIALS = "\\`*_{}[]()<>!|~$"  # what Streamlit's markdown reads as syntax or LaTeX anywhere
SHORTCODE = re.compile(r":(?=[\w/+-]+:)")  # the colon that opens :smile: or :material/home: (an emoji, an icon)
# What GFM turns into a link with no brackets at all (http://..., www.x, a@b.c). It finds them in the
# text after escapes are resolved, so a backslash cannot stop it: a word joiner (U+2060, invisible)
# inside the pattern does.
AUTOLINK = re.compile(r"(?<=:)(?=//)|(?<=www)(?=\.)|(?=@)", re.IGNORECASE)
WORD_JOINER = "\u2060"
LINE_START = re.compile(r"^(\s*\d*)([#>+\-.)])", re.MULTILINE)  # a heading, quote, list item, numbered item


def escape_markdown(text: str) -> str:
    """``text`` as inert markdown: every character Streamlit would read as syntax is backslash-escaped.

    For text from outside the app (a sentence, a token, a link's value, a file): inside ``st.markdown``
    or ``st.caption`` it then shows as typed, and never becomes a link, an image, an icon or HTML.
    Full stops, dashes and colons are left alone where they are plain text ("2. Juli", "fifty-six",
    "3:45 PM", "cross:1.1").
    """
    escaped = "".join("\\" + c if c in MARKDOWN_SPECIALS else c for c in str(text))
    escaped = SHORTCODE.sub(r"\\:", escaped)
    escaped = AUTOLINK.sub(WORD_JOINER, escaped)
    return LINE_START.sub(lambda m: m[1] + "\\" + m[2], escaped)
