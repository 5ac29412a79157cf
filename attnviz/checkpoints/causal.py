"""What the decoder-only importers share: their tokenizer, sharded weights, and the loading recipe.

GPT-2 (`gpt2`), the Llama family (`llama`) and
Qwen2 (`qwen2`) are each a `Family`: how to read its config.json
into a [`TransformerConfig`][attnviz.config.TransformerConfig], which tensors its weights hold, and how they
become attnviz's parameters. The rest is here, the same for every family:

- the config is read and checked first, and a model over the limits, or with a feature attnviz
  does not implement, is refused before any other file is read;
- the tokenizer is ``tokenizer.json``, read with the ``tokenizers`` library: the ids are exactly
  the library's, with the BOS a Llama-family post-processor adds;
- the weights are ``model.safetensors``, or the shards a ``model.safetensors.index.json`` lists
  (``pytorch_model.bin`` only as `WeightsFile` allows it).

``transformers`` is never imported here; it is the independent implementation the tests compare with.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from attnviz.checkpoints.bundle import Bundle, checked_shapes, make_bundle, sha256_file
from attnviz.checkpoints.files import (
    BAD_WEIGHTS,
    CONFIG_FILE,
    SAFETENSORS_FILE,
    TOKENIZER_FILE,
    WeightsFile,
    folder_listing,
    has_model_type,
    hub_name,
    model_folder,
    plan_names,
    read_config,
    read_json,
    read_tokenizer_json,
    refuse_quantized,
    shown,
)
from attnviz.checkpoints.limits import current_limits
from attnviz.config import TransformerConfig
from attnviz.errors import CheckpointError, ConfigError, InputError, describe
from attnviz.tokenizer import Encoded, TokenizersFile, Word, check_text

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
MAX_FILE_NAME_BYTES = 255  # the longest file name Linux, macOS and Windows file systems take (NAME_MAX)
WORD_MARK = "\u2581"  # "▁": the app's mark of a piece that starts a word (sentencepiece's)
SHOWN = {" ": WORD_MARK, "\n": "↵", "\t": "⇥", "\r": "␍"}  # how a label shows what would be invisible
EXAMPLES = [
    "The capital of France is Paris. The capital of Germany is",
    "one two three four five one two three four five",
    "When Mary and John went to the store, John gave a drink to",
]


# ---------------------------------------------------------------------------------------------
# The tokenizer


@lru_cache(maxsize=1)
def _byte_of() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character that stands for each byte.

    Bytes that print as themselves (``!`` to ``~``, ``¡`` to ``¬``, ``®`` to ``ÿ``) keep their
    character; the other 68 are shifted to 256 + n in order (so that the space is ``Ġ``, U+0120).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def _is_byte_level(spec: object) -> bool:
    """Whether a tokenizer.json's decoder (or pre-tokenizer) is byte-level BPE (GPT-2, Llama 3, Qwen2)."""
    return '"ByteLevel"' in json.dumps(spec)


