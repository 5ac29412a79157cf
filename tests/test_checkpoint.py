"""Checkpoints: a faithful round trip, deterministic bytes, and a clear error for every broken one."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import time
from pathlib import Path

import pytest
import torch
from conftest import seeded_model, tiny_config
from safetensors import safe_open

from attnviz.checkpoints import load_checkpoint
from attnviz.checkpoints.native import CONFIG_FILE, SPM_FILE, WEIGHTS_FILE, save_checkpoint
from attnviz.devices import fast_bfloat16, resolve_device
from attnviz.errors import CheckpointError, DeviceError

CARD = "# tiny\n\nA randomly initialised model for tests.\n"


def _save(model, directory: Path, spm: bytes) -> Path:
    return save_checkpoint(model, directory, spm, info={"name": "tiny"}, card=CARD)


@pytest.fixture
def saved(tmp_path, tiny_model, tiny_spm) -> Path:
    return _save(tiny_model, tmp_path / "tiny", tiny_spm)


def _edit_config(directory: Path, edit) -> None:
    data = json.loads((directory / CONFIG_FILE).read_text())
    edit(data)
    (directory / CONFIG_FILE).write_text(json.dumps(data))


# ---------------------------------------------------------------------------------------------
# Round trip


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"share_embeddings": False, "tie_output": False, "output_bias": True},
        {"norm_first": True, "pos_encoding": "learned", "activation": "swish", "attn_bias": False},
    ],
)
def test_round_trip_gives_identical_logits(tmp_path, tiny_spm, batch, overrides):
    model = seeded_model(tiny_config(**overrides), seed=1)
    directory = _save(model, tmp_path / "ckpt", tiny_spm)

    bundle = load_checkpoint(directory, device="cpu")

    assert bundle.config == model.cfg
    assert bundle.name == "tiny" and bundle.info["name"] == "tiny"
    assert bundle.sha256 == hashlib.sha256((directory / WEIGHTS_FILE).read_bytes()).hexdigest()
    assert bundle.tokenizer.src_vocab_size == model.cfg.src_vocab_size
    assert (directory / "README.md").read_text() == CARD
    assert not bundle.model.training
    assert bundle.device == torch.device("cpu")
    with torch.no_grad():
        expected = model(**batch, return_attention=True)
        got = bundle.model(**batch, return_attention=True)
    assert torch.equal(got.logits, expected.logits)
    for kind in ("encoder", "decoder", "cross"):
        assert torch.equal(got.attention.stacked(kind), expected.attention.stacked(kind))


def test_saving_twice_gives_the_same_bytes(tmp_path, tiny_model, tiny_spm):
    first = _save(tiny_model, tmp_path / "first", tiny_spm)
    second = _save(tiny_model, tmp_path / "second", tiny_spm)
    for name in (WEIGHTS_FILE, CONFIG_FILE, SPM_FILE):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_tied_embeddings_are_stored_once_and_tied_again_on_load(saved, tiny_model):
    with safe_open(str(saved / WEIGHTS_FILE), framework="pt") as f:
        keys = set(f.keys())
    assert "src_embed.weight" in keys
    assert "tgt_embed.weight" not in keys
    assert keys == {name for name, _ in tiny_model.named_parameters()}
    model = load_checkpoint(saved, device="cpu").model
    assert model.tgt_embed.weight is model.src_embed.weight


def test_untied_embeddings_are_both_stored(tmp_path, tiny_spm):
    model = seeded_model(tiny_config(share_embeddings=False, tie_output=False), seed=2)
    directory = _save(model, tmp_path / "untied", tiny_spm)
    with safe_open(str(directory / WEIGHTS_FILE), framework="pt") as f:
        keys = set(f.keys())
    assert {"src_embed.weight", "tgt_embed.weight", "out_proj"} <= keys


# ---------------------------------------------------------------------------------------------
# Broken checkpoints: each a CheckpointError that names the file


class _WritesMarker:
    """Unpickling this writes a file: proof that something was unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


def test_the_pickle_payload_is_live(tmp_path):
    # Without this, the test below could pass with a payload that does nothing.
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(_WritesMarker(marker)))
    assert marker.read_text() == "unpickled"


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_a_pickle_posing_as_safetensors_is_never_unpickled(saved, tmp_path, writer):
    marker = tmp_path / "marker"
    weights = saved / WEIGHTS_FILE
    payload = {"src_embed.weight": _WritesMarker(marker)}
    if writer == "pickle":
        weights.write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, weights)

    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved, device="cpu")

    assert not marker.exists()
    assert str(weights) in str(info.value)
    assert "never unpickles" in str(info.value)


