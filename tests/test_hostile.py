"""Hostile and broken checkpoints: each is refused with a clear message, quickly, without exhausting memory.

Every class of folder a visitor or a careless download could produce: configs asking for huge
models, a config that is a device or a huge file, a huge tokenizer file, JSON nested thousands
deep, links out of the folder, NaN and infinite weights, pickles. Half-precision weights, in
contrast, must still load. The memory test loads every hostile folder in one fresh process and
reads its peak resident memory.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import seeded_model, tiny_config
from safetensors.torch import load_file, save_file

import attnviz
from attnviz.checkpoints import load_checkpoint
from attnviz.checkpoints.files import all_finite
from attnviz.checkpoints.native import CONFIG_FILE, SPM_FILE, WEIGHTS_FILE, save_checkpoint
from attnviz.cli import main
from attnviz.errors import CheckpointError

pytest.importorskip("transformers")
from test_marian import make_marian  # noqa: E402

GIB = 1 << 30


def _config(folder: Path) -> dict:
    return json.loads((folder / CONFIG_FILE).read_text())


def _write_config(folder: Path, data: dict) -> None:
    (folder / CONFIG_FILE).write_text(json.dumps(data))


def _edit_weights(folder: Path, name: str, edit) -> None:
    tensors = load_file(str(folder / WEIGHTS_FILE))
    tensors[name] = edit(tensors[name]).contiguous()
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "attnviz"})


def _huge_layers(d: Path) -> None:
    c = _config(d)
    c["model"]["n_enc_layers"] = 100_000
    _write_config(d, c)


def _huge_positions(d: Path) -> None:
    c = _config(d)
    c["model"]["max_len"] = 10**9
    _write_config(d, c)


def _huge_width(d: Path) -> None:
    c = _config(d)
    c["model"].update(d_model=8192, n_heads=8, d_ff=65536, n_enc_layers=64, n_dec_layers=64)
    _write_config(d, c)


def _config_is_a_device(d: Path) -> None:
    (d / CONFIG_FILE).unlink()
    (d / CONFIG_FILE).symlink_to("/dev/zero")


def _config_is_a_link_loop(d: Path) -> None:
    (d / CONFIG_FILE).unlink()
    (d / CONFIG_FILE).symlink_to(CONFIG_FILE)


def _config_is_a_dangling_link(d: Path) -> None:
    (d / CONFIG_FILE).unlink()
    (d / CONFIG_FILE).symlink_to("nowhere.json")


def _spm_is_empty(d: Path) -> None:
    (d / SPM_FILE).write_bytes(b"")


def _config_is_a_fifo(d: Path) -> None:
    (d / CONFIG_FILE).unlink()
    os.mkfifo(d / CONFIG_FILE)


def _config_is_huge(d: Path) -> None:
    with open(d / CONFIG_FILE, "r+b") as f:  # a sparse file: 1 GiB on paper, nothing on disk
        f.truncate(GIB)


def _spm_is_huge(d: Path) -> None:
    with open(d / SPM_FILE, "wb") as f:
        f.truncate(2 * GIB)


def _nested_json(d: Path) -> None:
    (d / CONFIG_FILE).write_text("[" * 200_000 + "]" * 200_000)


def _weights_link_out(d: Path) -> None:
    outside = d.parent / "elsewhere.safetensors"
    (d / WEIGHTS_FILE).rename(outside)
    (d / WEIGHTS_FILE).symlink_to(outside)


def _nan_in_a_projection(d: Path) -> None:
    _edit_weights(
        d, "encoder_layers.1.self_attn.k_proj.weight", lambda t: t.index_fill(0, torch.tensor([3]), float("nan"))
    )


def _inf_in_an_embedding(d: Path) -> None:
    _edit_weights(d, "src_embed.weight", lambda t: t.index_fill(1, torch.tensor([0]), float("inf")))


# name -> (what it does to a good checkpoint, words the full message must contain)
HOSTILE = {
    "100000 layers": (_huge_layers, "n_enc_layers is 100,000, above attnviz's limit"),
    "a billion positions": (_huge_positions, "max_len is 1,000,000,000"),
    "2.6 billion parameters": (_huge_width, "parameters is"),
    "config is /dev/zero": (_config_is_a_device, "outside the checkpoint folder"),
    "config is a fifo": (_config_is_a_fifo, "not a regular file"),
    "config is a link to itself": (_config_is_a_link_loop, "config.json is missing or unreadable (Symlink loop"),
    "config is a dangling link": (_config_is_a_dangling_link, "config.json is missing or unreadable (No such file"),
    "spm is empty": (_spm_is_empty, "spm.model is empty"),
    "config of 1 GiB": (_config_is_huge, "1,073,741,824 bytes, above attnviz's limit"),
    "spm of 2 GiB": (_spm_is_huge, "2,147,483,648 bytes, above attnviz's limit"),
    "JSON nested 200000 deep": (_nested_json, "too deeply"),
    "weights link out of the folder": (_weights_link_out, "outside the checkpoint folder"),
    "NaN in a projection": (_nan_in_a_projection, "'encoder_layers.1.self_attn.k_proj.weight' holds 32 NaN"),
    "infinity in the embedding": (_inf_in_an_embedding, "'src_embed.weight' holds 50 NaN or infinite"),
}


@pytest.fixture
def good(tmp_path, tiny_spm) -> Path:
    return save_checkpoint(seeded_model(tiny_config()), tmp_path / "ckpt", tiny_spm, {"name": "tiny"}, "# tiny\n")


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_checkpoint_is_refused_with_a_clear_message(good, case):
    make, words = HOSTILE[case]
    make(good)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(good, device="cpu")
    assert words in str(info.value)
    # What a visitor of a hosted app would see: no server path, nothing read from the file.
    public = info.value.public
    assert str(good) not in public and "/" not in public and "nan" not in public.lower().replace("nan or", "")


BIG = 3e38  # float32's largest is 3.4e38: two of these overflow a sum, each one is finite
FINITE_CASES = {
    "normal values": torch.randn(1000),
    "a NaN": torch.randn(1000).index_fill(0, torch.tensor([7]), float("nan")),
    "an infinity": torch.randn(1000).index_fill(0, torch.tensor([999]), float("inf")),
    "a negative infinity": torch.randn(1000).index_fill(0, torch.tensor([0]), float("-inf")),
    "both infinities (their sum is NaN)": torch.tensor([1.0, float("inf"), float("-inf")]),
    "finite values whose sum overflows": torch.full((64,), BIG),
    "finite values whose sum may overflow on the way": torch.tensor([BIG, BIG, -BIG, -BIG] * 16),
    "overflow and a NaN": torch.cat([torch.full((64,), BIG), torch.tensor([float("nan")])]),
    "no values": torch.empty(0, 4),
    "float16 summing past its largest": torch.full((100,), 60000.0, dtype=torch.float16),
    "bfloat16 with a NaN": torch.tensor([1.0, float("nan")], dtype=torch.bfloat16),
}


@pytest.mark.parametrize("case", FINITE_CASES)
def test_the_finiteness_check_agrees_with_testing_every_value_in_numpy(case):
    t = FINITE_CASES[case]
    assert all_finite(t) == bool(np.isfinite(t.double().numpy()).all())


def test_huge_finite_weights_whose_sum_overflows_still_load(good, batch):
    _edit_weights(good, "src_embed.weight", lambda t: t.index_fill(1, torch.tensor([0]), BIG))
    bundle = load_checkpoint(good, device="cpu")
    assert float(bundle.model.src_embed.weight[:, 0].min()) == pytest.approx(BIG)


@pytest.mark.slow
def test_hostile_checkpoints_cost_little_memory(tmp_path, tiny_spm):
    folders = []
    for i, (make, _) in enumerate(HOSTILE.values()):
        folder = save_checkpoint(seeded_model(tiny_config()), tmp_path / f"h{i}", tiny_spm, {"name": "h"}, "")
        make(folder)
        folders.append(str(folder))
    probe = textwrap.dedent(
        """
        import json, resource, sys
        from attnviz.checkpoints import load_checkpoint
        from attnviz.errors import CheckpointError
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        refused = 0
        for folder in json.loads(sys.argv[1]):
            try:
                load_checkpoint(folder, device="cpu")
            except CheckpointError:
                refused += 1
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(refused, (after - before) // 1024)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(folders)], capture_output=True, text=True, timeout=120, check=True
    )
    refused, grown_mb = map(int, result.stdout.split())
    assert refused == len(HOSTILE)
    assert grown_mb < 64, f"peak memory grew by {grown_mb} MB while refusing {refused} hostile checkpoints"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_still_load(good, dtype, batch):
    tensors = load_file(str(good / WEIGHTS_FILE))
    save_file({k: v.to(dtype) for k, v in tensors.items()}, str(good / WEIGHTS_FILE), metadata={"format": "attnviz"})
    bundle = load_checkpoint(good, device="cpu")
    reference = seeded_model(tiny_config())
    with torch.no_grad():
        for name, p in bundle.model.named_parameters():
            assert p.dtype == torch.float32
            torch.testing.assert_close(p, dict(reference.named_parameters())[name].to(dtype).float())


