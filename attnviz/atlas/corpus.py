"""A corpus for the atlas: one sentence per line, tokenised once, bad lines counted, work cut to size.

A line is read as its sentence without the white space around it (`sentence_text`), whether it comes
from a file (the CLI) or is pasted (the app), so both read the same text as the same sentences. A line
that cannot be used (empty, too long for the model, not UTF-8, with characters the model's
tokenizer cannot read unless they are allowed, or whose target line is empty, too long or has such
characters) is skipped and counted by reason, never fatal. The usable sentences are sorted by
length and cut into shards (the unit of work written to disk, and of resuming) and batches
(sentences of similar length run together, so padding stays small).

A corpus file is read in chunks of a bounded number of lines (`read_chunks`), never whole: the
sorting happens within a chunk, so memory stays bounded whatever the corpus's size, and a chunk,
being consecutive lines, is also a run of the final tables in corpus order.
"""

from __future__ import annotations

import codecs
import hashlib
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from attnviz.errors import InputError
from attnviz.tokenizer import ReadAsNothing, Tokenizer

SKIP_REASONS = ("empty", "too_long", "not_utf8", "empty_target", "target_too_long", "unknown", "unknown_target")
SKIP_WORDS = {  # each reason as a count of lines says it: "3 too long", "2 with characters the tokenizer cannot read"
    "unknown": "with characters the tokenizer cannot read",
    "unknown_target": "whose target has characters the tokenizer cannot read",
}


def skipped_words(skipped: dict[str, int]) -> str:
    """'2 empty, 1 with characters the tokenizer cannot read': the reasons lines were skipped, or ''."""
    return ", ".join(f"{n} {SKIP_WORDS.get(why, why.replace('_', ' '))}" for why, n in skipped.items() if n)


# Cells (sentences x query x key positions) of one head's maps in a batch: a batch of long
# sentences holds fewer of them, so that its maps (cells x layers x heads x 4 bytes per kind)
# stay in memory. 2**19 cells is 96 MB of maps per kind for the base model's 6 x 8 heads.
MAX_CELLS = 2**19
# A batch of sorted sentences is cut early where the next sentence would make padding more than
# MAX_WASTE of its tokens, once it holds MIN_TOKENS tokens: the model's matrix products stay large
# (bfloat16 on AMX ran slower below about 2000 rows) while padding, which costs as much as a real
# token in every product, stays small. In bench_atlas (128 sentences, --batch 32, base-size model,
# 2-core Intel Xeon) the engine took 0.86 of the time of batches of 32 sorted by source length in
# fp32 and 0.89 in bf16; 1024 tokens or a waste of 0.2 ran alike, 4096 tokens slower in fp32. On a
# 2-core AMD EPYC (AVX-512), fp32, 1024 tokens took 0.93 of 2048's time, and 0.94 with oneDNN and
# ATen held to AVX2 (median of 4 runs each; 512 tokens: 0.93 and 0.92): 1024 is level on the Xeon
# and faster on the EPYCs.
MIN_TOKENS = 1024
MAX_WASTE = 0.1


@dataclass(frozen=True)
class Sentence:
    """One usable line of the corpus, tokenised: what a worker needs to run it."""

    line: int  # 1-based line number in the corpus file
    src: str
    src_ids: tuple[int, ...]
    src_tokens: tuple[str, ...]
    tgt_ids: tuple[int, ...] | None = None  # the decoder input, start token first; None: the model's greedy output
    tgt_tokens: tuple[str, ...] | None = None

    @property
    def size(self) -> tuple[int, int]:
        """(source length, decoder input length or 0): what sorting and batching go by."""
        return len(self.src_ids), len(self.tgt_ids or ())


@dataclass(frozen=True)
class Corpus:
    sentences: tuple[Sentence, ...]  # the usable lines, in corpus order
    lines: int  # lines read (at most --limit)
    skipped: dict[str, int]  # reason -> count, every reason of SKIP_REASONS present


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


MAX_LINE_BYTES = 1 << 20  # a longer line is read this far only: no sentence a model reads is longer


UTF8_BOM = b"\xef\xbb\xbf"


