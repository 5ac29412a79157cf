"""Text from outside the app (a link, a text box, a file) shown as text: never as markdown or HTML."""

from __future__ import annotations

import re

MARKDOWN_SPECIALS = "\\`*_{}[]()<>!|~$:"  # what Streamlit's markdown reads as syntax, emoji or LaTeX anywhere
LINE_START = re.compile(r"^(\s*\d*)([#>+\-.)])", re.MULTILINE)  # a heading, quote, list item, numbered item


def escape_markdown(text: str) -> str:
    """``text`` as inert markdown: every character Streamlit would read as syntax is backslash-escaped.

    For text from outside the app (a sentence, a token, a link's value, a file): inside ``st.markdown``
    or ``st.caption`` it then shows as typed, and never becomes a link, an image or HTML. Full stops
    and dashes are left alone inside a line, where they are plain text ("2. Juli", "fifty-six").
    """
    escaped = "".join("\\" + c if c in MARKDOWN_SPECIALS else c for c in str(text))
    return LINE_START.sub(lambda m: m[1] + "\\" + m[2], escaped)
