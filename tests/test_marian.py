"""Parity of the Marian importer with Hugging Face transformers, and its error messages.

Small random ``MarianMTModel``s (no download) are saved as Hugging Face folders with sentencepiece
models and a vocab.json, loaded by `attnviz.checkpoints.marian.load` into our Transformer, and
compared with transformers' eager attention: logits, every encoder, decoder and cross-attention
map, and greedy outputs. LayerNorms and biases are perturbed so that a wrong mapping cannot pass.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

from attnviz.checkpoints import marian  # noqa: E402
from attnviz.checkpoints.marian import marian_config  # noqa: E402
from attnviz.decoding import greedy_decode  # noqa: E402
from attnviz.errors import CheckpointError, InputError  # noqa: E402
from attnviz.tokenizer import train_sentencepiece  # noqa: E402

SOURCE = [
    "the cat sat on the mat",
    "a dog runs in the park",
    "we like green apples and red pears",
    "the weather is cold today",
    "my sister reads a long book",
    "they walk to the station every morning",
    "birds sing in the tall trees",
    "please open the window",
]
TARGET = [
    "die katze sass auf der matte",
    "ein hund rennt im park",
    "wir moegen gruene aepfel und rote birnen",
    "das wetter ist heute kalt",
    "meine schwester liest ein langes buch",
    "sie gehen jeden morgen zum bahnhof",
    "voegel singen in den hohen baeumen",
    "bitte oeffne das fenster",
]
INPUTS = [("the cat reads a book", "die katze liest"), ("we walk to the park today", "wir gehen zum park heute")]
SPECIAL = ("<unk>", "<s>", "</s>", "<pad>")
DROPPED = 3  # ordinary pieces left out of vocab.json, so that unknown pieces occur


def _pieces(model: bytes) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.id_to_piece(i) not in SPECIAL]


def _vocab(pieces: list[str], pad_last: bool) -> dict[str, int]:
    """opus-mt's layout: </s> 0, <unk> 1, the pieces, and <pad> last (or at 2)."""
    names = ["</s>", "<unk>"] + ([] if pad_last else ["<pad>"]) + pieces + (["<pad>"] if pad_last else [])
    return {name: i for i, name in enumerate(dict.fromkeys(names))}


def make_marian(
    folder: Path, *, shared: bool, activation: str, d_model: int, heads: int, enc: int, dec: int, seed=0, tied=True
):
    """A random Marian folder (config.json, model.safetensors, spm models, vocab files); returns the HF model.
    ``tied=False`` unties the output from the embeddings, and (in transformers 5) the encoder's and decoder's
    embeddings from the shared one."""
    src_spm = train_sentencepiece(SOURCE, vocab_size=60)
    tgt_spm = train_sentencepiece(TARGET, vocab_size=60)
    src_pieces, tgt_pieces = _pieces(src_spm)[DROPPED:], _pieces(tgt_spm)[DROPPED:]
    if shared:
        vocab = _vocab(list(dict.fromkeys(src_pieces + tgt_pieces)), pad_last=True)
        tgt_vocab = None
    else:
        vocab, tgt_vocab = _vocab(src_pieces, pad_last=False), _vocab(tgt_pieces, pad_last=False)
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=None if shared else len(tgt_vocab),
        share_encoder_decoder_embeddings=shared,
        d_model=d_model,
        encoder_layers=enc,
        decoder_layers=dec,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        activation_function=activation,
        max_position_embeddings=64,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=None,
        init_std=0.15,  # large enough that attention is far from uniform
        attn_implementation="eager",
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    hf = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "layer_norm" in name or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.3)
        hf.final_logits_bias.add_(torch.randn_like(hf.final_logits_bias))
    folder.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(folder)
    (folder / "source.spm").write_bytes(src_spm)
    (folder / "target.spm").write_bytes(tgt_spm)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    if tgt_vocab is not None:
        (folder / "target_vocab.json").write_text(json.dumps(tgt_vocab))
    return hf


