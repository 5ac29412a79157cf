"""Checkpoints whose numbers lie, and tokenizers that multiply their text.

Every field a GPT-2, Llama or Qwen2 config.json holds is fuzzed by type (a boolean, a string, a
float such as 64.5, a list, an object, null) and by value (zero, negative, huge, infinite, NaN):
each is refused with a message naming the key, through the API (a CheckpointError) and the CLI
(exit 2, one line), before anything is computed from it. The same holds for RoPE's parameters, a
config over 1 MB, a config read many times, and a shard index naming shards the model never reads.
Tokenizers whose normalizer, pre-tokenizer or decoder lengthens a text (six Replace("a", ten a's))
are refused when read, or at the first text too long for them, without the process aborting; the
bounds attnviz assumes for each step are checked against the ``tokenizers`` library itself. Where
memory is the point, it is measured in a fresh process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import seeded_model, tiny_config
from safetensors.torch import load_file, save_file

from attnviz.checkpoints import causal, files, load_checkpoint
from attnviz.checkpoints.bundle import sha256_file
from attnviz.checkpoints.native import save_checkpoint
from attnviz.cli import main
from attnviz.errors import CheckpointError, InputError
from attnviz.tokenizer import MAX_GROWTH, NORMAL_FORMS, growth

pytest.importorskip("transformers")
from lm_models import build  # noqa: E402

FAMILIES = ["gpt2", "llama", "qwen2"]

# What each family's importer reads, by kind: whole numbers (sizes and counts), finite numbers,
# true/false flags, and token ids.
INTS = {
    "gpt2": ["n_embd", "n_head", "n_layer", "n_positions", "vocab_size", "n_inner"],
    "llama": [
        "hidden_size",
        "num_attention_heads",
        "num_hidden_layers",
        "num_key_value_heads",
        "intermediate_size",
        "max_position_embeddings",
        "vocab_size",
        "head_dim",
    ],
}
INTS["qwen2"] = INTS["llama"]
NUMBERS = {"gpt2": ["layer_norm_epsilon"], "llama": ["rms_norm_eps"], "qwen2": ["rms_norm_eps"]}
FLAGS = {
    "gpt2": ["tie_word_embeddings", "scale_attn_weights"],
    "llama": ["tie_word_embeddings", "mlp_bias", "attention_bias"],
    "qwen2": ["tie_word_embeddings", "use_sliding_window"],  # transformers' Qwen2 reads no mlp_bias, nor attnviz
}
TOKEN_IDS = {family: ["eos_token_id", "bos_token_id"] for family in FAMILIES}

HUGE_STRING = "x" * 100_000
BAD_INTS = {
    "true": True,
    "a string": "64",
    "64.5": 64.5,
    "a float that is whole": 64.0,
    "zero": 0,
    "negative": -8,
    "2^40": 2**40,
    "Infinity": float("inf"),
    "NaN": float("nan"),
    "a list": [64],
    "an object": {"value": 64},
    "a huge string": HUGE_STRING,
}
BAD_NUMBERS = {
    "true": True,
    "a string": "1e-5",
    "zero": 0.0,
    "negative": -1e-5,
    "Infinity": float("inf"),
    "NaN": float("nan"),
    "above 1": 2.0,
    "a list": [1e-5],
    "a huge string": HUGE_STRING,
}
BAD_FLAGS = {"a string": "false", "a number": 0, "a list": [], "a huge string": HUGE_STRING}
BAD_IDS = {
    "negative": -1,
    "true": True,
    "a string": "0",
    "a float": 0.5,
    "an empty list": [],
    "a huge string": HUGE_STRING,
}


def _cases() -> list:
    cases = []
    for family in FAMILIES:
        for keys, values in (
            (INTS[family], BAD_INTS),
            (NUMBERS[family], BAD_NUMBERS),
            (FLAGS[family], BAD_FLAGS),
            (TOKEN_IDS[family], BAD_IDS),
        ):
            for key in keys:
                cases += [
                    pytest.param(family, key, value, id=f"{family}-{key}-{name}") for name, value in values.items()
                ]
    return cases


@pytest.fixture
def good_native(tmp_path, tiny_spm) -> Path:
    """A small attnviz checkpoint."""
    return save_checkpoint(seeded_model(tiny_config()), tmp_path / "native", tiny_spm, {"name": "tiny"}, "# tiny\n")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A random model folder of each family, saved by transformers."""
    root = tmp_path_factory.mktemp("families")
    for family in FAMILIES:
        build(family, root / family)
    return {family: root / family for family in FAMILIES}


