"""Training and evaluation data, generated at run time from real locale data: no download.

Two translation tasks ship with attnviz:

* ``en-de``: English phrases to German where the word order changes: dates in the four CLDR
  formats (Babel's ``format_date``), clock times, money amounts (``format_currency``) and numbers
  written as words (``num2words``: "twenty-one" -> "einundzwanzig", ones before tens).
* ``reverse``: a sequence of letters to the same letters backwards; its cross-attention is the
  anti-diagonal of the textbook.

and two for language models, where each pair is one text: ``induction`` (random letters, then
the same again) and ``induction-long`` (the same with 3,600 made-up words, and texts of up to
4,095 tokens for a model with a long context).

Every task splits the space of source strings in two by a hash of the source: training only ever
draws from the ``train`` part and evaluation only from the ``heldout`` part, so the evaluation
inputs were never seen in training, whatever the seeds.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
import string
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from attnviz.errors import InputError

HELDOUT_SHARE = 10  # one source string in ten is held out


def is_heldout(src: str) -> bool:
    """True for the held-out tenth of source strings (by CRC-32, stable across runs and machines)."""
    return zlib.crc32(src.encode("utf-8")) % HELDOUT_SHARE == 0


def _clean(text: str) -> str:
    # CLDR puts narrow and ordinary no-break spaces in times and amounts; users type plain spaces.
    return text.replace("\u202f", " ").replace("\xa0", " ")


# ---------------------------------------------------------------------------------------------
# English -> German


def _random_date(rng: random.Random) -> dt.date:
    start = dt.date(1900, 1, 1).toordinal()
    return dt.date.fromordinal(rng.randint(start, dt.date(2099, 12, 31).toordinal()))


def _date_pair(rng: random.Random) -> tuple[str, str]:
    from babel.dates import format_date

    day = _random_date(rng)
    style = rng.choice(("full", "long", "medium", "short"))
    if style == "medium" and format_date(day, "medium", locale="en_US") == format_date(day, "long", locale="en_US"):
        # "May 25, 1923" is both the long and the medium English form (May needs no abbreviation),
        # but German writes them differently ("25. Mai 1923", "25.05.1923"): one source, one target.
        style = "long"
    return format_date(day, style, locale="en_US"), format_date(day, style, locale="de_DE")


def _time_pair(rng: random.Random) -> tuple[str, str]:
    from babel.dates import format_time

    clock = dt.time(rng.randrange(24), rng.randrange(60))
    return format_time(clock, "short", locale="en_US"), format_time(clock, "short", locale="de_DE")


def _money_pair(rng: random.Random) -> tuple[str, str]:
    from babel.numbers import format_currency

    cents = int(10 ** rng.uniform(0, 7))  # 0.01 .. 99,999.99, spread over magnitudes
    amount = cents / 100
    currency = rng.choice(("EUR", "USD", "GBP"))
    return format_currency(amount, currency, locale="en_US"), format_currency(amount, currency, locale="de_DE")


def _number_pair(rng: random.Random) -> tuple[str, str]:
    from num2words import num2words

    n = rng.randrange(10_000)
    return num2words(n, lang="en"), num2words(n, lang="de")


_EN_DE_KINDS: tuple[tuple[Callable[[random.Random], tuple[str, str]], float], ...] = (
    (_date_pair, 0.40),
    (_number_pair, 0.35),
    (_money_pair, 0.15),
    (_time_pair, 0.10),
)


# Pieces the en-de tokenizer always keeps whole (sentencepiece ``user_defined_symbols``), so that a
# German number word splits into its parts ("ein" "und" "zwanzig") and its cross-attention can
# show the ones-before-tens reordering; byte-pair merges alone glue them into opaque chunks.
# Symbols match anywhere, so English words that contain one ("h-und-red", "S-und-ay") are listed
# whole, with the word-start mark, to win the longest match.
EN_DE_SYMBOLS = (
    *"eins ein zwei drei vier fünf sechs sieben acht neun zehn elf zwölf".split(),
    *"dreizehn vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn".split(),
    *"zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig hundert tausend und".split(),
    "\u2581hundred",
    "\u2581Sunday",
)


def _en_de_pair(rng: random.Random) -> tuple[str, str]:
    make = rng.choices([k for k, _ in _EN_DE_KINDS], weights=[w for _, w in _EN_DE_KINDS])[0]
    src, tgt = make(rng)
    return _clean(src), _clean(tgt)


# ---------------------------------------------------------------------------------------------
# Reverse


REVERSE_ALPHABET = string.ascii_lowercase
REVERSE_LENGTHS = (3, 20)


def _reverse_pair(rng: random.Random) -> tuple[str, str]:
    letters = rng.choices(REVERSE_ALPHABET, k=rng.randint(*REVERSE_LENGTHS))
    return " ".join(letters), " ".join(reversed(letters))


INDUCTION_LENGTHS = (4, 12)  # letters in the first half; the second half repeats them


def _induction_text(rng: random.Random) -> tuple[str, str]:
    """Random letters, then the same letters again (Olsson et al., 2022): "q w e r q w e r".

    The first half cannot be predicted; the second can, by finding the current letter's earlier
    occurrence and copying the letter after it, which is what an induction head does. A pair of
    the text with itself, since a language model's one text is both its input and its labels.
    """
    letters = rng.choices(REVERSE_ALPHABET, k=rng.randint(*INDUCTION_LENGTHS))
    text = " ".join(letters + letters)
    return text, text


# Made-up two-syllable words ("bako", "lemi"): 3,600 of them, one piece each, so that a random text
# of 2,047 distinct words, repeated once, fills 4,095 positions with `<s>` and never repeats a
# word by chance: every repeat is one an induction head can use.
LONG_CONSONANTS, LONG_VOWELS = "bdfgklmnprst", "aeiou"
LONG_SYLLABLES = tuple(c + v for c in LONG_CONSONANTS for v in LONG_VOWELS)
LONG_WORDS = tuple(a + b for a in LONG_SYLLABLES for b in LONG_SYLLABLES)
LONG_INDUCTION_LENGTHS = (8, 64)  # distinct words in the first half of a training text
LONG_INDUCTION_LONGEST = (65, 2047)  # ... and of a text of the last steps: up to 4,095 tokens with `<s>`
LONG_PROBE_WORDS = 2047  # words in each half of the probe: with `<s>`, 4,095 positions


def repeated_words(rng: random.Random, n: int) -> str:
    """``n`` distinct random words of `LONG_WORDS`, then the same ``n`` again."""
    words = rng.sample(LONG_WORDS, n)
    return " ".join(words + words)


def _long_induction_text(rng: random.Random) -> tuple[str, str]:
    """Distinct random words, then the same words again: the induction task with a large vocabulary."""
    text = repeated_words(rng, rng.randint(*LONG_INDUCTION_LENGTHS))
    return text, text


def _longest_induction_text(rng: random.Random) -> tuple[str, str]:
    """The same, of up to 4,095 tokens: the texts of the last steps (``Task.make_long_pair``)."""
    text = repeated_words(rng, rng.randint(*LONG_INDUCTION_LONGEST))
    return text, text


def long_probe(seed: int = 0, words: int = LONG_PROBE_WORDS) -> str:
    """A long text for ``induction-long``'s heads: ``words`` distinct random words, then the same again.

    The model card's scores are measured on ``long_probe(0)``, 4,095 tokens with `<s>`, which the
    shipped folder also holds as ``probe.txt``.
    """
    return repeated_words(random.Random(f"induction-long/probe/{seed}"), words)


# ---------------------------------------------------------------------------------------------
# Tasks


@dataclass(frozen=True)
class Task:
    """A generated dataset: how to draw a pair, and examples to show."""

    name: str
    description: str
    make_pair: Callable[[random.Random], tuple[str, str]]
    examples: tuple[str, ...]
    vocab_size: int  # sentencepiece vocabulary, shared by source and target
    spm_model_type: str = "bpe"
    symbols: tuple[str, ...] = ()  # pieces the tokenizer always keeps whole
    decoder_only: bool = False  # a language model's task: each pair is one text, read and predicted
    # Longer pairs for a recipe's last steps (``Recipe.long_steps``): heads form fast on short texts,
    # where a head's weight is shared among few keys, and then learn to keep their roles among thousands.
    make_long_pair: Callable[[random.Random], tuple[str, str]] | None = None

    def stream(self, seed: int, split: str = "train", long: bool = False) -> Iterator[tuple[str, str]]:
        """An endless stream of pairs drawn with ``seed`` from one split ("train" or "heldout"); with
        ``long``, of the task's long pairs."""
        if split not in ("train", "heldout"):
            raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
        if long and self.make_long_pair is None:
            raise ValueError(f"the task {self.name!r} has no long pairs")
        rng = random.Random(f"{self.name}/{split}/{seed}" + ("/long" if long else ""))
        make = self.make_long_pair if long else self.make_pair
        want_heldout = split == "heldout"
        while True:
            src, tgt = make(rng)
            if is_heldout(src) == want_heldout:
                yield src, tgt

    def pairs(self, n: int, seed: int, split: str = "train") -> list[tuple[str, str]]:
        """``n`` pairs drawn with ``seed`` from one split."""
        return list(itertools.islice(self.stream(seed, split), n))