CONFIGS = {
    "shared-swish-3heads": dict(shared=True, activation="swish", d_model=48, heads=3, enc=2, dec=3),
    "separate-relu": dict(shared=False, activation="relu", d_model=32, heads=4, enc=3, dec=1),
    # one vocabulary, untied: transformers 5 keeps four matrices (shared, encoder's, decoder's, output's)
    "shared-untied": dict(shared=True, tied=False, activation="relu", d_model=32, heads=2, enc=1, dec=2),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian") / request.param
    hf = make_marian(folder, **CONFIGS[request.param])
    return hf, folder


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian_base") / "opus-mt-en-de"
    make_marian(folder, **CONFIGS["shared-swish-3heads"], seed=1)
    return folder


def _assert_parity(bundle, hf) -> None:
    tok = bundle.tokenizer
    for src_text, tgt_text in INPUTS:
        src = torch.tensor([tok.encode_source(src_text).ids])
        tgt = torch.tensor([tok.encode_target(tgt_text)[0].ids])
        assert tgt[0, 0] == hf.config.pad_token_id  # Marian's decoder starts with the pad token
        with torch.no_grad():
            ref = hf(input_ids=src, attention_mask=torch.ones_like(src), decoder_input_ids=tgt, output_attentions=True)
            ours = bundle.model(src, tgt, return_attention=True)
        torch.testing.assert_close(ours.logits, ref.logits, atol=1e-5, rtol=1e-5)
        for kind, ref_maps in (
            ("encoder", ref.encoder_attentions),
            ("decoder", ref.decoder_attentions),
            ("cross", ref.cross_attentions),
        ):
            got = getattr(ours.attention, kind)
            assert len(got) == len(ref_maps)
            for layer, (a, b) in enumerate(zip(got, ref_maps, strict=True)):
                assert a.shape == b.shape, (kind, layer)
                torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"{kind} layer {layer}")
        # Greedy decoding: ours (with its key/value cache) against a plain loop over transformers.
        steps = 10
        ids = tgt[:, :1]
        with torch.no_grad():
            for _ in range(steps):
                nxt = hf(input_ids=src, decoder_input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], dim=1)
                if nxt.item() == hf.config.eos_token_id:
                    break
        want = ids[0, 1:].tolist()
        want = want[: want.index(0)] if 0 in want else want
        assert greedy_decode(bundle.model, src, max_len=steps)[0] == want


def test_logits_attention_and_greedy_match_transformers(pair):
    hf, folder = pair
    assert marian.detect(folder)
    bundle = marian.load(folder, device="cpu")
    assert not bundle.model.training
    assert bundle.info["family"] == "marian" and bundle.info["source"] == "Hugging Face Marian"
    cfg = bundle.config
    assert cfg.share_embeddings == (hf.config.share_encoder_decoder_embeddings and hf.config.tie_word_embeddings)
    assert cfg.tie_output == hf.config.tie_word_embeddings
    assert (cfg.n_enc_layers, cfg.n_dec_layers, cfg.n_heads) == (
        hf.config.encoder_layers,
        hf.config.decoder_layers,
        hf.config.encoder_attention_heads,
    )
    _assert_parity(bundle, hf)


def test_tokenizer_matches_transformers(pair):
    hf, folder = pair
    separate = not hf.config.share_encoder_decoder_embeddings
    ref = transformers.MarianTokenizer.from_pretrained(str(folder), separate_vocabs=separate)
    tok = marian.load(folder, device="cpu").tokenizer
    for src_text, tgt_text in INPUTS + [("the zebra quietly xylophones", "das zebra")]:
        assert list(tok.encode_source(src_text).ids) == ref(src_text)["input_ids"]
        assert list(tok.encode_target(tgt_text)[1].ids) == ref(text_target=tgt_text)["input_ids"]
    enc = tok.encode_source("the zebra")  # 'z' is not in vocab.json
    assert any(t.startswith("<unk:") for t in enc.tokens) and tok.unk_id in enc.ids
    inp, labels = tok.encode_target("die katze")
    assert inp.ids[0] == tok.pad_id == tok.bos_id and labels.ids[-1] == tok.eos_id
    assert inp.ids[1:] == labels.ids[:-1]
    assert tok.decode(labels.ids) == "die katze"
    for side in (tok.encode_source, tok.encode_target):  # SentencePiece's word mark alone is read as nothing
        with pytest.raises(InputError, match="empty once"):
            side("\u2581 \u2581")
        with pytest.raises(InputError, match=r"text holds U\+D800 at character 5"):  # sentencepiece: a RuntimeError
            side("die \ud800katze")


def test_pickled_weights_load_with_weights_only(marian_dir, tmp_path, caplog, monkeypatch):
    folder = tmp_path / "bin"
    shutil.copytree(marian_dir, folder)
    (folder / "model.safetensors").unlink()
    hf = transformers.MarianMTModel.from_pretrained(str(marian_dir), attn_implementation="eager").eval()
    # The full state dict, as 2020 opus-mt files hold it: embed_positions and tied copies included.
    torch.save(hf.state_dict(), folder / "pytorch_model.bin")
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    with caplog.at_level(logging.WARNING, logger="attnviz.checkpoints.files"):
        bundle = marian.load(folder, device="cpu")
    assert calls and all(c.get("weights_only") is True for c in calls)
    assert "safetensors" in caplog.text
    _assert_parity(bundle, hf)