def _remove(name):
    return lambda d: (d / name).unlink()


def _write(name, content: bytes):
    return lambda d: (d / name).write_bytes(content)


def _truncate(d: Path) -> None:
    data = (d / WEIGHTS_FILE).read_bytes()
    (d / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])


def _weights_of_another_d_ff(d: Path) -> None:
    """Weights of a model with d_ff 48 under the config of one with d_ff 64."""
    other = seeded_model(tiny_config(d_ff=48))
    spm = (d / SPM_FILE).read_bytes()
    _save(other, d.parent / "other", spm)
    shutil.copyfile(d.parent / "other" / WEIGHTS_FILE, d / WEIGHTS_FILE)


BROKEN = {
    "config missing": (_remove(CONFIG_FILE), CONFIG_FILE, "missing"),
    "config not json": (_write(CONFIG_FILE, b"{'model': {"), CONFIG_FILE, "not valid JSON"),
    "config not utf-8": (_write(CONFIG_FILE, b"\xff\xfe{}"), CONFIG_FILE, "not valid JSON"),
    "config a list": (_write(CONFIG_FILE, b"[1, 2]"), CONFIG_FILE, "JSON object"),
    "hugging face config": (  # Marian, BERT, GPT-2, Llama and Qwen2 folders are loaded; other families are named
        _write(CONFIG_FILE, json.dumps({"model_type": "gemma2", "hidden_size": 768}).encode()),
        CONFIG_FILE,
        "gemma2",
    ),
    "unknown config key": (
        lambda d: _edit_config(d, lambda c: c["model"].update(n_head=4)),
        CONFIG_FILE,
        "n_head",
    ),
    "invalid config value": (
        lambda d: _edit_config(d, lambda c: c["model"].update(n_heads=5)),
        CONFIG_FILE,
        "divisible",
    ),
    "no model section": (lambda d: _edit_config(d, lambda c: c.pop("model")), CONFIG_FILE, "JSON object"),
    "weights missing": (_remove(WEIGHTS_FILE), WEIGHTS_FILE, "missing"),
    "weights truncated": (_truncate, WEIGHTS_FILE, "truncated"),
    "weights empty": (_write(WEIGHTS_FILE, b""), WEIGHTS_FILE, "safetensors"),
    "weights of another shape": (_weights_of_another_d_ff, WEIGHTS_FILE, "shape (48, 32)"),
    "weights of fewer layers": (
        lambda d: _edit_config(d, lambda c: c["model"].update(n_enc_layers=3)),
        WEIGHTS_FILE,
        "encoder_layers.2",
    ),
    "sentencepiece missing": (_remove(SPM_FILE), SPM_FILE, "missing"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_checkpoint_raises_checkpoint_error_naming_the_file(saved, case):
    breaker, file_name, words = BROKEN[case]
    breaker(saved)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved, device="cpu")
    message = str(info.value)
    assert file_name in message
    assert words in message


SPM_GARBAGE = [b"this is not a sentencepiece model", b""]


@pytest.mark.parametrize("content", SPM_GARBAGE, ids=["garbage", "empty"])
def test_garbage_sentencepiece_raises_checkpoint_error(saved, content):
    (saved / SPM_FILE).write_bytes(content)
    with pytest.raises(CheckpointError, match="sentencepiece") as info:
        load_checkpoint(saved, device="cpu")
    assert str(saved) in str(info.value)


@pytest.mark.parametrize("content", SPM_GARBAGE, ids=["garbage", "empty"])
def test_garbage_sentencepiece_error_names_the_file(saved, content):
    (saved / SPM_FILE).write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(saved, device="cpu")
    assert SPM_FILE in str(info.value)


def test_a_null_config_value_raises_checkpoint_error(saved):
    _edit_config(saved, lambda c: c["model"].update(pos_encoding=None))
    with pytest.raises(CheckpointError, match=CONFIG_FILE):
        load_checkpoint(saved, device="cpu")


def test_a_tokenizer_section_that_is_not_an_object_raises_checkpoint_error(saved):
    _edit_config(saved, lambda c: c.update(tokenizer=SPM_FILE))
    with pytest.raises(CheckpointError, match=CONFIG_FILE):
        load_checkpoint(saved, device="cpu")


def test_a_missing_directory_raises_checkpoint_error(tmp_path):
    path = tmp_path / "no-such-model"
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        # Refused by the limits (attnviz.checkpoints.limits) before the model is built, even on meta.
        (
            {"d_model": 16384, "n_heads": 8, "d_ff": 65536},
            "d_model is 16,384, above attnviz's limit.*ATTNVIZ_MAX_D_MODEL",
        ),
        ({"src_vocab_size": 10**9, "tgt_vocab_size": 10**9, "d_model": 8192}, "src_vocab_size.*ATTNVIZ_MAX_VOCAB"),
    ],
)
def test_a_gigantic_config_is_refused_without_allocating(saved, overrides, words):
    # Allocated, the first would need about 60 GB: far more than this machine has.
    _edit_config(saved, lambda c: c["model"].update(overrides))
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=words):
        load_checkpoint(saved, device="cpu")
    assert time.perf_counter() - start < 5