TASKS: dict[str, Task] = {
    "en-de": Task(
        name="en-de",
        description=(
            "English to German dates, clock times, money amounts and numbers written as words, "
            "generated from CLDR locale data (Babel) and num2words"
        ),
        make_pair=_en_de_pair,
        examples=(
            "Thursday, July 2, 1998",
            "twenty-one",
            "three thousand, four hundred and fifty-six",
            "$1,234.50",
            "7/2/98",
            "3:45 PM",
        ),
        vocab_size=300,
        symbols=EN_DE_SYMBOLS,
    ),
    "reverse": Task(
        name="reverse",
        description="a sequence of 3 to 20 lowercase letters, written backwards",
        make_pair=_reverse_pair,
        examples=("a t t e n t i o n", "t r a n s f o r m e r", "a b c d e f g h"),
        vocab_size=4 + len(REVERSE_ALPHABET),  # one piece per letter, after the 4 special ids
        spm_model_type="word",
    ),
    "induction": Task(
        name="induction",
        description=(
            "continue 4 to 12 random lowercase letters followed by the same letters again, letter by letter: "
            "the setting in which induction heads form (Olsson et al., 2022)"
        ),
        make_pair=_induction_text,
        examples=("q w e r t y q w e r t y", "a t t e n t i o n a t t e n t i o n", "h e a d s h e a d s"),
        vocab_size=4 + len(REVERSE_ALPHABET),
        spm_model_type="word",
        decoder_only=True,
    ),
    "induction-long": Task(
        name="induction-long",
        description=(
            f"continue {LONG_INDUCTION_LENGTHS[0]} to {LONG_INDUCTION_LENGTHS[1]} distinct random made-up words "
            f"(from {len(LONG_WORDS):,}) followed by the same words again: the induction task with a vocabulary "
            "large enough for a text of thousands of tokens that repeats no word by chance"
        ),
        make_pair=_long_induction_text,
        make_long_pair=_longest_induction_text,
        examples=(
            "bako lemi tuda rosi pefa bako lemi tuda rosi pefa",
            "kanu dibo sele mato gupi rena kanu dibo sele mato gupi rena",
        ),
        vocab_size=4 + len(LONG_WORDS),
        spm_model_type="word",
        decoder_only=True,
    ),
}


def get_task(name: str) -> Task:
    """The task called ``name``; an InputError, listing the ones there are, for another (a model's config names
    its task, and one edited by hand or written by another attnviz may name any)."""
    try:
        return TASKS[name]
    except KeyError:
        raise InputError(f"unknown task {name!r}; the tasks are {', '.join(TASKS)}") from None
