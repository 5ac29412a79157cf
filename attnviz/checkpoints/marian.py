"""Hugging Face Marian (Helsinki-NLP opus-mt) checkpoints, loaded into attnviz's own Transformer.

Marian is the paper's base architecture with a few choices of its own, all representable in
[`TransformerConfig`][attnviz.config.TransformerConfig]: post-LN with epsilon 1e-5 and no LayerNorm after the
embeddings or at the stack ends, swish (SiLU) in classic opus-mt models and ReLU in tc-big ones,
embeddings scaled by sqrt(d_model), biases on every attention projection, a bias on the logits
(``final_logits_bias``), sinusoids with every sine before every cosine (not interleaved), and the
pad token as the decoder's start token. ``transformers`` is never imported: the config is read as
JSON, the weights with safetensors (or, for old pickled files, ``torch.load(weights_only=True)``),
and the tokenizer is rebuilt from ``source.spm`` / ``target.spm`` and ``vocab.json``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Container, Iterable, Sequence
from pathlib import Path

import sentencepiece as spm
import torch

from attnviz.checkpoints.bundle import Bundle, checked_shapes, make_bundle
from attnviz.checkpoints.fields import MAX_CLAIMED_POSITIONS, Fields
from attnviz.checkpoints.files import (
    CONFIG_FILE,
    SAFETENSORS_FILE,
    WeightsFile,
    folder_listing,
    has_model_type,
    hf_config_check,
    hub_name,
    model_folder,
    read_bytes,
    read_hf_config,
    read_json,
)
from attnviz.errors import CheckpointError, ConfigError, InputError
from attnviz.model import TransformerConfig, sinusoidal_table
from attnviz.tokenizer import (
    MAX_GROWTH,
    AmplifyingTokenizer,
    Encoded,
    Word,
    check_growth,
    check_read,
    check_text,
    model_words,
    sentencepiece_growth,
    sentencepiece_words,
)

log = logging.getLogger(__name__)

FAMILY = "marian"
PICKLE_FILE = "pytorch_model.bin"
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
VOCAB_FILE, TARGET_VOCAB_FILE = "vocab.json", "target_vocab.json"
DESCRIPTION = (
    f"a Hugging Face Marian folder such as a Helsinki-NLP opus-mt model ({CONFIG_FILE}, {SAFETENSORS_FILE} "
    f"or {PICKLE_FILE}, {SOURCE_SPM}, {TARGET_SPM}, {VOCAB_FILE})"
)
ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}
# Flags of older Marian/BART-style configs that describe an architecture we cannot represent: the
# value Marian uses, and what the flag would change.
FIXED_FLAGS = {
    "normalize_before": (False, "pre-LN layers"),
    "add_final_layer_norm": (False, "a LayerNorm at the end of each stack"),
    "normalize_embedding": (False, "a LayerNorm after the embeddings"),
    "layernorm_embedding": (False, "a LayerNorm after the embeddings"),
    "add_bias_logits": (False, "a separate logits bias layer"),
    "static_position_embeddings": (True, "learned positions"),
}
LANGUAGE_CODE = re.compile(r">>.+<<")  # a target-language tag such as ">>fra<<" (multilingual models)
SOURCE_EXAMPLES = {
    "en": ["The cat sat on the mat.", "I would like a cup of coffee, please.", "Where is the train station?"],
    "de": ["Die Katze sitzt auf der Matte.", "Ich hätte gern eine Tasse Kaffee."],
    "fr": ["Le chat est assis sur le tapis.", "Je voudrais une tasse de café."],
}


# ---------------------------------------------------------------------------------------------
# Finding the files


def detect(path: Path) -> bool:
    """Whether ``path`` (or the snapshot of a hub cache folder) holds a Marian config.json."""
    return has_model_type(path, "marian")


# ---------------------------------------------------------------------------------------------
# The config


def marian_config(hf: dict, unk_id: int = 1, source: str = CONFIG_FILE) -> TransformerConfig:
    """Our config for a Hugging Face Marian ``config.json`` (as a dict), refusing what we cannot run.

    ``unk_id`` comes from vocab.json (Marian's config does not hold it); ``source`` names the file
    in error messages.
    """

    fail = hf_config_check(hf, "marian", FIXED_FLAGS, source, "Marian")
    f = Fields(hf, fail)
    sizes = {}
    for enc, dec, default in (
        ("encoder_attention_heads", "decoder_attention_heads", 16),
        ("encoder_ffn_dim", "decoder_ffn_dim", 4096),
    ):
        sizes[enc], sizes[dec] = f.int(enc, default), f.int(dec, default)
        if sizes[enc] != sizes[dec]:
            raise fail(f'"{enc}" ({sizes[enc]}) differs from "{dec}" ({sizes[dec]})')
    activation = f.choice("activation_function", "gelu", ACTIVATIONS)
    eos = hf.get("eos_token_id")
    if isinstance(eos, list) and len(eos) > 1:
        raise fail(f'"eos_token_id" lists {len(eos):,} end tokens; attnviz stops on one')
    eos = f.token_id("eos_token_id", 0)
    pad = f.token_id("pad_token_id", 58100)
    shared = f.flag("share_encoder_decoder_embeddings", True)
    tied = f.flag("tie_word_embeddings", True)
    src_vocab = f.int("vocab_size", 58101)
    tgt_vocab = src_vocab if shared else (f.int("decoder_vocab_size", None, nullable=True) or src_vocab)
    fields = {
        "n_enc_layers": f.int("encoder_layers", 12),
        "n_dec_layers": f.int("decoder_layers", 12),
        "d_model": f.int("d_model", 1024),
        "dropout": f.number("dropout", 0.1, 0.0, 1.0),
        "max_len": f.int("max_position_embeddings", 1024, high=MAX_CLAIMED_POSITIONS),
        "tie_output": tied,
        "scale_embedding": f.flag("scale_embedding", False),
        "bos_id": f.token_id("decoder_start_token_id", pad),
    }
    try:
        return TransformerConfig(
            src_vocab_size=src_vocab,
            tgt_vocab_size=tgt_vocab,
            n_heads=sizes["encoder_attention_heads"],
            d_ff=sizes["encoder_ffn_dim"],
            norm_first=False,
            activation=ACTIVATIONS[activation],
            pos_encoding="sinusoidal_concat",
            # One vocabulary whose matrices are untied: transformers 5 ties the encoder's and the decoder's embeddings
            # to the shared one only with tie_word_embeddings, as it ties the output's, so they are two (and the shared
            # one is used by neither). transformers 4 tied them whatever the flag: its files store them equal.
            share_embeddings=shared and tied,
            output_bias=True,
            attn_bias=True,
            ln_eps=1e-5,
            pad_id=pad,
            eos_id=eos,
            unk_id=unk_id,
            **fields,
        )
    except ConfigError as e:
        raise fail(str(e)) from None


# ---------------------------------------------------------------------------------------------
# The tokenizer


class MarianTokenizer:
    """Marian's tokenisation implementing `attnviz.tokenizer.Tokenizer`.

    sentencepiece cuts text into pieces; vocab.json (target_vocab.json for a separate target
    vocabulary) maps pieces to ids, and pieces it lacks become ``<unk>``. ``</s>`` ends every
    sequence; there is no BOS: the decoder starts with the pad token.
    """

    def __init__(
        self,
        src_model: bytes,
        tgt_model: bytes,
        src_vocab: dict[str, int],
        tgt_vocab: dict[str, int] | None = None,
        *,
        pad_id: int,
        eos_id: int,
        unk_id: int,
        bos_id: int | None = None,
        max_tokens: int = 512,
    ):
        self.growth = max(sentencepiece_growth(src_model), sentencepiece_growth(tgt_model))
        if self.growth > MAX_GROWTH:  # read before the library loads them: sentencepiece is native code
            raise AmplifyingTokenizer(
                f"its sentencepiece normalizer can lengthen a text {self.growth:,.0f} times; attnviz reads "
                f"tokenizers that lengthen a text at most {MAX_GROWTH:,} times"
            )
        self.src = spm.SentencePieceProcessor(model_proto=src_model)
        self.tgt = self.src if tgt_model == src_model else spm.SentencePieceProcessor(model_proto=tgt_model)
        self.src_vocab = dict(src_vocab)
        self.tgt_vocab = self.src_vocab if tgt_vocab is None else dict(tgt_vocab)
        self.tgt_pieces = {i: piece for piece, i in self.tgt_vocab.items()}
        self.pad_id, self.eos_id, self.unk_id = pad_id, eos_id, unk_id
        self.bos_id = pad_id if bos_id is None else bos_id  # the decoder start token
        self.max_tokens = max_tokens

    def _pieces(
        self, sp: spm.SentencePieceProcessor, vocab: dict[str, int], text: str, side: str, first: int
    ) -> Encoded:
        """The pieces of ``text`` and their words, the first piece at position ``first`` of the sequence."""
        check_growth(text, self.growth, side)
        check_text(text, side, self.max_tokens, lambda part: len(sp.encode(part)))
        ids, tokens, words = [], [], []
        code = LANGUAGE_CODE.match(text)  # as Hugging Face's MarianTokenizer: the tag is one token
        if code:
            tag = code.group(0)
            ids.append(vocab.get(tag, self.unk_id))
            tokens.append(tag if ids[-1] != self.unk_id else f"<unk:{tag}>")
            words.append(Word(first, first + 1, tag, special=True))  # a tag is no word of the sentence
            text = LANGUAGE_CODE.sub("", text)
        pieces = sp.encode(text, return_type="proto").pieces
        check_read(len(pieces), side)  # a language tag alone is no sentence either
        for piece in pieces:
            ids.append(vocab.get(piece.piece, self.unk_id))
            tokens.append(f"<unk:{piece.surface}>" if ids[-1] == self.unk_id else piece.piece)
        surfaces = [piece.surface for piece in pieces]
        words += sentencepiece_words([piece.piece for piece in pieces], first + len(words), surfaces=surfaces)
        return Encoded(tuple(ids), tuple(tokens), tuple(words))

    def _check_length(self, n: int, side: str) -> None:
        if n > self.max_tokens:
            raise InputError(f"the {side} text is {n:,} tokens long; this model takes at most {self.max_tokens:,}")

    def encode_source(self, text: str) -> Encoded:
        """Encoder input: the pieces, then ``</s>``."""
        enc = self._pieces(self.src, self.src_vocab, text, "source", first=0)
        end = Word(len(enc.ids), len(enc.ids) + 1, "</s>", special=True)
        out = Encoded(enc.ids + (self.eos_id,), enc.tokens + ("</s>",), enc.words + (end,))
        self._check_length(len(out.ids), "source")
        return out

    def encode_target(self, text: str) -> tuple[Encoded, Encoded]:
        """(decoder input, labels): ``<pad> pieces`` and ``pieces </s>``, one shifted from the other."""
        enc = self._pieces(self.tgt, self.tgt_vocab, text, "target", first=1)
        start_label = self.target_token(self.bos_id)
        start = Word(0, 1, start_label, special=True)
        inp = Encoded((self.bos_id,) + enc.ids, (start_label,) + enc.tokens, (start,) + enc.words)
        labels = Encoded(enc.ids + (self.eos_id,), enc.tokens + ("</s>",))
        self._check_length(len(inp.ids), "target")
        return inp, labels

    def target_token(self, token_id: int) -> str:
        return self.tgt_pieces.get(int(token_id), "<unk>")

    def target_words(self, ids: Sequence[int]) -> tuple[Word, ...]:
        """The words of a decoder input the model wrote: the start and end tokens alone, the pieces by "▁"."""
        specials = {self.pad_id, self.bos_id, self.eos_id}
        return tuple(model_words([int(i) for i in ids], self.target_token, specials, self.tgt.decode_pieces))

    def decode(self, ids: Iterable[int]) -> str:
        """Target ids to text; special ids are dropped."""
        specials = {self.pad_id, self.bos_id, self.eos_id}
        pieces = [self.target_token(i) for i in ids if int(i) not in specials]
        return self.tgt.decode_pieces(pieces)

    @property
    def src_vocab_size(self) -> int:
        return max(self.src_vocab.values()) + 1

    @property
    def tgt_vocab_size(self) -> int:
        return max(self.tgt_vocab.values()) + 1


def _read_vocab(file: Path, vocab_size: int) -> dict[str, int]:
    if not file.exists():
        raise CheckpointError(f"{file} is missing: Marian's map from sentencepiece pieces to token ids")
    vocab = read_json(file)
    if not isinstance(vocab, dict) or not vocab or not all(isinstance(i, int) for i in vocab.values()):
        raise CheckpointError(f"{file} must hold a JSON object mapping each piece to an integer id")
    bad = [(p, i) for p, i in vocab.items() if not 0 <= i < vocab_size]
    if bad:
        raise CheckpointError(
            f"{file} maps {bad[:3]} outside the {vocab_size} ids {CONFIG_FILE} declares: the files are from "
            "different models"
        )
    return vocab


def _read_tokenizer(path: Path, cfg: TransformerConfig) -> MarianTokenizer:
    """vocab.json (and target_vocab.json) and the two sentencepiece models, with ``cfg``'s checked special ids."""
    cfg_vocab = (cfg.src_vocab_size, cfg.tgt_vocab_size)
    src_vocab = _read_vocab(path / VOCAB_FILE, cfg_vocab[0])
    tgt_vocab = None
    if (path / TARGET_VOCAB_FILE).exists():
        tgt_vocab = _read_vocab(path / TARGET_VOCAB_FILE, cfg_vocab[1])
    elif cfg_vocab[0] != cfg_vocab[1]:
        raise CheckpointError(
            f"{path / TARGET_VOCAB_FILE} is missing: config.json declares separate source ({cfg_vocab[0]}) and "
            f"target ({cfg_vocab[1]}) vocabularies"
        )
    models = {}
    for name in (SOURCE_SPM, TARGET_SPM):
        file = path / name
        if not file.exists():
            raise CheckpointError(f"{file} is missing: one of Marian's two sentencepiece models")
        models[name] = read_bytes(file)
        if not models[name]:  # sentencepiece would write its own log lines about it to stderr
            raise CheckpointError(f"{file} is empty: one of Marian's two sentencepiece models")
        if sentencepiece_growth(models[name]) > MAX_GROWTH:
            continue  # MarianTokenizer refuses it, with the reason, before the library reads it
        try:
            spm.SentencePieceProcessor(model_proto=models[name])
        except RuntimeError as e:
            raise CheckpointError(f"{file} is not a readable sentencepiece model ({e})") from None
    if "<unk>" not in src_vocab:
        raise CheckpointError(f"{path / VOCAB_FILE} has no '<unk>' entry: Marian vocabularies always do")
    return MarianTokenizer(
        models[SOURCE_SPM],
        models[TARGET_SPM],
        src_vocab,
        tgt_vocab,
        pad_id=cfg.pad_id,
        eos_id=cfg.eos_id,
        unk_id=src_vocab["<unk>"],
        bos_id=cfg.bos_id,
        max_tokens=cfg.max_len,
    )


# ---------------------------------------------------------------------------------------------
# The weights


def _key_map(cfg: TransformerConfig) -> dict[str, str]:
    """Our parameter name for each Hugging Face tensor name (embeddings are handled apart)."""
    names = {}
    attn = ("q_proj", "k_proj", "v_proj", "out_proj")
    for i in range(cfg.n_enc_layers):
        hf, ours = f"model.encoder.layers.{i}.", f"encoder_layers.{i}."
        for proj in attn:
            for p in ("weight", "bias"):
                names[f"{hf}self_attn.{proj}.{p}"] = f"{ours}self_attn.{proj}.{p}"
        for p in ("weight", "bias"):
            names[f"{hf}self_attn_layer_norm.{p}"] = f"{ours}attn_block.norm.{p}"
            names[f"{hf}fc1.{p}"] = f"{ours}ffn.up.{p}"
            names[f"{hf}fc2.{p}"] = f"{ours}ffn.down.{p}"
            names[f"{hf}final_layer_norm.{p}"] = f"{ours}ffn_block.norm.{p}"
    for i in range(cfg.n_dec_layers):
        hf, ours = f"model.decoder.layers.{i}.", f"decoder_layers.{i}."
        for proj in attn:
            for p in ("weight", "bias"):
                names[f"{hf}self_attn.{proj}.{p}"] = f"{ours}self_attn.{proj}.{p}"
                names[f"{hf}encoder_attn.{proj}.{p}"] = f"{ours}cross_attn.{proj}.{p}"
        for p in ("weight", "bias"):
            names[f"{hf}self_attn_layer_norm.{p}"] = f"{ours}self_block.norm.{p}"
            names[f"{hf}encoder_attn_layer_norm.{p}"] = f"{ours}cross_block.norm.{p}"
            names[f"{hf}fc1.{p}"] = f"{ours}ffn.up.{p}"
            names[f"{hf}fc2.{p}"] = f"{ours}ffn.down.{p}"
            names[f"{hf}final_layer_norm.{p}"] = f"{ours}ffn_block.norm.{p}"
    return names


def _own_or_shared(side: str, stored: Container[str]) -> str:
    """The stored name of ``side``'s own embedding: its own tensor, or the shared one where the file stores only that
    (transformers 4 saved a tied copy once, and tied the encoder's and decoder's embeddings to it whatever the
    config said)."""
    own = f"model.{side}.embed_tokens.weight"
    return own if own in stored or "model.shared.weight" not in stored else "model.shared.weight"


def _embedding_sources(cfg: TransformerConfig, stored: Container[str]) -> dict[str, tuple[str, ...]]:
    """For each embedding-like parameter of ours, the Hugging Face names that may hold it.

    Files differ in which copies of a tied matrix they store; every copy present must agree.
    """
    if cfg.share_embeddings:
        shared = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
        sources = {"src_embed.weight": shared}
        target_key = "src_embed.weight"
    else:  # a target vocabulary of its own, or one vocabulary untied (`marian_config`)
        sources = {
            "src_embed.weight": (_own_or_shared("encoder", stored),),
            "tgt_embed.weight": (_own_or_shared("decoder", stored),),
        }
        target_key = "tgt_embed.weight"
    if cfg.tie_output:
        sources[target_key] += ("lm_head.weight",)
    else:
        sources["out_proj"] = ("lm_head.weight",)
    return sources


def _plan(cfg: TransformerConfig, weights: WeightsFile) -> dict[str, list[str]]:
    """For each of our parameters, the Hugging Face tensors that hold it (tied copies after the first)."""
    plan = {ours: [hf] for hf, ours in _key_map(cfg).items()}
    plan.update({ours: list(names) for ours, names in _embedding_sources(cfg, weights).items()})
    if "final_logits_bias" in weights:
        plan["out_bias"] = ["final_logits_bias"]
    return plan


def _with_prefix(name: str) -> str:
    """A stored tensor's name as MarianMTModel saves it: a bare MarianModel state dict lacks "model."."""
    return name if name.startswith(("model.", "lm_head.", "final_logits_bias")) else f"model.{name}"


def _load_tensors(weights: WeightsFile, cfg: TransformerConfig, expected: dict) -> dict[str, torch.Tensor]:
    """Our parameters by name, read from the file after checking every name and shape."""
    tensors = {"out_bias": torch.zeros(cfg.tgt_vocab_size)}  # as in transformers, when the file has none
    if "final_logits_bias" not in weights:
        log.info("%s has no final_logits_bias; using zeros", weights.file)
    tensors.update(weights.read(_plan(cfg, weights), expected))
    table = torch.from_numpy(sinusoidal_table(cfg.max_len, cfg.d_model, "concat"))
    for side in ("encoder", "decoder"):
        key = f"model.{side}.embed_positions.weight"
        if key in weights:
            stored = weights.get(key)
            if tuple(stored.shape) != tuple(table.shape) or not torch.allclose(stored, table, atol=1e-5, rtol=0):
                raise CheckpointError(
                    f"{weights.file}: '{key}' is not the sinusoid table Marian uses (sines then cosines, positions "
                    "from 0); attnviz regenerates that table and cannot run other positions"
                )
    return tensors


def _weights_file(path: Path) -> Path:
    for name in (SAFETENSORS_FILE, PICKLE_FILE):
        if (path / name).exists():
            return path / name
    found = folder_listing(path)
    raise CheckpointError(f"{path} has no {SAFETENSORS_FILE} or {PICKLE_FILE} (the Marian weights); found {found}")


def probe(path: Path) -> TransformerConfig:
    """The model ``path/config.json`` describes, refused when attnviz cannot run it or it is over the
    limits; reads no other file (the hub's download checks this before fetching the weights)."""
    source = str(path / CONFIG_FILE)
    cfg = marian_config(read_hf_config(path, "marian", DESCRIPTION), unk_id=0, source=source)  # unk_id: no shape
    checked_shapes(cfg, source)
    return cfg


def load(path: Path, device: str = "auto") -> Bundle:
    """A [`Bundle`][attnviz.checkpoints.bundle.Bundle] holding a Hugging Face Marian checkpoint run by our
    Transformer, in eval mode."""
    path = model_folder(path)
    config_file = path / CONFIG_FILE
    hf = read_hf_config(path, "marian", DESCRIPTION)
    vocab_probe = marian_config(hf, unk_id=0, source=str(config_file))  # vocabulary sizes, before vocab.json
    expected, max_bytes = checked_shapes(vocab_probe, str(config_file))  # unk_id changes no shape
    tokenizer = _read_tokenizer(path, vocab_probe)
    cfg = marian_config(hf, unk_id=tokenizer.unk_id, source=str(config_file))
    weights_file = _weights_file(path)
    tensors = _load_tensors(WeightsFile(weights_file, max_bytes, rename=_with_prefix), cfg, expected)
    name = hub_name(path)
    lang = re.search(r"opus-mt-(?:tc-big-)?([a-z]{2,3})-", name)
    info = {
        "family": FAMILY,
        "source": "Hugging Face Marian",
        "name": name,
        "weights_file": weights_file.name,
        "examples": SOURCE_EXAMPLES.get(lang.group(1), []) if lang else [],
    }
    return make_bundle(cfg, tensors, tokenizer, weights_file, info, device)
