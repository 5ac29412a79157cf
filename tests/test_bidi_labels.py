"""Labels of right-to-left tokens, read back in the order a screen shows them.

python-bidi (the Rust crate unicode-bidi, an implementation of UAX #9 independent of attnviz) lays each label
out as a left-to-right line does, and gives its characters in visual order, left to right.
"""

from __future__ import annotations

import pytest

from attnviz.kinds import LONE_SPACE, shown_token, writing_labels

get_display = pytest.importorskip("bidi").get_display

FSI, PDI = "\N{FIRST STRONG ISOLATE}", "\N{POP DIRECTIONAL ISOLATE}"
CONTROLS = str.maketrans("", "", "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def seen(text: str) -> str:
    """``text`` as a left-to-right screen shows it, left to right, its invisible controls left out."""
    return get_display(text).translate(CONTROLS)


def test_a_row_of_right_to_left_tokens_reads_from_the_token_read_to_the_token_written():
    """Without isolates "שלום → עולם" is laid out right to left: the arrow pointed from the token written (left)
    to the token read."""
    (label,) = writing_labels(["שלום"], ["עולם"])
    assert seen(label) == f"{seen('שלום')} → {seen('עולם')}", seen(label)
    (mixed,) = writing_labels(["▁hello"], ["עולם"])
    assert seen(mixed) == f"▁hello → {seen('עולם')}"
    (digits,) = writing_labels(["١٢"], ["שלום"])  # Arabic digits are laid out by the letters around them
    assert seen(digits) == f"{seen('١٢')} → {seen('שלום')}"


def test_an_override_in_a_token_reverses_nothing_after_it():
    """A token holding U+202E (right-to-left override) had made "0.600" after it read "006.0"."""
    token = shown_token("\u202eevil")
    assert seen(f"candidates: {token} 0.600, B 0.250").endswith(" 0.600, B 0.250")
    assert seen(f"query 3 {token}\nkey 4 B").endswith("\nkey 4 B")
    (label,) = writing_labels(["\u202eabc"], ["def"])
    assert seen(label).endswith(" → def") and seen(label).startswith("cba")  # its own text still overridden


@pytest.mark.parametrize("token", ["x\u2069y", "\u2068open", "a\u2067b\u2069\u2069"])
def test_isolates_a_token_does_not_close_are_shown_as_code_points(token):
    """A PDI of the token's own would end the label's isolate early, an FSI never: both are shown as what they are."""
    shown = shown_token(token)
    assert "<U+2069>" in shown or "<U+2068>" in shown or "<U+2067>" in shown, shown
    assert seen(f"{shown} 0.500").endswith(" 0.500")


@pytest.mark.parametrize(
    "token", ["▁", "▁Katze", "abc", "é", "שלום", "\u202eevil", "x\u2069y", "١٢٣", "\u2068ab\u2069"]
)
def test_a_shown_token_shown_again_is_unchanged_and_left_to_right_text_gains_nothing(token):
    shown = shown_token(token)
    assert shown_token(shown) == shown
    (label,) = writing_labels([token], [token])
    assert shown_token(label) == label, "a label of shown tokens, shown again (the figures' ticks do)"
    if not any(c in token for c in "שלום\u202e١٢٣\u2069\u2068"):
        assert shown == (LONE_SPACE if token == "▁" else token), "only what reorders text is isolated"
    else:
        assert FSI in shown or "<U+" in shown