class CausalLMTokenizer(TokenizersFile):
    """A language model's ``tokenizer.json``, implementing `attnviz.tokenizer.Tokenizer`.

    The prompt is the model's only input, so `encode_source` encodes it (with the BOS the
    tokenizer's post-processor adds, if any) and `encode_target` refuses. Labels are the
    pieces as text: byte-level pieces (``Ġworld``) are turned back into their characters, and a
    space that starts a piece is shown as "▁", the mark the app draws for a word's start, as it is
    for sentencepiece models (whose pieces, ``▁world`` and ``<0x0A>``, are shown as they are).
    A piece holding part of a character's UTF-8 bytes shows them as ``<0xE2>``.
    """

    def __init__(self, tokenizer_json: str, max_tokens: int, bos_id: int | None, eos_id: int | None):
        spec = self._read(tokenizer_json)
        self.byte_level = _is_byte_level(spec.get("decoder")) or _is_byte_level(spec.get("pre_tokenizer"))
        self.special = {i for i, t in self.tok.get_added_tokens_decoder().items() if t.special}
        size = self.src_vocab_size
        self.eos_id = eos_id if eos_id is not None and 0 <= eos_id < size else 0
        self.bos_id = bos_id if bos_id is not None and 0 <= bos_id < size else self.eos_id
        unk = spec.get("model", {}).get("unk_token")
        self.unk_id = (
            self.tok.token_to_id(unk) if isinstance(unk, str) and self.tok.token_to_id(unk) is not None else -1
        )
        self.pad_id = self.eos_id  # never read: a language model's prompts are not padded here
        self.max_tokens = max_tokens

    def label(self, token_id: int) -> str:
        """A piece as text a reader can read (see the class's docstring)."""
        piece = self.tok.id_to_token(int(token_id))
        if piece is None:
            return f"<id {int(token_id)}>"
        if int(token_id) in self.special:
            return piece
        if self.byte_level:
            byte_of = _byte_of()
            if all(c in byte_of for c in piece):
                raw = bytes(byte_of[c] for c in piece)
                try:
                    piece = raw.decode("utf-8")
                except UnicodeDecodeError:
                    return "".join(f"<0x{b:02X}>" for b in raw)
        return "".join(SHOWN.get(c, c if c.isprintable() else f"<0x{ord(c):02X}>") for c in piece)

    def encode_source(self, text: str) -> Encoded:
        """The prompt: ids exactly as ``tokenizers`` gives them (a BOS where the post-processor adds one)."""
        check_text(text, "prompt", self.max_tokens, lambda part: len(self._encode(part, "prompt").ids))
        ids = tuple(self._encode_text(text, "prompt").ids)
        if len(ids) > self.max_tokens:
            raise InputError(f"the prompt is {len(ids):,} tokens long; this model takes at most {self.max_tokens:,}")
        return Encoded(ids, tuple(self.label(i) for i in ids), self.target_words(ids))

    def encode_target(self, text: str) -> tuple[Encoded, Encoded]:
        raise InputError(
            "a language model reads one text, its prompt, and continues it: there is no target sentence "
            "(use generate to continue the prompt)"
        )

    def target_token(self, token_id: int) -> str:
        return self.label(token_id)

    def target_words(self, ids: Sequence[int]) -> tuple[Word, ...]:
        """Words by the tokenizer's own marks: a piece whose label starts with "▁" (a space), or a new
        line, starts a word; a special token is a word of its own. A word's text is its pieces decoded."""
        groups: list[list[int]] = []
        for position, i in enumerate(ids):
            label = self.label(i)
            starts = label.startswith((WORD_MARK, "↵")) or int(i) in self.special
            after_special = groups and int(ids[groups[-1][0]]) in self.special
            if not groups or starts or after_special:
                groups.append([])
            groups[-1].append(position)
        words = []
        for group in groups:
            first = int(ids[group[0]])
            if first in self.special:
                words.append(Word(group[0], group[0] + 1, self.label(first), special=True))
                continue
            text = self._decode([ids[p] for p in group], skip_special_tokens=False).strip()
            words.append(Word(group[0], group[-1] + 1, text or "".join(self.label(ids[p]) for p in group)))
        return tuple(words)


def read_tokenizer(path: Path, max_tokens: int, bos_id: int | None, eos_id: int | None) -> CausalLMTokenizer:
    """The folder's ``tokenizer.json``, or a CheckpointError naming what is wrong."""
    return read_tokenizer_json(
        path, "a language model's tokenizer", lambda text: CausalLMTokenizer(text, max_tokens, bos_id, eos_id)
    )


# ---------------------------------------------------------------------------------------------
# Sharded weights


def _shard_problem(shard: str) -> str | None:
    """What makes ``shard``, a file name from an index, one attnviz does not open, or None.

    The name reaches the file system and, in messages, a terminal: one too long makes the OS raise
    (File name too long), and control characters would be run by the terminal that shows the error.
    """
    if not shard.endswith(".safetensors"):
        return "that is not a .safetensors file"
    if Path(shard).name != shard or "\\" in shard:  # a backslash: Windows' separator
        return "outside its folder"
    if len(shard.encode("utf-8", "surrogatepass")) > MAX_FILE_NAME_BYTES:
        return f"longer than a file name may be ({MAX_FILE_NAME_BYTES} bytes)"
    if not shard.isprintable():
        return "holding control or other unprintable characters"
    return None


