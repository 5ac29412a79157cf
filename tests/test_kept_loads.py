"""conftest.one_load_per_checkpoint_in_the_app: what the AppTests' kept loads hand back, and when they load afresh.

A kept load that outlived a change to its folder would let an AppTest pass on a model the test had
replaced or broken, so each way of changing what a load reads is checked here to load again.
"""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import SCRIPT_THREAD, seeded_model, tiny_config

from attnviz import api
from attnviz.checkpoints.native import WEIGHTS_FILE, save_checkpoint
from attnviz.errors import CheckpointError


def _in_a_script(path, device: str = "auto"):
    """``api.load_checkpoint(path)`` called where a page's script runs (Streamlit's script thread)."""
    out = {}

    def run() -> None:
        try:
            out["bundle"] = api.load_checkpoint(path, device)
        except CheckpointError as e:
            out["error"] = e

    thread = threading.Thread(target=run, name=SCRIPT_THREAD)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["bundle"]


@pytest.fixture
def folder(tmp_path, tiny_spm):
    return save_checkpoint(seeded_model(tiny_config()), tmp_path / "kept", tiny_spm, {"name": "kept"}, "# kept\n")


def _weights(bundle) -> torch.Tensor:
    return torch.cat([p.flatten() for p in bundle.model.parameters()])


def test_a_scripts_second_load_is_its_first_and_anyone_elses_is_new(folder):
    first = _in_a_script(folder)
    assert _in_a_script(folder) is first
    assert _in_a_script(folder, "cpu") is not first  # another device asked for: its own load
    direct = api.load_checkpoint(folder)  # the loaders' own tests, the command line: always a load
    assert direct is not first and api.load_checkpoint(folder) is not direct
    assert torch.equal(_weights(direct), _weights(first))


def test_a_file_changed_in_place_at_its_size_is_loaded_again(folder):
    first = _in_a_script(folder)
    weights = folder / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    stat = weights.stat()
    data[-4:] = torch.tensor([0.5]).numpy().tobytes()  # the last float32 of the file: a weight, not the header
    weights.write_bytes(bytes(data))
    assert weights.stat().st_size == stat.st_size
    second = _in_a_script(folder)
    assert second is not first and not torch.equal(_weights(second), _weights(first))


def test_a_broken_file_is_refused_though_its_folder_loaded_before(folder):
    _in_a_script(folder)
    weights = folder / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-4:] = torch.tensor([float("nan")]).numpy().tobytes()
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        _in_a_script(folder)


def test_a_lowered_limit_refuses_what_was_loaded(folder, monkeypatch):
    _in_a_script(folder)
    monkeypatch.setenv("ATTNVIZ_MAX_LAYERS", "1")  # tiny_config has two per stack
    with pytest.raises(CheckpointError, match="layers"):
        _in_a_script(folder)


def test_a_file_added_below_the_folder_loads_it_again(folder):
    first = _in_a_script(folder)
    (folder / "history").mkdir()  # what a loader may read below its folder counts too
    (folder / "history" / "history.json").write_text("{}")
    assert _in_a_script(folder) is not first


def test_a_folder_without_its_own_config_or_holding_too_much_is_never_kept(folder, tmp_path, monkeypatch):
    import conftest

    assert conftest._checkpoint_contents(folder) is not None
    package = tmp_path / "package"  # a hub cache or a Python package's model/: the files are found below
    package.mkdir()
    (package / "model").symlink_to(folder)
    assert conftest._checkpoint_contents(package) is None
    assert conftest._checkpoint_contents(tmp_path / "nowhere") is None
    files = sum(1 for p in folder.rglob("*") if p.is_file())
    monkeypatch.setattr(conftest, "KEPT_FILES", files - 1)
    assert conftest._checkpoint_contents(folder) is None
    monkeypatch.setattr(conftest, "KEPT_FILES", files)
    monkeypatch.setattr(conftest, "KEPT_BYTES", (folder / WEIGHTS_FILE).stat().st_size)
    assert conftest._checkpoint_contents(folder) is None
