"""Hugging Face folders crafted to mislead the importers: each is refused with one line (exit 2), never read wrongly.

The folders start as tiny random models saved by transformers (tests/lm_models.py, tests/test_bert.py);
each test then edits one file the way a careless conversion or a hostile upload could: a tensor
stored under two names, llama3 RoPE without its keys, a BERT without token types, a pickle of odd
tensors, an index naming shards the file system or the terminal cannot take.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnviz.checkpoints import load_checkpoint
from attnviz.cli import main
from attnviz.errors import CheckpointError

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from lm_models import build  # noqa: E402
from test_bert import tiny_bert  # noqa: E402, F401 (a fixture)

FAMILIES = ["gpt2", "llama", "qwen2"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A model folder of each family, and a Llama whose weights are in shards."""
    root = tmp_path_factory.mktemp("importer-hostile")
    for family in FAMILIES:
        build(family, root / family)
    build("llama", root / "sharded", max_shard_size="60KB")
    return {name: root / name for name in [*FAMILIES, "sharded"]}


def _copy(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    return copy


def _refused(folder: Path, words: str, capsys, command: str = "generate") -> str:
    """The one line the command line prints for ``folder`` (exit 2), checked to hold ``words``."""
    args = ["--model", str(folder), "--device", "cpu"]
    argv = [command, *args, "hello"] if command == "generate" else [command, *args, "--src", "the cat sat"]
    if command == "attention":
        argv += ["--out", str(folder.parent / "x.npz")]
    assert main(argv) == 2, capsys.readouterr().err
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
    return err


# ---------------------------------------------------------------------------------------------
# One tensor under two names


def _with_stray(file: Path, stored: str, stray: str) -> None:
    """Add ``stray``, a copy of ``stored`` with other values, to the safetensors ``file``."""
    tensors = load_file(file)
    tensors[stray] = tensors[stored] + 1.0
    save_file(tensors, file, metadata={"format": "pt"})


STRAYS = {  # the family's stored name, and the same name with the prefix its importer strips (or adds) changed
    "llama norm": ("llama", "model.norm.weight", "norm.weight"),
    "llama layer": ("llama", "model.layers.0.self_attn.q_proj.weight", "layers.0.self_attn.q_proj.weight"),
    "qwen2 norm": ("qwen2", "model.norm.weight", "norm.weight"),
    "gpt2 final norm": ("gpt2", "transformer.ln_f.weight", "ln_f.weight"),
}


@pytest.mark.parametrize("case", STRAYS)
def test_a_tensor_stored_under_two_names_that_mean_one_is_refused(case, folders, tmp_path, capsys):
    """transformers reads the prefixed one; attnviz read whichever came last (safetensors sorts the names: the
    unprefixed one for Llama's norm), and its logits were ~5 from transformers'."""
    family, stored, stray = STRAYS[case]
    folder = _copy(folders[family], tmp_path)
    _with_stray(folder / "model.safetensors", stored, stray)
    with pytest.raises(CheckpointError, match="two stored tensors") as info:
        load_checkpoint(folder, "cpu")
    assert stored in str(info.value) and stray in str(info.value)
    _refused(folder, "two stored tensors", capsys)


def test_a_tensor_under_two_names_in_a_shard_index_is_refused(folders, tmp_path, capsys):
    folder = _copy(folders["sharded"], tmp_path)
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    save_file({"norm.weight": torch.ones(64)}, folder / "stray.safetensors")
    index["weight_map"]["norm.weight"] = "stray.safetensors"
    index_file.write_text(json.dumps(index))
    _refused(folder, "two stored tensors", capsys)


def test_a_tensor_under_two_names_inside_one_shard_is_refused(folders, tmp_path, capsys):
    """The index lists one name; the shard holds both."""
    folder = _copy(folders["sharded"], tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    _with_stray(folder / index["weight_map"]["model.norm.weight"], "model.norm.weight", "norm.weight")
    _refused(folder, "two stored tensors", capsys)


@pytest.mark.parametrize(
    "stored, stray",
    [
        ("embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.weight"),
        ("embeddings.LayerNorm.weight", "embeddings.LayerNorm.gamma"),  # a TF-era name for the same weight
    ],
)
def test_a_bert_tensor_under_two_names_is_refused(stored, stray, tiny_bert, tmp_path, capsys):  # noqa: F811
    folder = _copy(tiny_bert[0], tmp_path)
    _with_stray(folder / "model.safetensors", stored, stray)
    _refused(folder, "two stored tensors", capsys, command="attention")


# ---------------------------------------------------------------------------------------------
# llama3 RoPE without the keys transformers requires


LLAMA3_MISSING = {
    "nothing but the type": ({"rope_parameters": {"rope_type": "llama3"}}, "factor"),
    "old rope_scaling": ({"rope_scaling": {"type": "llama3"}}, "high_freq_factor"),
    "no factor": (
        {"rope_parameters": {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
        "'factor'",
    ),
    "no high_freq_factor": (
        {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}},
        "high_freq_factor",
    ),
}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("case", LLAMA3_MISSING)
def test_llama3_rope_missing_a_required_key_is_refused_as_transformers_refuses_it(
    case, family, folders, tmp_path, capsys
):
    """attnviz filled them in (factor 8, low 1, high 4); transformers raises "Missing required keys"."""
    change, words = LLAMA3_MISSING[case]
    folder = _copy(folders[family], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(KeyError, match="Missing required keys"):
        transformers.AutoConfig.from_pretrained(folder)
    err = _refused(folder, words, capsys)
    assert "missing" in err


def test_llama3_rope_without_its_original_length_loads_as_transformers_fills_it_in(folders, tmp_path):
    """The one llama3 key transformers does not require: it is the model's max_position_embeddings."""
    folder = _copy(folders["llama"], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    (folder / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoConfig.from_pretrained(folder)
    cfg = load_checkpoint(folder, "cpu").config
    assert cfg.rope_original_max_len == reference.rope_parameters["original_max_position_embeddings"] == 256


# ---------------------------------------------------------------------------------------------
# BERT without token types


def test_a_bert_with_no_token_types_is_refused(tiny_bert, tmp_path, capsys):  # noqa: F811
    """BERT adds type 0's embedding to every token: transformers cannot run an empty table (IndexError), and
    attnviz failed with KeyError: 'token_type' (exit 3)."""
    folder = _copy(tiny_bert[0], tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["type_vocab_size"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    reference = transformers.BertModel(transformers.BertConfig(**config)).eval()
    with pytest.raises(RuntimeError, match="index"):
        reference(input_ids=torch.tensor([[1, 2, 3]]))
    with pytest.raises(CheckpointError, match="type_vocab_size"):
        load_checkpoint(folder, "cpu")
    _refused(folder, "type_vocab_size", capsys, command="attention")


# ---------------------------------------------------------------------------------------------
# A pickle of what is not a plain state dict


def _odd(state: dict) -> dict[str, dict]:
    name = next(n for n in state if n.endswith("norm.weight") or n.endswith("ln_f.weight"))
    t = state[name]
    return {
        "an integer key": {**state, 1: t},
        "a meta tensor": {**state, name: torch.empty(t.shape, device="meta")},
        "a sparse tensor": {**state, name: t.to_sparse()},
        "a sparse CSR tensor": {**state, name: torch.diag(t).to_sparse_csr()},
        "a nested tensor": {**state, "extra": torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])},
        "a quantized tensor": {**state, name: torch.quantize_per_tensor(t, 0.1, 0, torch.qint8)},
    }


ODD = [
    "an integer key",
    "a meta tensor",
    "a sparse tensor",
    "a sparse CSR tensor",
    "a nested tensor",
    "a quantized tensor",
]


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's, about nested and sparse tensors
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", ODD)
def test_a_pickle_of_odd_keys_or_tensors_is_refused(case, family, folders, tmp_path, capsys):
    """An integer key crashed the renaming (AttributeError), a meta tensor the check for NaN: exit 3."""
    folder = _copy(folders[family], tmp_path)
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(_odd(state)[case], folder / "pytorch_model.bin")
    _refused(folder, "pytorch_model.bin does not hold", capsys)


def test_a_plain_pickled_state_dict_still_loads_and_equals_transformers(folders, tmp_path):
    folder = _copy(folders["llama"], tmp_path)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    bundle = load_checkpoint(folder, "cpu")
    reference = transformers.AutoModelForCausalLM.from_pretrained(folders["llama"], attn_implementation="eager")
    ids = torch.tensor([bundle.tokenizer.encode_source("the cat sat").ids])
    with torch.no_grad():
        torch.testing.assert_close(bundle.model(None, ids).logits, reference(ids).logits, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# Shard names


def _renamed_shard(folder: Path, new: str, move: bool) -> None:
    """Point every tensor of the index's first shard at ``new`` (and rename the file, if ``move``)."""
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    old = index["weight_map"]["model.norm.weight"]
    index["weight_map"] = {k: new if v == old else v for k, v in index["weight_map"].items()}
    index_file.write_text(json.dumps(index))
    if move:
        (folder / old).rename(folder / new)


@pytest.mark.parametrize(
    "name, move",
    [
        ("a" * 300 + ".safetensors", False),  # longer than a file name may be: OSError (File name too long)
        ("\u001b[31mRED\u001b[0m.safetensors", True),  # a terminal's escape sequences, printed raw
        ("two\nlines.safetensors", True),
        ("back\\slash.safetensors", True),
    ],
    ids=["too long", "escape sequences", "new line", "backslash"],
)
def test_a_shard_name_the_file_system_or_a_terminal_cannot_take_is_refused(name, move, folders, tmp_path, capsys):
    folder = _copy(folders["sharded"], tmp_path)
    _renamed_shard(folder, name, move)
    with pytest.raises(CheckpointError, match="shard"):
        load_checkpoint(folder, "cpu")
    err = _refused(folder, "shard", capsys)
    assert "\u001b" not in err and "a" * 100 not in err, err