class ShardedWeights(WeightsFile):
    """The tensors of the shards ``model.safetensors.index.json`` lists, read as one file is.

    The index's ``weight_map`` names each tensor's shard; every shard must be a plain file in the
    folder (no path elsewhere), its name one a file system takes and a terminal shows as it is
    (`_shard_problem`). A shard is opened when a tensor the model needs is first asked of it, so
    shards holding nothing the model reads are never opened or hashed (`opened`).
    """

    def __init__(self, index_file: Path, max_bytes: int, rename: Callable[[str], str] = lambda name: name):
        self.file = index_file
        self._tensors = None
        self._handle = None
        self._max_bytes, self._rename = max_bytes, rename
        index = read_json(index_file)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index_file} has no weight_map of tensor names to shard files", BAD_WEIGHTS)
        for shard in set(weight_map.values()):
            problem = _shard_problem(shard)
            if problem:
                raise CheckpointError(f"{index_file} names a shard ({describe(shard)}) {problem}", BAD_WEIGHTS)
        self.names = plan_names(index_file, weight_map, rename)
        self._shard_of = weight_map  # the stored name -> its shard's file name
        self.opened: dict[str, WeightsFile] = {}  # the shards read so far, by file name

    def _shard(self, name: str) -> WeightsFile:
        """The shard holding ``name`` (as the plan names it), opened on first use and checked to hold it."""
        stored = self.names[name]
        shard = self._shard_of[stored]
        if shard not in self.opened:
            self.opened[shard] = WeightsFile(self.file.parent / shard, self._max_bytes, self._rename)
        weights = self.opened[shard]
        if name not in weights:
            raise CheckpointError(
                f"{self.file} places tensor {shown(stored)} in {shard}, which does not hold it", BAD_WEIGHTS
            )
        return weights

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shard(name).shape(name)

    def get(self, name: str) -> torch.Tensor:
        return self._shard(name).get(name)


def open_weights(path: Path, max_bytes: int, rename: Callable[[str], str]) -> WeightsFile:
    """The folder's weights: ``model.safetensors``, its shards, or (as WeightsFile allows) a pickle."""
    if (path / SAFETENSORS_FILE).exists():
        return WeightsFile(path / SAFETENSORS_FILE, max_bytes, rename)
    if (path / INDEX_FILE).exists():
        return ShardedWeights(path / INDEX_FILE, max_bytes, rename)
    if (path / PICKLE_FILE).exists():
        return WeightsFile(path / PICKLE_FILE, max_bytes, rename)
    raise CheckpointError(
        f"{path} has no weights: expected {SAFETENSORS_FILE}, or {INDEX_FILE} and its shards; found "
        f"{folder_listing(path)}",
        BAD_WEIGHTS,
    )


# ---------------------------------------------------------------------------------------------
# A family, and loading one