def iter_lines(path: Path, limit: int | None = None) -> Iterator[str | None]:
    """The first ``limit`` lines of the file at ``path`` (all without it), read one at a time, as
    `split_lines` splits them (a byte-order mark before the first dropped): ``--limit 10`` reads ten lines
    of a 100 MB corpus, not the file.

    A line is read up to `MAX_LINE_BYTES`, its rest read in blocks to check that it is UTF-8 and never
    held whole: such a line is too long for any model, and is skipped later for that reason (or as not
    UTF-8, None, when it is not).
    """
    count = 0
    with open(path, "rb") as f:
        while limit is None or count < limit:
            chunk = f.readline(MAX_LINE_BYTES)
            if not chunk:
                break
            count += 1
            if count == 1:  # a byte-order mark, as Windows editors write one, is no character of the first line
                chunk = chunk.removeprefix(UTF8_BOM)
            if chunk.endswith(b"\n"):
                chunk = chunk[:-1]
            elif len(chunk) == MAX_LINE_BYTES:  # cut: the rest of this line is read in blocks, then dropped
                yield _cut_line(chunk, f)
                continue
            try:
                yield chunk.removesuffix(b"\r").decode("utf-8")
            except UnicodeDecodeError:
                yield None


def _cut_line(first: bytes, f) -> str | None:
    """A line longer than `MAX_LINE_BYTES` whose ``first`` bytes were read from ``f``: those decoded (a
    character cut at their end left out), or None when the line, read on to its end one block at a time,
    is not UTF-8."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    block = first
    try:
        text = decoder.decode(first)
        while not block.endswith(b"\n") and (block := f.readline(MAX_LINE_BYTES)):
            decoder.decode(block.removesuffix(b"\n"))  # checked, then dropped
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        while block and not block.endswith(b"\n"):  # the rest of the line, unread into memory
            block = f.readline(MAX_LINE_BYTES)
        return None
    return text


def read_lines(path: Path, limit: int | None = None) -> list[str | None]:
    """The lines `iter_lines` gives, as a list."""
    return list(iter_lines(path, limit))


def sentence_text(line: str | None) -> str | None:
    """The sentence a corpus line holds: the line without the white space around it (Python's
    `str.strip`: spaces, tabs, a ``\\r``, U+2028, U+0085, U+3000 and the rest), or None for a line that
    is not UTF-8. Both the command line (`tokenize`, on each line of a file) and the app (`text_lines`,
    on pasted text) read a line through it, so both read the same text as the same sentences."""
    return None if line is None else line.strip()


def text_lines(text: str) -> list[str]:
    """The sentences of typed or pasted ``text``, split as `split_lines` splits a file (only ``\\n`` ends a line,
    ``\\r\\n`` too, so a Unicode line separator or a lone ``\\r`` stays inside its sentence) and read by
    `sentence_text`, blank lines dropped: the sentences `tokenize` reads from a file of that text. A file's
    blank line is skipped as empty but keeps its number, so there ``line`` is the line's number in the
    file; pasted text has no file, and ``line`` counts these sentences, blank lines not counted."""
    return [s for line in text.removeprefix("\ufeff").split("\n") if (s := sentence_text(line))]


def split_lines(data: bytes, limit: int | None = None) -> list[str | None]:
    """The lines of a file's bytes (a final newline ends the last line; "\\r\\n" counts as one newline; a
    byte-order mark before the first is dropped).

    A line that is not UTF-8 is None. Only ``\\n`` ends a line, so text with Unicode line
    separators inside stays one sentence.
    """
    raw = data.removeprefix(UTF8_BOM).split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    lines = []
    for chunk in raw[:limit]:
        try:
            lines.append(chunk.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError:
            lines.append(None)
    return lines


def tokenize(
    tokenizer: Tokenizer,
    sources: Sequence[str | None],
    targets: Sequence[str | None] | None = None,
    first_line: int = 1,
    allow_unknown: bool = False,
) -> Corpus:
    """The usable sentences of ``sources`` (and their ``targets``, line by line), and why the others were skipped.

    ``first_line`` is the line number of ``sources[0]`` in its file (a chunk of a corpus starts further on).
    Each line and target is read by `sentence_text`, as the app reads pasted text. A line with characters
    the tokenizer cannot read (its unknown token) is skipped unless ``allow_unknown``:
    the model would read them all as one and the same token, as the other commands refuse such a text.
    """
    unknown = -1 if allow_unknown else tokenizer.unk_id  # -1: a tokenizer without an unknown token
    if targets is not None and len(targets) != len(sources):
        raise InputError(
            f"the targets have {len(targets)} lines but the corpus has {len(sources)}; give one target line per "
            "source line"
        )
    skipped: Counter[str] = Counter(dict.fromkeys(SKIP_REASONS, 0))
    sentences = []
    for index, line in enumerate(sources):
        src, tgt = sentence_text(line), None if targets is None else sentence_text(targets[index])
        if src is None or (targets is not None and tgt is None):
            skipped["not_utf8"] += 1
            continue
        if not src:
            skipped["empty"] += 1
            continue
        try:  # besides a text read as nothing, the only InputError a tokenizer raises is about its length
            enc = tokenizer.encode_source(src)
        except ReadAsNothing:
            skipped["empty"] += 1
            continue
        except InputError:
            skipped["too_long"] += 1
            continue
        if unknown >= 0 and unknown in enc.ids:
            skipped["unknown"] += 1
            continue
        tgt_ids = tgt_tokens = None
        if tgt is not None:
            if not tgt:
                skipped["empty_target"] += 1
                continue
            try:
                dec, _ = tokenizer.encode_target(tgt)
            except ReadAsNothing:
                skipped["empty_target"] += 1
                continue
            except InputError:
                skipped["target_too_long"] += 1
                continue
            if unknown >= 0 and unknown in dec.ids:
                skipped["unknown_target"] += 1
                continue
            tgt_ids, tgt_tokens = dec.ids, dec.tokens
        sentences.append(Sentence(first_line + index, src, enc.ids, enc.tokens, tgt_ids, tgt_tokens))
    return Corpus(tuple(sentences), len(sources), dict(skipped))


def by_length(sentences: Iterable[Sentence]) -> list[Sentence]:
    """Shortest first (source, then decoder input), corpus order among equals: a deterministic plan."""
    return sorted(sentences, key=lambda s: (*s.size, s.line))


def shards(sentences: Iterable[Sentence], shard_size: int) -> list[tuple[Sentence, ...]]:
    """The sentences by length, in consecutive groups of ``shard_size``."""
    ordered = by_length(sentences)
    return [tuple(ordered[i : i + shard_size]) for i in range(0, len(ordered), shard_size)]


def read_chunks(
    tokenizer: Tokenizer,
    corpus: Path,
    targets: Path | None,
    limit: int | None,
    chunk_lines: int,
    allow_unknown: bool = False,
) -> Iterator[Corpus]:
    """The corpus file (and its targets, line by line) read and tokenised ``chunk_lines`` lines at a
    time: one `Corpus` per chunk, its sentences numbered by their line in the file. Only one chunk's
    lines are ever in memory. Both files must have the same number of lines (`survey` checks it)."""
    sources = iter_lines(corpus, limit)
    given = None if targets is None else iter_lines(targets, limit)
    first = 1
    while src := list(islice(sources, chunk_lines)):
        tgt = None if given is None else list(islice(given, chunk_lines))
        yield tokenize(tokenizer, src, tgt, first_line=first, allow_unknown=allow_unknown)
        first += len(src)


def count_lines(path: Path, limit: int | None = None) -> int:
    """How many lines `iter_lines` reads from ``path``: its newlines, and a last line without one,
    counted in 1 MB blocks (a million short lines in a few hundredths of a second)."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
            if limit is not None and count >= limit:
                return limit
    count += last != b"\n"
    return count if limit is None else min(count, limit)


