"""What the model needs from a tokenizer, and attnviz's own sentencepiece tokenizer.

`Tokenizer` is the interface every tokenizer implements: attnviz's
`SentencePieceTokenizer`, Marian's (`attnviz.checkpoints.marian`) and BERT's WordPiece
(`attnviz.checkpoints.bert`). Each keeps every piece as a display label, since the pieces are
the rows and columns of every attention map, and says which pieces make up each word
(`Word`), so that maps can also be read word by word (`attnviz.words`).
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import sentencepiece as spm
import torch

from attnviz.errors import CheckpointError, InputError, describe

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


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # Python strings never pair them: any is lone


def check_text(text: str, side: str, max_tokens: int, count: Callable[[str], int] | None = None) -> None:
    """Raise InputError for text no tokenizer should take: not a string, empty, holding a lone surrogate, or far
    too long.

    A text of over 20 characters per token the model takes is refused before it is tokenised whole
    (a token is rarely longer than 20 characters); the message counts tokens, as the limit does:
    with ``count`` (the tokens of a text), those of the text's first 20 x ``max_tokens`` characters,
    when they are already too many.
    """
    if not isinstance(text, str):
        raise InputError(f"the {side} text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise InputError(f"the {side} text is empty: type a sentence")
    lone = _LONE_SURROGATE.search(text)
    if lone:  # no tokenizer library takes one (sentencepiece raised a RuntimeError from C++); UTF-8 cannot hold it
        raise InputError(
            f"the {side} text holds U+{ord(lone.group()):04X} at character {lone.start() + 1:,}, half of a UTF-16 "
            "surrogate pair and no character on its own (bytes read as text that were not UTF-8?): remove it"
        )
    most = 20 * max_tokens
    if len(text) > most:
        n = count(text[:most]) if count is not None else 0
        if n > max_tokens:
            raise InputError(
                f"the {side} text is over {n:,} tokens long (its first {most:,} characters alone are {n:,} tokens); "
                f"this model takes at most {max_tokens:,} tokens: shorten it"
            )
        raise InputError(
            f"the {side} text is too long: {len(text):,} characters, over 20 for each of the {max_tokens:,} "
            "tokens this model takes; shorten it"
        )


class ReadAsNothing(InputError):
    """A text its tokenizer reads as no piece at all (`check_read`): as good as empty."""


def check_read(n_pieces: int, side: str) -> None:
    """InputError when the tokenizer read ``side``'s text as nothing: it held only what its normaliser drops or
    reads as a space (zero-width characters, SentencePiece's own word mark "▁"), so the model would see its
    special tokens alone."""
    if n_pieces == 0:
        raise ReadAsNothing(
            f"the {side} text is empty once this model's tokenizer has read it (it holds only spaces, word "
            "marks ▁ or characters the tokenizer drops, such as zero-width ones): type a sentence"
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


# How much a tokenizer.json may lengthen a text before its model reads it. The ``tokenizers`` library
# aborts the whole process (signal 6, no Python exception) when an allocation fails, and a normalizer
# such as six Replace("a", "aaaaaaaaaa") in sequence multiplies a text's length by a million before
# any count of tokens could refuse it. So each step's worst case is bounded from tokenizer.json alone
# (`growth`), a tokenizer that could lengthen a text more than MAX_GROWTH times is refused when it is
# read, and a text is encoded (or ids decoded) only when that worst case stays under
# MAX_NORMALIZED_CHARS: about 300 MB of the library's working memory at most (here a byte-level BPE
# took 190 MB to encode a million characters of words, 341 MB for one word of two million). Qwen2's
# NFC and byte-level steps (15 times at most) still read 100,000 characters, about 20,000 tokens.
MAX_GROWTH = 1000
MAX_NORMALIZED_CHARS = 1_500_000
# The longest a text becomes, per character, under each Unicode normal form: UAX #15, section 9
# ("Detecting Normalization Forms": the maximum expansion factors in code points; NFKC's is U+FDFA's
# 18), checked here over every code point with Python's unicodedata.
NORMAL_FORMS = {"NFC": 3, "NFD": 4, "NFKC": 18, "NFKD": 18}
# Steps that never lengthen a text (they drop, keep or replace characters one for one, or only split).
SAME_LENGTH = {
    "normalizer": {"Strip", "StripAccents", "Nmt"},
    "pre_tokenizer": {
        "BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits", "Split",
        "CharDelimiterSplit", "UnicodeScripts", "FixedLength",
    },
    "decoder": {"ByteLevel", "Metaspace", "CTC", "ByteFallback", "Fuse", "Strip"},
}  # fmt: skip


class AmplifyingTokenizer(CheckpointError):
    """A tokenizer (a tokenizer.json, or a sentencepiece model's charsmap) that can lengthen a text more than
    attnviz lets a native library try."""


def _times(n: float) -> str:
    return f"{n:,.0f}" if n < 1e15 else f"{n:.1e}"


def _replace_growth(step: dict) -> float:
    """The most a Replace step lengthens a text: its content per character of a literal pattern, or, for a
    regular expression (which may match the empty string between any two characters), 1 + 2 x content."""
    pattern, content = step.get("pattern"), step.get("content")
    if not isinstance(pattern, dict) or not isinstance(content, str):
        raise AmplifyingTokenizer("its Replace step has no pattern or content attnviz can read")
    literal = pattern.get("String")
    if isinstance(literal, str) and literal:
        return max(1.0, len(content) / len(literal))
    return 1.0 + 2 * len(content)


def _precompiled_growth(step: dict) -> float:
    """The most a Precompiled (sentencepiece) normalizer lengthens a text: its longest replacement.

    The charsmap is a 4-byte trie size, the trie, then the replacements, each ended by a NUL byte; a
    replacement stands for at least one character. A charsmap that does not parse counts as one
    replacement as long as all of it.
    """
    import base64
    import binascii

    try:
        data = base64.b64decode(step.get("precompiled_charsmap") or b"", validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise AmplifyingTokenizer("its Precompiled normalizer's charsmap is not base64") from None
    return charsmap_growth(data)


def charsmap_growth(data: bytes) -> float:
    """The most a sentencepiece charsmap (a Precompiled step's, or a .model's own) lengthens a text.

    See `_precompiled_growth` for the layout; an empty charsmap (the identity) lengthens nothing.
    """
    trie = int.from_bytes(data[:4], "little") if len(data) >= 4 else len(data)
    strings = data[4 + trie :] if 4 + trie <= len(data) else data
    return float(max([1, *(len(part) for part in strings.split(b"\0"))]))


def growth(spec: object, part: str, depth: int = 0) -> float:
    """How many times at most the ``part`` ("normalizer", "pre_tokenizer" or "decoder") of a tokenizer.json,
    given as its JSON ``spec``, lengthens a text (for a decoder: the joined pieces it reads).

    An AmplifyingTokenizer for a step attnviz cannot bound (an unknown type, a custom step).
    """
    if spec is None:
        return 2.0 if part == "decoder" else 1.0  # without a decoder the pieces are joined with spaces
    kind = spec.get("type") if isinstance(spec, dict) else None
    if not isinstance(kind, str) or depth > 16:
        raise AmplifyingTokenizer(f"its {part} is not one attnviz can read")
    steps = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers", "decoder": "decoders"}[part]
    if kind == "Sequence":
        inner = spec.get(steps)
        if not isinstance(inner, list):
            raise AmplifyingTokenizer(f"its {part} sequence lists no steps")
        return math.prod(growth(step, part, depth + 1) for step in inner)
    if kind in SAME_LENGTH[part]:
        return 1.0
    if kind == "Replace" and part in ("normalizer", "decoder"):
        return _replace_growth(spec)
    if part == "normalizer":
        prepend = spec.get("prepend")
        if kind == "Prepend" and isinstance(prepend, str):
            return 1.0 + len(prepend)  # once per stretch of text between added tokens: at most once a character
        if kind in NORMAL_FORMS:
            return float(NORMAL_FORMS[kind])
        if kind == "Lowercase":
            return 3.0  # a character lowercases to at most 2 (U+0130); 3 leaves room for other Unicode versions
        if kind == "ByteLevel":
            return 4.0  # a character of n UTF-8 bytes becomes n characters
        if kind == "BertNormalizer":
            return 3.0 * NORMAL_FORMS["NFD"] * 3.0  # CJK characters spaced, accents split off (NFD), lowercased
        if kind == "Precompiled":
            return _precompiled_growth(spec)
    if part == "pre_tokenizer":
        if kind == "Metaspace":
            return 2.0  # a space becomes "▁", and each word may gain one in front
        if kind == "ByteLevel":
            return 5.0  # a character of n UTF-8 bytes becomes n characters; a space may be added in front
    if part == "decoder" and kind in ("WordPiece", "BPEDecoder"):
        return 2.0  # pieces joined with a space between them
    raise AmplifyingTokenizer(
        f"its {part} step {describe(kind)} is not one attnviz knows how far it lengthens a text, so it is not run"
    )


class TokenizersFile:
    """What every tokenizer read from a ``tokenizer.json`` (the ``tokenizers`` library, as ``self.tok``)
    shares: reading it with its growth bounded, encoding and decoding within that bound, and the
    vocabulary's size. BERT's and the language models' derive from it."""

    tok: object  # a tokenizers.Tokenizer
    text_growth: float = 1.0  # how many times the normalizer and the pre-tokenizer can lengthen a text
    decode_growth: float = 2.0  # how many times the decoder can lengthen the pieces it joins

    def _read(self, tokenizer_json: str) -> dict:
        """tokenizer.json's JSON, once its growth is known to be bounded; sets ``self.tok``, with no padding
        or truncation. An AmplifyingTokenizer, before the library reads it, for one that is not."""
        from tokenizers import Tokenizer as HFTokenizer

        spec = json.loads(tokenizer_json)
        if not isinstance(spec, dict):
            raise AmplifyingTokenizer("it is not a JSON object")
        normalizer, pre = (
            growth(spec.get("normalizer"), "normalizer"),
            growth(spec.get("pre_tokenizer"), "pre_tokenizer"),
        )
        self.text_growth, self.decode_growth = normalizer * pre, growth(spec.get("decoder"), "decoder")
        for what, times in (("normalizer and pre-tokenizer", self.text_growth), ("decoder", self.decode_growth)):
            if times > MAX_GROWTH:
                raise AmplifyingTokenizer(
                    f"its {what} can make a text up to {_times(times)} times longer before the model reads it; "
                    f"attnviz reads tokenizers that lengthen a text at most {MAX_GROWTH:,} times (the tokenizers "
                    "library ends the whole process when memory runs out)"
                )
        self.tok = HFTokenizer.from_str(tokenizer_json)  # after the check: added tokens go through the normalizer
        self.tok.no_padding()
        self.tok.no_truncation()
        # A special token's text typed by a person ("[CLS]", "<|endoftext|>") is read as text, as attnviz's own
        # tokenizer reads "<s>": the model's special tokens are the ones its input adds, never the user's.
        self.tok.encode_special_tokens = True
        return spec

    def _encode(self, text: str, side: str):
        """The library's encoding of ``text``, once its worst-case normalised length is within bounds."""
        check_growth(text, self.text_growth, side)
        return self.tok.encode(text)

    def _encode_text(self, text: str, side: str):
        """`_encode`, and an InputError (`check_read`) when no piece is the text's own, only special tokens."""
        enc = self._encode(text, side)
        check_read(sum(1 for special in enc.special_tokens_mask if not special), side)
        return enc

    def _decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        """The library's decoding of ``ids``, once its worst-case length is within bounds."""
        ids = [int(i) for i in ids]
        pieces = sum(len(self.tok.id_to_token(i) or "") for i in ids)
        if pieces * self.decode_growth > MAX_NORMALIZED_CHARS:
            raise InputError(
                f"these {len(ids):,} tokens spell {pieces:,} characters, which this model's decoder can lengthen "
                f"{_times(self.decode_growth)} times: over the {MAX_NORMALIZED_CHARS:,} attnviz decodes"
            )
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode(self, ids: Iterable[int]) -> str:
        """Ids to text, special tokens dropped."""
        return self._decode(list(ids), skip_special_tokens=True)

    @property
    def src_vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    @property
    def tgt_vocab_size(self) -> int:
        return self.src_vocab_size


def sentencepiece_growth(model: bytes) -> float:
    """How many times at most a sentencepiece model's normalizer lengthens a text: the longest
    replacement of its charsmap (`charsmap_growth`), read from the model's bytes before the library
    loads them. sentencepiece, too, is native code that a text grown past memory takes down."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(model)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and its kin: a file that is no model at all,
        return 1.0  # which the library refuses in turn when it loads it, and the importer names the file
    return charsmap_growth(proto.normalizer_spec.precompiled_charsmap)


def check_growth(text: str, growth: float, side: str) -> None:
    """Refuse ``text`` when its worst-case normalised length (``growth`` times its own) passes
    `MAX_NORMALIZED_CHARS`, before any native library reads it."""
    if not isinstance(text, str):  # as check_text says it, which comes after
        raise InputError(f"the {side} text must be a string, got {type(text).__name__}")
    if len(text) * growth > MAX_NORMALIZED_CHARS:
        raise InputError(
            f"the {side} text has {len(text):,} characters, and this model's tokenizer can lengthen a text "
            f"{_times(growth)} times before reading it: attnviz lets it read at most "
            f"{MAX_NORMALIZED_CHARS:,} characters that way; shorten the text to "
            f"{int(MAX_NORMALIZED_CHARS // growth):,} characters"
        )


class SentencePieceTokenizer:
    """Source and target sentencepiece models (often the same one) and the special ids.

    With ``decoder_only`` (attnviz's own language models) there is one text, the prompt:
    `encode_source` gives the decoder's input, ``<s>`` and the pieces, and there is no target.
    """

    def __init__(
        self, src_model: bytes, tgt_model: bytes | None = None, max_tokens: int = 1024, decoder_only: bool = False
    ):
        self.decoder_only = decoder_only
        # Read before the library loads the models: a charsmap that multiplies a text is refused here.
        self.growth = max(sentencepiece_growth(m) for m in (src_model, tgt_model) if m is not None)
        if self.growth > MAX_GROWTH:
            raise AmplifyingTokenizer(
                f"its sentencepiece normalizer can lengthen a text {_times(self.growth)} times; attnviz reads "
                f"tokenizers that lengthen a text at most {MAX_GROWTH:,} times (a native library ends the "
                "whole process when memory runs out)"
            )
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
        check_growth(text, self.growth, side)
        check_text(text, side, self.max_tokens, lambda part: len(sp.encode(part)))
        ids, tokens = [], []
        pieces = sp.encode(text, return_type="proto").pieces
        check_read(len(pieces), side)
        for piece in pieces:
            ids.append(piece.id)
            # An unknown character keeps its own text in the label, marked, so a map never shows
            # a row called just "<unk>" without saying what it stood for.
            tokens.append(f"<unk:{piece.surface}>" if piece.id == self.unk_id else piece.piece)
        words = sentencepiece_words([p.piece for p in pieces], first, surfaces=[p.surface for p in pieces])
        return Encoded(tuple(ids), tuple(tokens), tuple(words))

    def _check_length(self, n: int, side: str) -> None:
        if n > self.max_tokens:
            raise InputError(f"the {side} text is {n:,} tokens long; this model takes at most {self.max_tokens:,}")

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
