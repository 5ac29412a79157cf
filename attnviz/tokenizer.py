"""What the model needs from a tokenizer, and attnviz's own sentencepiece tokenizer.

:class:`Tokenizer` is the interface every tokenizer implements: attnviz's
:class:`SentencePieceTokenizer`, Marian's (:mod:`attnviz.checkpoints.marian`) and BERT's WordPiece
(:mod:`attnviz.checkpoints.bert`). Each keeps every piece as a display label, since the pieces are
the rows and columns of every attention map, and says which pieces make up each word
(:class:`Word`), so that maps can also be read word by word (:mod:`attnviz.words`).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import sentencepiece as spm
import torch

from attnviz.errors import InputError

# Special ids, the same in every tokenizer attnviz trains (and in TransformerConfig's defaults).
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def train_sentencepiece(
    sentences: Iterable[str], vocab_size: int, model_type: str = "bpe", symbols: tuple[str, ...] = ()
) -> bytes:
    """A sentencepiece model trained in memory; the same sentences give the same bytes."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        split_digits=True,  # digits one by one, so numbers can be copied digit by digit
        normalization_rule_name="identity",  # labels show exactly what the user typed
        character_coverage=1.0,
        hard_vocab_limit=False,
        user_defined_symbols=list(symbols),
        num_threads=1,  # byte-identical output run to run
        minloglevel=2,
    )
    return buf.getvalue()