def _edited(folder: Path, tmp_path: Path, edit) -> Path:
    """A copy of ``folder`` whose config.json ``edit`` changed."""
    copy = tmp_path / "edited" / folder.name
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def _refused(folder: Path, key: str, capsys) -> str:
    """The API's and the CLI's refusal of ``folder``, checked to name ``key`` in one short line."""
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(folder, "cpu")
    message = str(info.value)
    assert f'"{key}' in message and "\n" not in message and len(message) < 1000, message
    assert HUGE_STRING[:1000] not in message
    assert main(["generate", "--model", str(folder), "--device", "cpu", "--max-new", "1", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnviz: error: ") and f'"{key}' in err, err
    return message


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_the_unedited_folders_load(folders):
    for folder in folders.values():
        assert load_checkpoint(folder, "cpu").config.decoder_only


@pytest.mark.parametrize("family, key, value", _cases())
def test_a_config_field_of_the_wrong_type_or_range_is_refused_naming_it(family, key, value, folders, tmp_path, capsys):
    folder = _edited(folders[family], tmp_path, lambda c: c.update({key: value}))
    message = _refused(folder, key, capsys)
    assert "must be" in message


def test_a_head_size_given_as_a_string_is_refused_without_multiplying_it(folders, tmp_path, capsys):
    folder = _edited(folders["llama"], tmp_path, lambda c: c.update(head_dim="xxxx", num_attention_heads=1_000_000_000))
    message = _refused(folder, "head_dim", capsys)
    assert "a string" in message or "'xxxx'" in message


# The encoder families and attnviz's own checkpoints: the same checks through their config readers.
BERT_INTS = ["vocab_size", "num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"]
MARIAN_INTS = ["vocab_size", "encoder_layers", "decoder_layers", "d_model", "encoder_attention_heads"]
OTHER = {
    "bert": (
        BERT_INTS + ["max_position_embeddings"],
        ["layer_norm_eps"],
        ["is_decoder"],
        ["pad_token_id"],
    ),
    "marian": (
        MARIAN_INTS + ["encoder_ffn_dim", "max_position_embeddings"],
        ["dropout"],
        ["scale_embedding", "share_encoder_decoder_embeddings"],
        ["pad_token_id", "decoder_start_token_id"],
    ),
}


def _encoder_cases() -> list:
    cases = []
    for family, (ints, numbers, flags, ids) in OTHER.items():
        for keys, values in ((ints, BAD_INTS), (numbers, BAD_NUMBERS), (flags, BAD_FLAGS), (ids, BAD_IDS)):
            for key in keys:
                for name, value in values.items():
                    if key == "dropout" and name in ("zero",):  # no dropout is a valid dropout
                        continue
                    cases.append(pytest.param(family, key, value, id=f"{family}-{key}-{name}"))
    return cases


@pytest.fixture(scope="module")
def encoder_configs() -> dict[str, dict]:
    """config.json as transformers writes it for a small BERT and a small Marian."""
    import transformers as tf

    bert = tf.BertConfig(
        vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37
    )
    marian = tf.MarianConfig(
        vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, pad_token_id=98, eos_token_id=0,
        decoder_start_token_id=98,
    )  # fmt: skip
    return {"bert": json.loads(bert.to_json_string()), "marian": json.loads(marian.to_json_string())}


def _encoder_config(family: str, hf: dict):
    from attnviz.checkpoints.bert import bert_config
    from attnviz.checkpoints.marian import marian_config

    return bert_config(hf) if family == "bert" else marian_config(hf, unk_id=1)


def test_the_unedited_encoder_configs_are_read(encoder_configs):
    assert _encoder_config("bert", encoder_configs["bert"]).encoder_only
    assert _encoder_config("marian", encoder_configs["marian"]).n_dec_layers == 2


@pytest.mark.parametrize("family, key, value", _encoder_cases())
def test_an_encoder_config_field_of_the_wrong_type_or_range_is_refused_naming_it(family, key, value, encoder_configs):
    with pytest.raises(CheckpointError) as info:
        _encoder_config(family, {**encoder_configs[family], key: value})
    message = str(info.value)
    assert f'"{key}"' in message and len(message) < 1000 and HUGE_STRING[:100] not in message, message


@pytest.mark.parametrize("family", ["bert", "marian"])
@pytest.mark.parametrize("key", ["quantization_config", "compression_config"])
def test_a_quantized_encoder_config_is_refused_naming_its_method(family, key, encoder_configs):
    """Every importer refuses a quantized model: its values mean nothing without the scales attnviz does not apply."""
    with pytest.raises(CheckpointError, match=f"\"{key}\".*'fp8'") as info:
        _encoder_config(family, {**encoder_configs[family], key: {"quant_method": "fp8"}})
    assert "\n" not in str(info.value)


NATIVE = {
    "d_model a string": ("d_model", "128"),
    "d_model 64.5": ("d_model", 64.5),
    "n_heads true": ("n_heads", True),
    "n_heads a list": ("n_heads", [4]),
    "max_len a huge string": ("max_len", HUGE_STRING),
    "ln_eps Infinity": ("ln_eps", float("inf")),
    "ln_eps NaN": ("ln_eps", float("nan")),
    "dropout a string": ("dropout", "0.1"),
    "rope_theta Infinity": ("rope_theta", float("inf")),
    "n_enc_layers 10^40": ("n_enc_layers", 10**40),
}


@pytest.mark.parametrize("case", NATIVE)
def test_an_attnviz_checkpoints_config_is_checked_the_same_way(case, good_native, tmp_path, capsys):
    key, value = NATIVE[case]
    folder = _edited(good_native, tmp_path, lambda c: c["model"].update({key: value}))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(folder, "cpu")
    message = str(info.value)
    assert f"{key} must be" in message and len(message) < 1000 and HUGE_STRING[:100] not in message, message
    assert main(["translate", "--model", str(folder), "--device", "cpu", "a b"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("key, value", [("name", ["a"]), ("examples", "a"), ("examples", ["x" * 5000]), ("version", 2)])
def test_what_an_attnviz_checkpoint_says_about_itself_is_checked(key, value, good_native, tmp_path):
    folder = _edited(good_native, tmp_path, lambda c: c.update({key: value}))
    with pytest.raises(CheckpointError, match=f'"{key}" must be'):
        load_checkpoint(folder, "cpu")


ROPE = {
    "factor 1e-320": ({"factor": 1e-320}, "factor"),
    "factor 0.5": ({"factor": 0.5}, "factor"),
    "factor Infinity": ({"factor": float("inf")}, "factor"),
    "factor NaN": ({"factor": float("nan")}, "factor"),
    "factor a string": ({"factor": "8"}, "factor"),
    "low above high": ({"low_freq_factor": 4.0, "high_freq_factor": 1.0}, "low_freq_factor"),
    "low equal to high": ({"low_freq_factor": 2.0, "high_freq_factor": 2.0}, "low_freq_factor"),
    "low zero": ({"low_freq_factor": 0.0}, "low_freq_factor"),
    "high Infinity": ({"high_freq_factor": float("inf")}, "high_freq_factor"),
    "original length 0": ({"original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    "original length 1.5": ({"original_max_position_embeddings": 1.5}, "original_max_position_embeddings"),
    "theta 0": ({"rope_theta": 0.0}, "rope_theta"),
    "theta negative": ({"rope_theta": -1e4}, "rope_theta"),
    "theta Infinity": ({"rope_theta": float("inf")}, "rope_theta"),
    "theta a string": ({"rope_theta": "10000"}, "rope_theta"),
}
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("case", ROPE)
def test_rope_parameters_are_range_checked_before_use(family, case, folders, tmp_path, capsys):
    change, key = ROPE[case]
    folder = _edited(folders[family], tmp_path, lambda c: c.update(rope_parameters={**LLAMA3, **change}))
    _refused(folder, f"rope_parameters.{key}" if key != "low_freq_factor" else "rope_parameters.low", capsys)


def test_old_style_rope_fields_are_checked_as_well(folders, tmp_path, capsys):
    folder = _edited(
        folders["llama"], tmp_path, lambda c: c.update(rope_parameters=None, rope_theta=float("nan"), rope_scaling=None)
    )
    _refused(folder, "rope_theta", capsys)


def test_valid_llama3_parameters_still_load(folders, tmp_path):
    folder = _edited(folders["llama"], tmp_path, lambda c: c.update(rope_parameters=dict(LLAMA3)))
    cfg = load_checkpoint(folder, "cpu").config
    assert (cfg.rope_scaling, cfg.rope_factor, cfg.rope_original_max_len) == ("llama3", 8.0, 64)


FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


@pytest.mark.parametrize("dtype", [name for name in FLOAT8 if hasattr(torch, name)])
def test_float8_weights_are_refused_naming_the_tensor_and_its_dtype(dtype, folders, tmp_path, capsys):
    """A quantized file's float8 values mean something only with their scales (``weight_scale_inv``), and its config
    may not say it is quantized: read as they were, every projection was wrong (logits 2.5 apart, an audit found)."""
    folder = _edited(folders["llama"], tmp_path, lambda c: None)
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = tensors[name].to(getattr(torch, dtype))
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"'{name}'.* torch.{dtype}\\b"):
        load_checkpoint(folder, "cpu")
    assert main(["generate", "--model", str(folder), "--device", "cpu", "--max-new", "1", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and dtype in err, err


def test_a_config_over_1_mb_is_refused_before_it_is_parsed(folders, tmp_path, monkeypatch):
    folder = _edited(folders["gpt2"], tmp_path, lambda c: c.update(note="x" * (1 << 20)))
    parsed = []
    monkeypatch.setattr(files.json, "loads", lambda *a, **k: parsed.append(1))
    with pytest.raises(CheckpointError, match="ATTNVIZ_MAX_CONFIG_MB"):
        load_checkpoint(folder, "cpu")
    assert not parsed


def test_an_integer_too_long_for_python_is_a_clear_refusal(folders, tmp_path):
    folder = _edited(folders["gpt2"], tmp_path, lambda c: None)
    text = (folder / "config.json").read_text().replace('"n_layer": 2', '"n_layer": ' + "9" * 5000)
    (folder / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match="number too long"):
        load_checkpoint(folder, "cpu")


@pytest.mark.parametrize("family", FAMILIES)
def test_config_json_is_read_once_per_load(family, folders, monkeypatch):
    reads = []
    real = files.read_json

    def counting(file, *args, **kwargs):
        reads.append(Path(file).name)
        return real(file, *args, **kwargs)

    monkeypatch.setattr(files, "read_json", counting)
    load_checkpoint(folders[family], "cpu")
    assert reads.count("config.json") == 1


def test_only_the_shards_the_model_needs_are_opened_and_hashed(tmp_path, monkeypatch):
    folder = tmp_path / "sharded"
    build("llama", folder, max_shard_size="60KB")
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    real_shards = set(index["weight_map"].values())
    assert len(real_shards) > 2
    for i in range(2000):  # tensors the model does not have, each in a shard of its own that is not safetensors
        shard = f"unused-{i:05d}.safetensors"
        index["weight_map"][f"model.unused.{i}.weight"] = shard
        (folder / shard).write_bytes(b"not a safetensors file")
    index_file.write_text(json.dumps(index))
    hashed = []
    monkeypatch.setattr(causal, "sha256_file", lambda path: hashed.append(Path(path).name) or sha256_file(path))
    loaded = load_checkpoint(folder, "cpu")
    assert set(hashed) == real_shards and len(hashed) == len(real_shards)
    assert loaded.config.n_dec_layers == 2


@pytest.mark.slow
def test_a_config_multiplying_a_string_by_a_billion_heads_is_refused_fast_and_small(folders, tmp_path):
    cases = {
        "string": lambda c: c.update(head_dim="xxxx", num_attention_heads=1_000_000_000),
        "list": lambda c: c.update(head_dim=[1, 2, 3], num_attention_heads=1_000_000_000),
        "layers": lambda c: c.update(num_hidden_layers=1_000_000_000),
    }
    paths = []
    for name, edit in cases.items():
        (tmp_path / name).mkdir()
        paths.append(str(_edited(folders["llama"], tmp_path / name, edit)))
    probe = textwrap.dedent(
        """
        import contextlib, io, json, resource, sys, time
        from attnviz.cli import main
        folders = json.loads(sys.argv[1])
        with contextlib.redirect_stderr(io.StringIO()):  # once first: torch and attnviz imported (3 CPU s) untimed
            main(["generate", "--model", folders[0], "--device", "cpu", "hello"])
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.process_time()  # CPU, not the clock: a loaded machine slows the clock, not the work
        statuses = []
        for folder in folders:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                statuses.append(main(["generate", "--model", folder, "--device", "cpu", "hello"]))
            assert err.getvalue().count("\\n") == 1, err.getvalue()
        took = time.process_time() - start
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
        print(json.dumps({"statuses": statuses, "seconds": took, "grown_mb": grown}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(paths)], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["statuses"] == [2, 2, 2]
    # CPU s, after the imports: each refusal takes milliseconds, and a billion of anything made takes minutes. With
    # the imports counted, 5 s was missed on a loaded 2-core Zen 5 EPYC (5.7 s)
    assert report["grown_mb"] < 64 and report["seconds"] < 5, report


# ---------------------------------------------------------------------------------------------
# Outputs bounded before they are computed


def _never(*args, **kwargs):
    raise AssertionError("computed although the output is over its bound")


@pytest.mark.parametrize("method", ["norm", "value-zeroing", "rollout", "grad-attention"])
def test_attribute_over_the_export_bound_is_exit_2_before_computing(method, folders, tmp_path, capsys, monkeypatch):
    import attnviz.api

    prompt = "When Mary and John went to the store, John gave a drink to"
    bundle = load_checkpoint(folders["llama"], "cpu")
    _, size = attnviz.api.maps_size(bundle, prompt)
    out = tmp_path / "a.npz"
    command = ["attribute", "--model", str(folders["llama"]), "--device", "cpu", "--method", method, "--src", prompt]
    monkeypatch.setenv("ATTNVIZ_MAX_EXPORT_MB", str(size / 2 / 2**20))
    with monkeypatch.context() as patched:
        patched.setattr(attnviz.api, "attribute", _never)
        assert main([*command, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ATTNVIZ_MAX_EXPORT_MB" in err and not out.exists(), err
    monkeypatch.setenv("ATTNVIZ_MAX_EXPORT_MB", str(2 * size / 2**20))
    assert main([*command, "--out", str(out)]) == 0 and out.exists()


def test_atlas_over_its_bounds_is_exit_2_before_computing(folders, tmp_path, capsys, monkeypatch):
    import attnviz.atlas.build

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat\none two three four five six one two three four five six\n")
    command = ["atlas", "--model", str(folders["llama"]), "--device", "cpu", "--corpus", str(corpus)]
    bundle = load_checkpoint(folders["llama"], "cpu")
    longest = len(bundle.tokenizer.encode_source(corpus.read_text().splitlines()[1]).ids)
    size = 4 * bundle.config.n_heads * bundle.config.n_dec_layers * longest**2
    with monkeypatch.context() as patched:
        patched.setattr(attnviz.atlas.build, "run_local", _never)
        patched.setenv("ATTNVIZ_MAX_EXPORT_MB", str(size / 2 / 2**20))
        assert main([*command, "--out", str(tmp_path / "a")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "line 2 of the corpus" in err and "ATTNVIZ_MAX_EXPORT_MB" in err, err
        rows = 2 * bundle.config.n_heads * bundle.config.n_dec_layers
        patched.setenv("ATTNVIZ_MAX_ATLAS_ROWS", str(rows - 1))
        patched.setenv("ATTNVIZ_MAX_EXPORT_MB", str(2 * size / 2**20))
        assert main([*command, "--out", str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{rows:,} rows" in err and "ATTNVIZ_MAX_ATLAS_ROWS" in err, err
    monkeypatch.setenv("ATTNVIZ_MAX_EXPORT_MB", str(2 * size / 2**20))
    assert main([*command, "--out", str(tmp_path / "c")]) == 0


# ---------------------------------------------------------------------------------------------
# Tokenizers


def _replace(pattern: str, content: str) -> dict:
    return {"type": "Replace", "pattern": {"String": pattern}, "content": content}


SIX_REPLACES = {"type": "Sequence", "normalizers": [_replace("a", "a" * 10)] * 6}
AMPLIFYING = {
    "six Replace normalizers": ("normalizer", SIX_REPLACES),
    "a regex Replace matching nothing": (
        "normalizer",
        {"type": "Replace", "pattern": {"Regex": ""}, "content": "b" * 600},
    ),
    "twelve byte-level pre-tokenizers": (
        "pre_tokenizer",
        {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", "add_prefix_space": False}] * 12},
    ),
    "six Replace decoders": ("decoder", {"type": "Sequence", "decoders": [_replace("a", "a" * 10)] * 6}),
    "an unknown normalizer": ("normalizer", {"type": "Custom"}),
}


def _with_tokenizer(folder: Path, tmp_path: Path, part: str, spec: dict) -> Path:
    copy = _edited(folder, tmp_path, lambda c: None)
    tokenizer = json.loads((copy / "tokenizer.json").read_text())
    tokenizer[part] = spec
    (copy / "tokenizer.json").write_text(json.dumps(tokenizer))
    return copy


@pytest.mark.parametrize("case", AMPLIFYING)
def test_an_amplifying_tokenizer_is_refused_when_read_with_a_line_that_says_so(case, folders, tmp_path, capsys):
    part, spec = AMPLIFYING[case]
    folder = _with_tokenizer(folders["llama"], tmp_path, part, spec)
    with pytest.raises(CheckpointError, match="tokenizer.json") as info:
        load_checkpoint(folder, "cpu")
    assert part.replace("_", "-") in str(info.value) or "not one attnviz" in str(info.value)
    assert main(["generate", "--model", str(folder), "--device", "cpu", "a" * 300]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("times longer" in err or "lengthens a text" in err), err


def test_a_tokenizer_within_the_bound_refuses_a_text_it_could_lengthen_too_far(folders, tmp_path, capsys):
    doubled = {"type": "Sequence", "normalizers": [_replace("a", "a" * 14)] * 2}  # 196 x 5 (byte-level) times
    folder = _with_tokenizer(folders["llama"], tmp_path, "normalizer", doubled)
    bundle = load_checkpoint(folder, "cpu")
    assert bundle.tokenizer.text_growth == 980 <= MAX_GROWTH
    assert len(bundle.tokenizer.tok.normalizer.normalize_str("a cat")) == 395  # the normalizer is the one written
    with pytest.raises(InputError, match="lengthen a text 980 times"):
        bundle.tokenizer.encode_source("b" * 2000)
    assert main(["attention", "--model", str(folder), "--src", "b" * 2000, "--out", str(tmp_path / "m.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shorten the text" in err


def _sentencepiece_with_replacement(chars: int) -> bytes:
    """A real sentencepiece model (NFKC rules) whose charsmap also holds a replacement of ``chars`` bytes."""
    import io

    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    out = io.BytesIO()
    texts = ["the cat sat on the mat", "a b c d e f g"] * 50
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=out, vocab_size=30, normalization_rule_name="nmt_nfkc",
        hard_vocab_limit=False, num_threads=1, minloglevel=2,
    )  # fmt: skip
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(out.getvalue())
    proto.normalizer_spec.precompiled_charsmap += b"x" * chars + b"\0"  # the trie is unchanged: it still loads
    return proto.SerializeToString()


def test_a_sentencepiece_model_that_could_multiply_a_text_is_refused_before_the_library_reads_it(tmp_path, capsys):
    import shutil as sh

    from attnviz.checkpoints.catalog import pretrained_dir
    from attnviz.checkpoints.marian import MarianTokenizer
    from attnviz.tokenizer import AmplifyingTokenizer, SentencePieceTokenizer, sentencepiece_growth

    amplifying = _sentencepiece_with_replacement(5000)
    assert sentencepiece_growth(amplifying) == 5000 > MAX_GROWTH
    with pytest.raises(AmplifyingTokenizer, match="5,000 times"):
        SentencePieceTokenizer(amplifying)
    with pytest.raises(AmplifyingTokenizer, match="5,000 times"):
        MarianTokenizer(amplifying, amplifying, {"<unk>": 0}, pad_id=0, eos_id=0, unk_id=0)
    folder = tmp_path / "induction"  # attnviz's own checkpoint, its spm.model replaced: one line, exit 2
    sh.copytree(pretrained_dir() / "induction", folder)
    (folder / "spm.model").write_bytes(amplifying)
    assert main(["generate", "--model", str(folder), "--device", "cpu", "abc"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "5,000 times" in err, err


def test_a_sentencepiece_model_within_the_bound_refuses_a_text_it_could_lengthen_too_far():
    from attnviz.tokenizer import MAX_NORMALIZED_CHARS, SentencePieceTokenizer

    tok = SentencePieceTokenizer(_sentencepiece_with_replacement(100), max_tokens=10**6)
    assert tok.growth == 100
    assert tok.encode_source("a cat").ids  # a short text is read as before
    with pytest.raises(InputError, match="lengthen a text 100 times"):
        tok.encode_source("a" * (MAX_NORMALIZED_CHARS // 100 + 1))


@pytest.mark.slow
def test_the_amplifying_tokenizer_of_the_issue_never_aborts_and_stays_small(folders, tmp_path):
    refused = _with_tokenizer(folders["llama"], tmp_path / "six", "normalizer", SIX_REPLACES)
    doubled = {"type": "Sequence", "normalizers": [_replace("a", "a" * 14)] * 2}
    (tmp_path / "two").mkdir()
    bounded = _with_tokenizer(folders["llama"], tmp_path / "two", "normalizer", doubled)
    probe = textwrap.dedent(
        """
        import contextlib, io, json, resource, sys
        from attnviz.cli import main
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        runs = [(sys.argv[1], "a" * 300), (sys.argv[1], "a" * 10), (sys.argv[2], "a" * 1500), (sys.argv[2], "a" * 5000)]
        statuses = []
        for folder, prompt in runs:
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                statuses.append(main(["generate", "--model", folder, "--device", "cpu", "--max-new", "1", prompt]))
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
        print(json.dumps({"statuses": statuses, "grown_mb": grown}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(refused), str(bounded)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"the process ended with {result.returncode}: {result.stderr[-2000:]}"
    report = json.loads(result.stdout.splitlines()[-1])
    # Refused at load twice; 1,500 characters, lengthened to 294,000, are encoded and then refused as more
    # tokens than the model reads; 5,000 characters are refused before the library reads them.
    assert report["statuses"] == [2, 2, 2, 2], report
    assert report["grown_mb"] < 400, report


# The bound attnviz assumes for each step, against what the tokenizers library does on the texts that
# lengthen most: every Unicode character for the normal forms, and chosen texts for the rest.
WORST_TEXTS = ["\ufdfa" * 5, "\u0390" * 7, "\u0130" * 9, "\U0001f600" * 4, "漢字" * 6, "a" * 11, " ", "ÅÉÎ" * 3]


def _library_normalizer(spec: dict):
    from tokenizers import Tokenizer

    base = {"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}}
    return Tokenizer.from_str(json.dumps({**base, "normalizer": spec})).normalizer


STEPS = {
    "NFKC": {"type": "NFKC"},
    "NFD": {"type": "NFD"},
    "Lowercase": {"type": "Lowercase"},
    "BertNormalizer": {
        "type": "BertNormalizer",
        "clean_text": True,
        "handle_chinese_chars": True,
        "strip_accents": True,
        "lowercase": True,
    },
    "Prepend": {"type": "Prepend", "prepend": "▁▁▁"},
    "Replace": _replace("a", "bcd"),
    "Regex Replace": {"type": "Replace", "pattern": {"Regex": "x*"}, "content": "yz"},
    "ByteLevel": {"type": "ByteLevel"},
}


@pytest.mark.parametrize("step", STEPS)
def test_each_normalizer_bound_holds_for_the_library(step):
    normalizer = _library_normalizer(STEPS[step])
    bound = growth(STEPS[step], "normalizer")
    for text in WORST_TEXTS:
        assert len(normalizer.normalize_str(text)) <= bound * len(text), (step, text)


@pytest.mark.slow
@pytest.mark.parametrize("form", NORMAL_FORMS)
def test_each_unicode_forms_bound_holds_for_every_character(form):
    normalizer = _library_normalizer({"type": form})
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    longest = max(len(normalizer.normalize_str(text[i])) for i in range(len(text)))
    assert longest == NORMAL_FORMS[form]  # the bound is tight: UAX #15's maximum, reached