@dataclass(frozen=True)
class Survey:
    """What one pass over a corpus file finds before any work: its counts, its shards, its heaviest line."""

    lines: int  # lines read (at most --limit)
    sentences: int  # usable lines
    skipped: dict[str, int]  # reason -> count, every reason of SKIP_REASONS present
    chunk_shards: tuple[tuple[int, ...], ...]  # per chunk, the sizes of its shards (sentences), in shard order
    heaviest: tuple[int, Sentence] | None  # the largest weight any sentence has, and that sentence (the first such)

    @property
    def shard_sizes(self) -> list[int]:
        """Every shard's size, numbered across the chunks."""
        return [size for chunk in self.chunk_shards for size in chunk]


def survey(
    tokenizer: Tokenizer,
    corpus: Path,
    targets: Path | None,
    limit: int | None,
    chunk_lines: int,
    shard_size: int,
    weight: Callable[[Sentence], int],
    reading: Callable[[int, int], None] | None = None,
    allow_unknown: bool = False,
) -> Survey:
    """One pass over the corpus in chunks (`read_chunks`): counts, the shards each chunk is cut into
    (`shards`), and the sentence of the largest ``weight``; the targets' line count checked first.
    ``reading(lines read, lines in all)`` is called as the pass goes, a chunk at a time."""
    total = count_lines(corpus, limit) if reading is not None or targets is not None else 0
    if reading is not None:
        reading(0, total)
    if targets is not None:
        n_src, n_tgt = total, count_lines(targets, limit)
        if n_src != n_tgt:
            raise InputError(
                f"the targets have {n_tgt} lines but the corpus has {n_src}; give one target line per source line"
            )
    lines, usable, skipped = 0, 0, Counter(dict.fromkeys(SKIP_REASONS, 0))
    chunk_shards, heaviest = [], None
    for chunk in read_chunks(tokenizer, corpus, targets, limit, chunk_lines, allow_unknown):
        lines, usable = lines + chunk.lines, usable + len(chunk.sentences)
        skipped.update(chunk.skipped)
        full, rest = divmod(len(chunk.sentences), shard_size)
        chunk_shards.append((shard_size,) * full + ((rest,) if rest else ()))
        for sentence in chunk.sentences:
            w = weight(sentence)
            if heaviest is None or w > heaviest[0]:
                heaviest = (w, sentence)
        if reading is not None:
            reading(lines, total)
    return Survey(lines, usable, dict(skipped), tuple(chunk_shards), heaviest)