@pytest.fixture(scope="module")
def marian_bin(tmp_path_factory) -> Path:
    """A Marian folder whose weights are an old pickled pytorch_model.bin."""
    folder = tmp_path_factory.mktemp("marian") / "opus-mt-tiny"
    make_marian(folder, shared=True, activation="swish", d_model=16, heads=2, enc=1, dec=1)
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(tensors, folder / "pytorch_model.bin")
    return folder


def test_a_pickle_loads_only_where_weights_only_has_no_known_bypass(marian_bin, monkeypatch):
    assert attnviz.load(str(marian_bin), device="cpu").info["weights_file"] == "pytorch_model.bin"
    monkeypatch.setattr(torch, "__version__", "2.9.1+cpu")
    with pytest.raises(CheckpointError) as info:
        attnviz.load(str(marian_bin), device="cpu")
    message = str(info.value)
    assert "2.9.1" in message and "safetensors" in message and "weights_only=False" not in message
    assert "convert" in info.value.public


def test_a_pickle_that_is_not_a_state_dict_never_suggests_unsafe_loading(marian_bin, tmp_path):
    folder = tmp_path / "evil"
    folder.mkdir()
    for f in marian_bin.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    torch.save({"model": Path("any-class-weights_only-refuses")}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as info:
        attnviz.load(str(folder), device="cpu")
    assert "weights_only=False" not in str(info.value) and "never loads it any other way" in str(info.value)


class _Runs:
    """A pickle that would run a command when unpickled by anything but weights_only."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_the_command_line_gives_one_line_for_a_pickle_and_runs_nothing_from_it(marian_bin, tmp_path, capsys):
    folder, marker = tmp_path / "evil", tmp_path / "ran"
    folder.mkdir()
    for f in marian_bin.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": _Runs(marker)}, protocol=4))
    assert main(["translate", "--model", str(folder), "a b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnviz: error:") and "not a plain PyTorch state dict" in err[0], err
    assert not marker.exists()
    # a pickled state dict that loads: one warning line, then the answer
    assert main(["translate", "--model", str(marian_bin), "a b"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attnviz: warning:") and "is a pickle file" in err[0], err


@pytest.fixture
def overflowing(good) -> Path:
    """Finite weights whose forward overflows: every cross-attention key of the first decoder layer is infinite."""
    _edit_weights(good, "decoder_layers.0.cross_attn.k_proj.weight", lambda t: torch.full_like(t, BIG))
    return good


def test_a_model_whose_numbers_overflow_gives_no_output_rather_than_a_wrong_one(overflowing, tmp_path, capsys):
    """Each path that hides the attention weights (the fused greedy decoding, value-zeroing, the atlas's statistics)
    refuses such a model as `attention` does, where it had given an output (exit 0) or a traceback (exit 3)."""
    from attnviz.atlas import compute_atlas
    from attnviz.errors import NonFiniteError

    bundle = load_checkpoint(overflowing, device="cpu")
    with pytest.raises(NonFiniteError):
        attnviz.attention(bundle, "a b", "b a")  # the weights themselves: refused before this change too
    for beam in (1, 3):
        with pytest.raises(NonFiniteError, match="NaN or infinite values at output step 1"):
            attnviz.translate(bundle, "a b c", beam=beam)
    with pytest.raises(NonFiniteError, match="value-zeroing"):
        attnviz.attribute(bundle, "a b", "b a", method="value-zeroing")
    with pytest.raises(NonFiniteError, match="attention of line 1"):
        compute_atlas(bundle, ["a b", "b a"], ["b a", "a b"])
    assert main(["translate", "--model", str(overflowing), "a b c"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    # the same folder before the edit: every one of these answers
    intact = load_checkpoint(_unedited(overflowing, tmp_path), device="cpu")
    attnviz.translate(intact, "a b c", beam=3)
    attnviz.attribute(intact, "a b", "b a", method="value-zeroing")
    compute_atlas(intact, ["a b", "b a"], ["b a", "a b"])


def _unedited(folder: Path, tmp_path: Path) -> Path:
    """A copy of ``folder`` with the edited key projection put back to the seeded model's."""
    copy = tmp_path / "intact"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    name = "decoder_layers.0.cross_attn.k_proj.weight"
    seeded = seeded_model(tiny_config()).state_dict()[name]
    _edit_weights(copy, name, lambda t: seeded.clone())
    return copy