def test_hub_cache_layout_with_symlinks(marian_dir, tmp_path):
    repo = tmp_path / "models--Helsinki-NLP--opus-mt-en-de"
    snap = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for file in marian_dir.iterdir():
        blob = repo / "blobs" / f"blob-{file.name}"
        shutil.copy(file, blob)
        (snap / file.name).symlink_to(Path("../../blobs") / blob.name)
    assert marian.detect(repo)
    bundle = marian.load(repo, device="cpu")
    assert bundle.name == "Helsinki-NLP/opus-mt-en-de"
    assert bundle.path == snap.resolve()
    assert bundle.info["examples"]
    (repo / "snapshots" / "def456").mkdir()
    with pytest.raises(CheckpointError, match="2 snapshots.*abc123.*def456"):
        marian.load(repo, device="cpu")


def test_foreign_directory_says_what_it_found(tmp_path):
    (tmp_path / "weights.npz").write_bytes(b"x")
    assert not marian.detect(tmp_path)
    with pytest.raises(CheckpointError, match=r"config\.json is missing.*source\.spm.*weights\.npz"):
        marian.load(tmp_path, device="cpu")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert not marian.detect(tmp_path)
    with pytest.raises(CheckpointError, match=r"config\.json.*'bert'.*expected \"marian\""):
        marian.load(tmp_path, device="cpu")


def test_an_untied_file_that_stores_the_shared_embedding_alone_gives_it_to_both_sides(tmp_path):
    """transformers 4 tied the encoder's and decoder's embeddings to the shared one whatever tie_word_embeddings
    said, and stored a tied matrix once: such a file gives both sides the shared matrix, and its own output."""
    untied = tmp_path / "untied"
    make_marian(untied, **CONFIGS["shared-untied"])

    def edit(t):
        del t["model.encoder.embed_tokens.weight"], t["model.decoder.embed_tokens.weight"]

    folder = _copy_with(untied, tmp_path, edit)
    stored = load_file(folder / "model.safetensors")
    model = marian.load(folder, device="cpu").model
    shared, output = stored["model.shared.weight"], stored["lm_head.weight"]
    assert not torch.equal(shared, output)
    for embedding in (model.src_embed.weight, model.tgt_embed.weight):
        assert torch.equal(embedding, shared)
    assert torch.equal(model.out_proj, output)


def _copy_with(marian_dir: Path, tmp_path: Path, edit) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(marian_dir, folder)
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors")
    return folder


def test_missing_tensor_names_file_and_tensor(marian_dir, tmp_path):
    folder = _copy_with(marian_dir, tmp_path, lambda t: t.pop("model.decoder.layers.1.encoder_attn.k_proj.bias"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*missing.*decoder\.layers\.1\.encoder_attn\.k_proj"):
        marian.load(folder, device="cpu")


def test_wrong_shape_names_file_and_tensor(marian_dir, tmp_path):
    def edit(t):
        t["model.encoder.layers.0.fc1.weight"] = t["model.encoder.layers.0.fc1.weight"][:, :-1].contiguous()

    folder = _copy_with(marian_dir, tmp_path, edit)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*encoder\.layers\.0\.fc1\.weight.*shape"):
        marian.load(folder, device="cpu")


def test_wrong_positions_are_refused(marian_dir, tmp_path):
    def edit(t):
        t["model.encoder.embed_positions.weight"] = torch.zeros(64, 48)

    folder = _copy_with(marian_dir, tmp_path, edit)
    with pytest.raises(CheckpointError, match="embed_positions.*sinusoid"):
        marian.load(folder, device="cpu")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"normalize_before": True}, "normalize_before.*pre-LN"),
        ({"add_bias_logits": True}, "add_bias_logits"),
        ({"normalize_embedding": True}, "normalize_embedding"),
        ({"decoder_attention_heads": 2}, "encoder_attention_heads.*differs"),
        ({"activation_function": "tanh"}, "activation_function"),
        ({"d_model": 50}, "divisible"),
    ],
)
def test_unsupported_configs_are_refused(marian_dir, change, message):
    hf = {**json.loads((marian_dir / "config.json").read_text()), **change}
    with pytest.raises(CheckpointError, match=r"config\.json.*" + message):
        marian_config(hf)


def test_config_mapping(marian_dir):
    cfg = marian_config(json.loads((marian_dir / "config.json").read_text()), unk_id=1)
    assert cfg.pos_encoding == "sinusoidal_concat" and not cfg.norm_first and cfg.ln_eps == 1e-5
    assert cfg.activation == "swish" and cfg.output_bias and cfg.attn_bias and cfg.scale_embedding
    assert cfg.bos_id == cfg.pad_id != 0 and cfg.eos_id == 0 and cfg.unk_id == 1
