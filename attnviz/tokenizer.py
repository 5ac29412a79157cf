"""What the model needs from a tokenizer, and attnviz's own sentencepiece tokenizer.

:class:`Tokenizer` is the interface every tokenizer implements: attnviz's
:class:`SentencePieceTokenizer`, Marian's (:mod:`attnviz.checkpoints.marian`) and BERT's WordPiece
(:mod:`attnviz.checkpoints.bert`). Each keeps every piece as a display label, since the pieces are
the rows and columns of every attention map.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
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
class Encoded:
    """Token ids and one display label per id."""

    ids: tuple[int, ...]
    tokens: tuple[str, ...]


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

    def decode(self, ids: Iterable[int]) -> str:
        """Target ids to text, special ids dropped."""
        ...

    @property
    def src_vocab_size(self) -> int: ...

    @property
    def tgt_vocab_size(self) -> int: ...


class SentencePieceTokenizer:
    """Source and target sentencepiece models (often the same one) and the special ids."""

    def __init__(self, src_model: bytes, tgt_model: bytes | None = None, max_tokens: int = 1024):
        self.src = spm.SentencePieceProcessor(model_proto=src_model)
        self.tgt = (
            self.src
            if tgt_model is None or tgt_model == src_model
            else spm.SentencePieceProcessor(model_proto=tgt_model)
        )
        self.max_tokens = max_tokens
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def _pieces(self, sp: spm.SentencePieceProcessor, text: str, side: str) -> Encoded:
        check_text(text, side, self.max_tokens)
        ids, tokens = [], []
        for piece in sp.encode(text, return_type="proto").pieces:
            ids.append(piece.id)
            # An unknown character keeps its own text in the label, marked, so a map never shows
            # a row called just "<unk>" without saying what it stood for.
            tokens.append(f"<unk:{piece.surface}>" if piece.id == self.unk_id else piece.piece)
        return Encoded(tuple(ids), tuple(tokens))

    def _check_length(self, n: int, side: str) -> None:
        if n > self.max_tokens:
            raise InputError(f"the {side} text is {n} tokens long; this model takes at most {self.max_tokens}")

    def encode_source(self, text: str) -> Encoded:
        """Encoder input: the pieces, then the end token."""
        enc = self._pieces(self.src, text, "source")
        out = Encoded(enc.ids + (self.eos_id,), enc.tokens + ("</s>",))
        self._check_length(len(out.ids), "source")
        return out

    def encode_target(self, text: str) -> tuple[Encoded, Encoded]:
        """(decoder input, labels): ``<s> pieces`` and ``pieces </s>``, one shifted from the other."""
        enc = self._pieces(self.tgt, text, "target")
        inp = Encoded((self.bos_id,) + enc.ids, ("<s>",) + enc.tokens)
        labels = Encoded(enc.ids + (self.eos_id,), enc.tokens + ("</s>",))
        self._check_length(len(inp.ids), "target")
        return inp, labels

    def target_token(self, token_id: int) -> str:
        return self.tgt.id_to_piece(int(token_id))

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
