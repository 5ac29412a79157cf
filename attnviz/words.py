"""Attention between words instead of sub-word pieces, as Clark et al. (2019) merge it.

"What Does BERT Look At? An Analysis of BERT's Attention" (Clark, Khandelwal, Levy and Manning,
2019, arXiv:1906.04341, section 4) turns a map over pieces into a map over words:

- attention **to** a word is the **sum** of the attention to its pieces (columns are added), and
- attention **from** a word is the **mean** of the attention from its pieces (rows are averaged),

so that each row is still a distribution over keys: the mean of rows that sum to 1 sums to 1.
A special token (``<s>``, ``</s>``, ``[CLS]``, ``[SEP]``) is a word of its own. A cell that is
exactly 0 for every piece pair stays exactly 0: the decoder's future stays masked, word by word,
because every piece of a later word comes after every piece of an earlier one.

Which pieces make up a word comes from the tokenizer (`attnviz.tokenizer.Word`): "▁"
starts a word in sentencepiece (attnviz's own models and Marian), "##" continues one in BERT's
WordPiece. Words are contiguous runs of pieces, in order, covering every position once.

Shape letters: L layers, H heads, Q query pieces, K key pieces, W words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from attnviz.export import AttentionExport
from attnviz.kinds import KIND_SIDES, axis_names
from attnviz.tokenizer import Word

RULE = (
    "Clark et al. (2019): attention to a word is the sum over its pieces, attention from a word the mean "
    "over its pieces; special tokens are words of their own"
)


def check_words(words: Sequence[Word], n_pieces: int, axis: str) -> np.ndarray:
    """The first piece of every word, after checking that the words cover ``n_pieces`` pieces in order.

    Raises ValueError naming ``axis`` when a word is empty, words overlap or leave a gap, or the
    last word does not end at the last piece.
    """
    if not words:
        raise ValueError(f"no words were given for the {axis} axis of {n_pieces} pieces")
    expected = 0
    for word in words:
        if word.start != expected or word.stop <= word.start:
            raise ValueError(
                f"the {axis} words must be contiguous runs of pieces covering every position in order; "
                f"a word starting at piece {word.start} (text {word.text!r}) follows a word ending at {expected}"
            )
        expected = word.stop
    if expected != n_pieces:
        raise ValueError(f"the {axis} words cover {expected} pieces but the maps have {n_pieces} on that axis")
    return np.array([word.start for word in words])


def merge(maps: np.ndarray, query_words: Sequence[Word], key_words: Sequence[Word]) -> np.ndarray:
    """``maps`` (..., Q, K) over pieces as (..., W_query, W_key) over words: key pieces summed, query pieces averaged.

    Computed in float64 and returned as float32, like the maps the model gives. The merge is linear:
    ``merge(A)[i, j] = mean over query pieces q of word i of (sum over key pieces k of word j of A[q, k])``.
    """
    maps = np.asarray(maps)
    if maps.ndim < 2:
        raise ValueError(f"expected maps of shape (..., query, key), got {maps.shape}")
    query_starts = check_words(query_words, maps.shape[-2], "query")
    key_starts = check_words(key_words, maps.shape[-1], "key")
    sizes = np.array([w.stop - w.start for w in query_words], dtype=np.float64)
    summed = np.add.reduceat(maps.astype(np.float64), key_starts, axis=-1)  # (..., Q, W_key)
    merged = np.add.reduceat(summed, query_starts, axis=-2) / sizes[:, None]  # (..., W_query, W_key)
    return merged.astype(np.float32)


def merge_vector(values: np.ndarray, words: Sequence[Word]) -> np.ndarray:
    """``values`` (..., n pieces), one number per piece, as (..., n words): each word the sum of its pieces'.

    For quantities that add up over tokens, such as a relevance that is conserved through the layers.
    """
    values = np.asarray(values)
    starts = check_words(words, values.shape[-1], "token")
    return np.add.reduceat(values.astype(np.float64), starts, axis=-1).astype(np.float32)


def labels(words: Sequence[Word]) -> tuple[str, ...]:
    """The words' texts, as the axis labels of merged maps."""
    return tuple(word.text for word in words)


def spans(words: Sequence[Word]) -> list[list[int]]:
    """[[start, stop], ...]: which pieces each word merges, as a manifest records it."""
    return [[word.start, word.stop] for word in words]


def merge_export(
    export: AttentionExport,
    src_words: Sequence[Word] | None,
    tgt_words: Sequence[Word] | None,
    token_extras: Mapping[str, str] | None = None,
) -> AttentionExport:
    """``export`` with every map merged into words and the words as its tokens.

    The arrays keep their names and their leading axes (per head, or per layer for a method's
    maps); ``src_ids`` and ``tgt_ids`` stay the pieces the model read, and the manifest says that
    the maps are over words (``units``), how they were merged (``words.rule``) and which pieces each
    word merges (``words.source``, ``words.target``: [start, stop) per word). ``token_extras`` names
    the extra arrays with one number per token of a side ("source" or "target"): each word gets the
    sum of its pieces'. Any other extra array is refused, as it could not be read against words.
    """
    if (tgt_words is None) != (export.tgt_tokens is None):
        raise ValueError("pass target words exactly when the export has a decoder input")
    if (src_words is None) != (export.src_tokens is None):
        raise ValueError("pass source words exactly when the export has a source (a language model has none)")
    token_extras = dict(token_extras or {})
    if set(export.extras) - set(token_extras):
        raise ValueError(f"cannot merge the extra arrays {sorted(set(export.extras) - set(token_extras))} into words")
    side_words = {"source": src_words, "target": tgt_words}
    maps = {}
    for kind, (query_side, key_side) in KIND_SIDES.items():
        pieces = getattr(export, kind)
        maps[kind] = None if pieces is None else merge(pieces, side_words[query_side], side_words[key_side])
    extras = {name: merge_vector(values, side_words[token_extras[name]]) for name, values in export.extras.items()}
    lead = {kind: export.manifest.get("axes", {}).get(kind, ["layer", "head", "", ""])[:-2] for kind in KIND_SIDES}
    note = export.manifest.get("note", "rows are queries, columns are keys; weights are post-softmax, per head")
    manifest = {
        **export.manifest,
        "units": "words",
        "axes": {kind: [*lead[kind], *axis_names(kind, "word")] for kind in KIND_SIDES if maps[kind] is not None},
        "note": note.replace("rows are queries, columns are keys", "rows are query words, columns key words")
        + ", merged from pieces",
        "words": {
            "rule": RULE,
            "source": None if src_words is None else spans(src_words),
            "target": None if tgt_words is None else spans(tgt_words),
            **({"extras": f"{', '.join(sorted(extras))}: each word the sum of its pieces'"} if extras else {}),
        },
    }
    return replace(
        export,
        **maps,
        extras=extras,
        src_tokens=None if src_words is None else labels(src_words),
        tgt_tokens=None if tgt_words is None else labels(tgt_words),
        manifest=manifest,
    )