@dataclass(frozen=True)
class Family:
    """One decoder-only family: its config.json's model types and how its files become a Bundle.

    ``config(hf, source)`` is the TransformerConfig (a CheckpointError naming ``source`` for anything
    unsupported); ``tensors(cfg)`` every stored tensor's name and shape; ``convert(raw, cfg)`` attnviz's
    parameters from those tensors; ``rename`` a stored name as ``tensors`` names it.
    """

    name: str
    model_types: tuple[str, ...]
    description: str
    source: str
    config: Callable[[dict, str], TransformerConfig]
    tensors: Callable[[TransformerConfig], dict[str, tuple[int, ...]]]
    convert: Callable[[Mapping[str, torch.Tensor], TransformerConfig], dict[str, torch.Tensor]]
    rename: Callable[[str], str] = lambda name: name

    def detect(self, path: Path) -> bool:
        return any(has_model_type(path, t) for t in self.model_types)

    def read_config(self, path: Path) -> tuple[dict, str]:
        """(config.json's JSON, its file name for messages), checked to be of this family and not quantized."""
        path = model_folder(path)
        hf = read_config(path)
        source = str(path / CONFIG_FILE)
        if not isinstance(hf, dict) or hf.get("model_type") not in self.model_types:
            raise CheckpointError(f"{source} is not a {self.description} config")
        refuse_quantized(hf, source)
        return hf, source

    def probe(self, path: Path) -> TransformerConfig:
        """The model config.json describes, refused when attnviz cannot run it or it is over the limits."""
        hf, source = self.read_config(path)
        cfg = self.config(hf, source)
        checked_shapes(cfg, source)
        return cfg

    def load(self, path: Path, device: str = "auto") -> Bundle:
        path = model_folder(path)
        hf, source = self.read_config(path)
        cfg = self.config(hf, source)
        _, max_bytes = checked_shapes(cfg, source)
        tokenizer = read_tokenizer(
            path, cfg.max_len, first_id(hf.get("bos_token_id")), first_id(hf.get("eos_token_id"))
        )
        if tokenizer.src_vocab_size > cfg.tgt_vocab_size:
            raise CheckpointError(
                f"{path / TOKENIZER_FILE} has {tokenizer.src_vocab_size} tokens but {source} declares a vocabulary of "
                f"{cfg.tgt_vocab_size}: the files are from different models"
            )
        weights = open_weights(path, max_bytes, self.rename)
        shapes = self.tensors(cfg)
        optional = {name for name in shapes if name.endswith("?")}  # a tied head a file may or may not repeat
        plan = {name.rstrip("?"): [name.rstrip("?")] for name in shapes if name not in optional or name[:-1] in weights}
        raw = weights.read(plan, {name.rstrip("?"): shape for name, shape in shapes.items()})
        tensors = self.convert(raw, cfg)
        if (
            "lm_head.weight" in raw
            and cfg.tie_output
            and not torch.equal(raw["lm_head.weight"], tensors["src_embed.weight"])
        ):
            raise CheckpointError(f"{weights.file}: lm_head.weight differs from the embedding, which {source} ties")
        info = {
            "family": self.name,
            "architecture": _architecture(hf.get("architectures"), self.name),
            "source": self.source,
            "name": hub_name(path),
            "weights_file": weights.file.name,
            "examples": list(EXAMPLES),
            "decoder_only": True,
        }
        if isinstance(weights, ShardedWeights):  # one digest for the shards read: a change in any is seen
            shards = [weights.opened[name] for name in sorted(weights.opened)]
            digest = hashlib.sha256("".join(sha256_file(shard.file) for shard in shards).encode()).hexdigest()
            return make_bundle(cfg, tensors, tokenizer, shards[0].file, info, device, sha256=digest)
        return make_bundle(cfg, tensors, tokenizer, weights.file, info, device)


def _architecture(names: object, family: str) -> str:
    """The first class config.json's ``architectures`` names, if it is a short text, else the family's."""
    if isinstance(names, list) and names and isinstance(names[0], str) and 0 < len(names[0]) <= 100:
        return names[0]
    return f"{family} (decoder-only)"


def first_id(value: object) -> int | None:
    """A token id from config.json: an int, or the first of a list (Llama 3.1 lists several end tokens)."""
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def checked(fail: Callable[[str], CheckpointError], build: Callable[[], TransformerConfig]) -> TransformerConfig:
    """``build()``, with a ConfigError (a value our config refuses) said as the family's ``fail``."""
    try:
        return build()
    except ConfigError as e:
        raise fail(str(e)) from None


def positions(n: int, rotary: bool) -> int:
    """The longest input: config.json's positions (checked), and for rotary models (no table to allocate)
    at most the server's ``ATTNVIZ_MAX_POSITIONS``, so that Llama 3's 131072 loads and is read up to it."""
    return min(n, current_limits().max_positions) if rotary else n


def refuse_unsupported(hf: dict, fail: Callable[[str], CheckpointError], checks: Mapping[str, Callable]) -> None:
    """Raise ``fail`` for the first config key whose check says what it asks for (a string), or pass."""
    for key, check in checks.items():
        if key in hf:
            problem = check(hf[key])
            if problem:
                raise fail(f'"{key}": {describe(hf[key])} asks for {problem}, which attnviz does not implement')