# ---------------------------------------------------------------------------------------------
# Devices


def test_cuda_without_a_gpu_raises_device_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for name in ("cuda", "cuda:0", "CUDA"):
        with pytest.raises(DeviceError, match="no CUDA GPU"):
            resolve_device(name)


def test_loading_onto_a_missing_gpu_raises_device_error(saved):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(DeviceError):
        load_checkpoint(saved, device="cuda")


def test_auto_is_cpu_without_accelerators():
    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has an accelerator")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["tpu", "gpu", "cpux"])
def test_unknown_device_raises_device_error_listing_the_choices(name):
    with pytest.raises(DeviceError) as info:
        resolve_device(name)
    assert repr(name) in str(info.value)
    assert "cpu" in str(info.value) and "auto" in str(info.value)


def test_bfloat16_is_not_fast_where_onednn_is_held_below_it(monkeypatch):
    """A faster CPU standing in for an AVX2-only one (ONEDNN_MAX_CPU_ISA=AVX2) emulates bf16: not fast."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    fast, why = fast_bfloat16(torch.device("cpu"))
    assert not fast and "ONEDNN_MAX_CPU_ISA=AVX2" in why
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    unlimited = fast_bfloat16(torch.device("cpu"))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # at or above bf16: the CPU's flags decide
    assert fast_bfloat16(torch.device("cpu")) == unlimited


CHECK_SHAPES_ALONE = """
import sys
from attnviz.checkpoints.bundle import expected_shapes
from attnviz.config import TransformerConfig
before = {m for m in ("torch._dynamo", "sympy") if m in sys.modules}
layouts = [{}, {"pos_encoding": "learned", "tie_output": False, "output_bias": True},
           {"n_enc_layers": 0, "pos_encoding": "rotary", "norm": "rmsnorm", "ffn": "gated", "activation": "swish",
            "n_kv_heads": 2, "norm_first": True},
           {"n_dec_layers": 0, "type_vocab_size": 2, "embed_norm": True, "pos_encoding": "learned"}]
shapes = [expected_shapes(TransformerConfig(**layout)) for layout in layouts]
print(sorted({m for m in ("torch._dynamo", "sympy") if m in sys.modules} - before), shapes[1]["out_proj"])
from attnviz import api
api.load("en-de")  # the whole load: the model built on the meta device, then given the file's tensors
print(sorted({m for m in ("torch._dynamo", "sympy") if m in sys.modules} - before))
"""


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_checking_a_configs_shapes_and_loading_a_model_import_neither_dynamo_nor_sympy():
    """The meta model a loader builds to check a file's shapes, and the one it gives the file's tensors
    (`Transformer.holding`), run no op that pulls in torch._dynamo or sympy.

    They cost about 1 CPU s on their first use in a process, which every process that loaded a checkpoint paid:
    the app, each heavy-work worker, each CLI command (model.normal_weights). Module.to_empty brought sympy
    back (0.3 CPU s a load) until `holding` gave the meta tensors memory itself.
    """
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", CHECK_SHAPES_ALONE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "(37000,", "512)", "[]"], done.stdout


def test_normal_weights_have_the_asked_spread_and_on_meta_only_a_shape():
    from attnviz.model import normal_weights

    torch.manual_seed(0)
    w = normal_weights(400, 500, std=0.05)
    assert w.shape == (400, 500) and abs(float(w.std()) - 0.05) < 1e-3 and abs(float(w.mean())) < 1e-3
    with torch.device("meta"):
        m = normal_weights(3, 7, std=0.05)
    assert m.device.type == "meta" and m.shape == (3, 7)
