"""The three kinds of attention in the model, their axes and their masks: one vocabulary for the package.

Rows are queries and columns are keys in every map. Encoder self-attention is source by source,
masked decoder self-attention is decoder input by decoder input, and cross-attention is decoder
input (target) rows by source columns. Masks are boolean, True = this query may attend to this key.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np

KINDS = ("encoder", "decoder", "cross")
TITLES = {
    "encoder": "Encoder self-attention",
    "decoder": "Decoder self-attention (masked)",
    "cross": "Cross-attention (encoder-decoder)",
}
SIDES = {"source": "source", "target": "decoder input"}  # how each side of a pair is called on axes
KIND_SIDES = {"encoder": ("source", "source"), "decoder": ("target", "target"), "cross": ("target", "source")}


def check_kind(kind: str) -> str:
    """``kind`` itself, or a ValueError naming the three kinds."""
    if kind not in KIND_SIDES:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    return kind


def axis_name(kind: str, role: str, unit: str = "position") -> str:
    """'query: source position', 'key: decoder input token': which side an axis of ``kind`` holds.

    ``role`` is "query" (rows) or "key" (columns); ``unit`` what one entry of the axis is.
    """
    side = KIND_SIDES[check_kind(kind)][{"query": 0, "key": 1}[role]]
    return f"{role}: {SIDES[side]} {unit}"


def axis_names(kind: str, unit: str = "position") -> tuple[str, str]:
    """(query axis, key axis) of ``kind``, as `axis_name` writes them."""
    return axis_name(kind, "query", unit), axis_name(kind, "key", unit)


def held_axes(kinds, lead: Sequence[str] = ("layer", "head"), unit: str = "position") -> dict[str, list[str]]:
    """An export manifest's ``axes``: the axes of each of ``kinds``, the kinds of map its file holds, in `KINDS`'
    order. A language model's file names only the decoder's, an encoder-only model's only the encoder's: manifests
    had named the axes of all three, which a reader of the manifest alone took for maps the file holds."""
    held = set(kinds)
    return {kind: [*lead, *axis_names(kind, unit)] for kind in KINDS if kind in held}


def causal_mask(n_queries: int, n_keys: int | None = None, start: int = 0) -> np.ndarray:
    """The subsequent mask (3.2.3), (Q, K) bool: query i, at position start + i, may attend to keys 0..start + i.

    ``start`` > 0 gives the rows of later positions only (decoding with a key/value cache, where the
    keys of earlier positions are already known); ``n_keys`` defaults to ``start + n_queries``.
    """
    n_keys = start + n_queries if n_keys is None else n_keys
    return (start + np.arange(n_queries))[:, None] >= np.arange(n_keys)[None, :]


def allowed(kind: str, n_queries: int, n_keys: int) -> np.ndarray | None:
    """Which cells of one unpadded map of ``kind`` may be non-zero: the causal mask, or None (every cell)."""
    return causal_mask(n_queries, n_keys) if check_kind(kind) == "decoder" else None


LONE_SPACE = "␣"  # how a piece that is only sentencepiece's word marker "▁" is shown: a space, visibly
# Unicode's bidirectional isolates (UAX #9): a text between FSI and its PDI is laid out on its own, its direction
# taken from its first strong letter, and moves nothing around it.
LRI, RLI, FSI, PDI = "\u2066", "\u2067", "\u2068", "\u2069"
# What reorders the text around a token: right-to-left letters and Arabic digits (their bidirectional classes), and
# the invisible marks, embeddings and overrides.
RIGHT_TO_LEFT = frozenset({"R", "AL", "AN"})
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e")


def _outside_isolates(text: str) -> str | None:
    """The characters of ``text`` outside every isolate; None when an isolate it opens (LRI, RLI, FSI) is not
    closed by a PDI of its own, or a PDI closes one it never opened."""
    depth, outside = 0, []
    for c in text:
        if c in (LRI, RLI, FSI):
            depth += 1
        elif c == PDI:
            if depth == 0:
                return None
            depth -= 1
        elif depth == 0:
            outside.append(c)
    return "".join(outside) if depth == 0 else None


def shown_token(token: str) -> str:
    """A token, or a label made of shown tokens, as a figure shows it: a lone word marker "▁" (a space) as "␣", not
    a stray underscore; and one holding right-to-left letters or bidirectional controls in an isolate (FSI ... PDI).

    Without the isolate, a decoder row of Hebrew or Arabic tokens, "שלום → עולם", is laid out right to left with its
    arrow pointing from the token written to the token read, and a token holding U+202E (right-to-left override)
    reverses whatever follows it on its line: "0.600" after it reads "006.0". Isolates a token does not close
    itself are shown as code points ("<U+2069>"): they would end the isolate early, or never. A shown token shown
    again is unchanged."""
    if token == "▁":
        return LONE_SPACE
    if token.isascii():
        return token
    outside = _outside_isolates(token)
    if outside is None:  # its own isolates shown, none left: the whole token is outside
        token = outside = "".join(f"<U+{ord(c):04X}>" if c in (LRI, RLI, FSI, PDI) else c for c in token)
    if any(c in BIDI_CONTROLS or unicodedata.bidirectional(c) in RIGHT_TO_LEFT for c in outside):
        return f"{FSI}{token}{PDI}"
    return token  # what reorders is already isolated: a shown token, or a label of shown tokens


def writing_labels(inputs: Sequence[str], writes: Sequence[str]) -> list[str]:
    """'▁hundert → ▁sechs': a decoder position by its input token and the token it writes.

    A decoder row reads one token and writes the next: labelled by its input alone, the row
    "hundert" seems to look at "six", when it does so because it writes "sechs".
    """
    if len(inputs) != len(writes):
        raise ValueError(f"{len(inputs)} decoder inputs but {len(writes)} tokens written")
    return [f"{shown_token(a)} → {shown_token(b)}" for a, b in zip(inputs, writes, strict=True)]