def check_text(text: str, side: str, max_tokens: int) -> None:
    """Raise InputError for text no tokenizer should take: not a string, empty, or far too long."""
    if not isinstance(text, str):
        raise InputError(f"the {side} text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise InputError(f"the {side} text is empty: type a sentence")
    # A cheap guard before tokenising: tokens are rarely shorter than a character on average.
    if len(text) > 20 * max_tokens:
        raise InputError(
            f"the {side} text has {len(text):,} characters; this model takes at most {max_tokens} tokens: shorten it"
        )


@dataclass(frozen=True)
class Word:
    """One word of an encoded sequence: the pieces at positions ``start`` to ``stop`` (exclusive) and its text.

    ``text`` is the word as the user typed it (or, for a sequence the model wrote, as its pieces
    spell it). A special token (``<s>``, ``</s>``, ``[CLS]``, ``[SEP]``, a language tag) is always a
    word of its own, ``special``, and its text is its label.
    """

    start: int
    stop: int
    text: str
    special: bool = False


@dataclass(frozen=True)
class Encoded:
    """Token ids, one display label per id, and the words the pieces make up (in order, covering every id)."""

    ids: tuple[int, ...]
    tokens: tuple[str, ...]
    words: tuple[Word, ...] = ()


WORD_START = "\u2581"  # sentencepiece's "▁": this piece begins a new word (it stands for the space before it)


def sentencepiece_words(
    pieces: Sequence[str],
    first: int = 0,
    *,
    surfaces: Sequence[str] | None = None,
    spell: Callable[[list[str]], str] | None = None,
) -> list[Word]:
    """The words of a run of sentencepiece pieces: a piece starting with "▁" starts a word, the rest continue it.

    A word's text is its pieces' ``surfaces`` joined (sentencepiece's ``surface``: the input's own
    characters, before normalisation, so the word reads as the user typed it), or, for pieces the
    model wrote, ``spell`` applied to its pieces. ``first`` is the position of the first piece.
    """
    groups: list[list[int]] = []
    for i, piece in enumerate(pieces):
        if not groups or piece.startswith(WORD_START):
            groups.append([])
        groups[-1].append(i)
    words = []
    for group in groups:
        parts = [pieces[i] for i in group]
        text = "".join(surfaces[i] for i in group) if surfaces is not None else spell(parts) if spell else ""
        # A word with no text of its own (a lone "▁") keeps its pieces as its label.
        words.append(Word(first + group[0], first + group[-1] + 1, text.strip() or "".join(parts)))
    return words


def model_words(
    ids: Sequence[int], label: Callable[[int], str], specials: set[int], spell: Callable[[list[str]], str]
) -> list[Word]:
    """The words of ids the model wrote: each special id a word of its own, the pieces between grouped by "▁"."""
    words: list[Word] = []
    run: list[int] = []  # positions of the ordinary pieces since the last special id

    def flush() -> None:
        if run:
            pieces = [label(ids[i]) for i in run]
            words.extend(sentencepiece_words(pieces, run[0], spell=spell))
            run.clear()

    for i, token_id in enumerate(ids):
        if token_id in specials:
            flush()
            words.append(Word(i, i + 1, label(token_id), special=True))
        else:
            run.append(i)
    flush()
    return words


class Tokenizer(Protocol):
    """What the model and the app need from a tokenizer; every tokenizer in attnviz implements it."""

    pad_id: int
    bos_id: int  # the decoder's start token
    eos_id: int
    unk_id: int
    max_tokens: int  # the longest sequence the model's positions allow

    def encode_source(self, text: str) -> Encoded:
        """Encoder input ids and their labels, ending with the end token; InputError for unusable text."""
        ...

    def encode_target(self, text: str) -> tuple[Encoded, Encoded]:
        """(decoder input, labels): the start token and the pieces, and the pieces and the end token."""
        ...

    def target_token(self, token_id: int) -> str:
        """The label of a target id."""
        ...

    def target_words(self, ids: Sequence[int]) -> tuple[Word, ...]:
        """The words of a decoder input the model wrote (``ids`` from the start token on), as its pieces spell them."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Target ids to text, special ids dropped."""
        ...

    @property
    def src_vocab_size(self) -> int: ...

    @property
    def tgt_vocab_size(self) -> int: ...


class TokenizersFile:
    """What every tokenizer read from a ``tokenizer.json`` (the ``tokenizers`` library, as ``self.tok``)
    shares: decoding and the vocabulary's size. BERT's and the language models' derive from it."""

    tok: object  # a tokenizers.Tokenizer

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to text, special tokens dropped."""
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    @property
    def src_vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    @property
    def tgt_vocab_size(self) -> int:
        return self.src_vocab_size


class SentencePieceTokenizer:
    """Source and target sentencepiece models (often the same one) and the special ids.

    With ``decoder_only`` (attnviz's own language models) there is one text, the prompt:
    :meth:`encode_source` gives the decoder's input, ``<s>`` and the pieces, and there is no target.
    """

    def __init__(
        self, src_model: bytes, tgt_model: bytes | None = None, max_tokens: int = 1024, decoder_only: bool = False
    ):
        self.decoder_only = decoder_only
        self.src = spm.SentencePieceProcessor(model_proto=src_model)
        self.tgt = (
            self.src
            if tgt_model is None or tgt_model == src_model
            else spm.SentencePieceProcessor(model_proto=tgt_model)
        )
        self.max_tokens = max_tokens
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def _pieces(self, sp: spm.SentencePieceProcessor, text: str, side: str, first: int) -> Encoded:
        """The pieces of ``text`` and their words, the first piece at position ``first`` of the sequence."""
        check_text(text, side, self.max_tokens)
        ids, tokens = [], []
        pieces = sp.encode(text, return_type="proto").pieces
        for piece in pieces:
            ids.append(piece.id)
            # An unknown character keeps its own text in the label, marked, so a map never shows
            # a row called just "<unk>" without saying what it stood for.
            tokens.append(f"<unk:{piece.surface}>" if piece.id == self.unk_id else piece.piece)
        words = sentencepiece_words([p.piece for p in pieces], first, surfaces=[p.surface for p in pieces])
        return Encoded(tuple(ids), tuple(tokens), tuple(words))

    def _check_length(self, n: int, side: str) -> None:
        if n > self.max_tokens:
            raise InputError(f"the {side} text is {n} tokens long; this model takes at most {self.max_tokens}")

    def encode_source(self, text: str) -> Encoded:
        """Encoder input: the pieces, then the end token; a language model's prompt: ``<s>`` and the pieces."""
        if self.decoder_only:
            enc = self._pieces(self.src, text, "prompt", first=1)
            start = Word(0, 1, "<s>", special=True)
            out = Encoded((self.bos_id,) + enc.ids, ("<s>",) + enc.tokens, (start,) + enc.words)
            self._check_length(len(out.ids), "prompt")
            return out
        enc = self._pieces(self.src, text, "source", first=0)
        end = Word(len(enc.ids), len(enc.ids) + 1, "</s>", special=True)
        out = Encoded(enc.ids + (self.eos_id,), enc.tokens + ("</s>",), enc.words + (end,))
        self._check_length(len(out.ids), "source")
        return out

    def encode_target(self, text: str) -> tuple[Encoded, Encoded]:
        """(decoder input, labels): ``<s> pieces`` and ``pieces </s>``, one shifted from the other."""
        if self.decoder_only:
            raise InputError(
                "a language model reads one text, its prompt, and continues it: there is no target sentence "
                "(use generate to continue the prompt)"
            )
        enc = self._pieces(self.tgt, text, "target", first=1)
        start = Word(0, 1, "<s>", special=True)
        inp = Encoded((self.bos_id,) + enc.ids, ("<s>",) + enc.tokens, (start,) + enc.words)
        labels = Encoded(enc.ids + (self.eos_id,), enc.tokens + ("</s>",))
        self._check_length(len(inp.ids), "target")
        return inp, labels

    def target_token(self, token_id: int) -> str:
        return self.tgt.id_to_piece(int(token_id))

    def target_words(self, ids: Sequence[int]) -> tuple[Word, ...]:
        """The words of a decoder input the model wrote: ``<s>`` (and ``</s>``) alone, the pieces by "▁"."""
        return tuple(
            model_words(
                [int(i) for i in ids],
                self.target_token,
                {self.bos_id, self.eos_id, self.pad_id},
                self.tgt.decode_pieces,
            )
        )

    def decode(self, ids: Iterable[int]) -> str:
        """Target ids to text; special ids are dropped."""
        specials = {self.pad_id, self.bos_id, self.eos_id}
        return self.tgt.decode([int(i) for i in ids if int(i) not in specials])

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_piece_size()


def pad_batch(seqs: list[tuple[int, ...]], pad_id: int, device=None):
    """Right-pad id sequences: returns (ids (B, L) long, valid (B, L) bool, True = real token)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        valid[i, : len(s)] = True
    return ids.to(device), valid.to(device)