def by_width(sentences: Iterable[Sentence]) -> list[Sentence]:
    """Narrowest first, by the longer side (source or decoder input): how a batch pads to its longest
    source and its longest decoder input, both of which should stay close to every sentence's."""
    return sorted(sentences, key=lambda s: (max(s.size), *s.size, s.line))


def batches(
    sentences: Sequence[Sentence],
    max_sentences: int,
    max_cells: int = MAX_CELLS,
    min_tokens: int = MIN_TOKENS,
    max_waste: float = MAX_WASTE,
) -> list[list[Sentence]]:
    """Consecutive runs of the (sorted) ``sentences``: at most ``max_sentences`` each, at most
    ``max_cells`` cells per head once padded to the longest (a long sentence still runs alone),
    and, once a batch holds ``min_tokens`` tokens, no sentence that would make padding more than
    ``max_waste`` of its tokens (source and decoder input, each padded to the batch's longest)."""
    out: list[list[Sentence]] = []
    current: list[Sentence] = []
    tokens = longest_src = longest_tgt = 0  # the current batch's
    for sentence in sentences:
        src, tgt = sentence.size
        grown_src, grown_tgt = max(longest_src, src), max(longest_tgt, tgt)
        grown, n = max(grown_src, grown_tgt), len(current) + 1
        if current and (
            n > max_sentences
            or n * grown * grown > max_cells
            or (tokens >= min_tokens and n * (grown_src + grown_tgt) > (1 + max_waste) * (tokens + src + tgt))
        ):
            out.append(current)
            current, tokens, grown_src, grown_tgt = [], 0, src, tgt
        current.append(sentence)
        tokens, longest_src, longest_tgt = tokens + src + tgt, grown_src, grown_tgt
    if current:
        out.append(current)
    return out


def batch_plan(sentences: Iterable[Sentence], max_sentences: int) -> list[list[Sentence]]:
    """The batches every engine runs (local and Ray alike): by width, then `batches`."""
    return batches(by_width(sentences), max_sentences)


def is_punctuation(piece: str) -> bool:
    """Whether a piece is punctuation only (Unicode category P), once its word marker ("▁", "##") is removed."""
    text = piece.removeprefix("▁").removeprefix("##")
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def special_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """The ids of the tokens a tokenizer adds itself: start, end and padding (BERT's [CLS], [SEP], [PAD]).

    The unknown token is not one of them: it stands for a piece of the text.
    """
    listed = getattr(tokenizer, "special_ids", None) or {}
    ids = {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, *listed.values()}
    return frozenset(ids - {tokenizer.unk_id})
