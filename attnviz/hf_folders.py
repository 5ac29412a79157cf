"""What the Hugging Face importers share: finding the folder, reading its config.json."""

from __future__ import annotations

import json
from pathlib import Path

from attnviz.checkpoint import folder_listing
from attnviz.errors import CheckpointError

CONFIG_FILE = "config.json"


def snapshot(path: Path) -> Path:
    """``path`` itself, or the single snapshot of a hub cache folder ``models--X``."""
    snapshots = path / "snapshots"
    if (path / CONFIG_FILE).exists() or not snapshots.is_dir():
        return path
    found = sorted(p.name for p in snapshots.iterdir() if p.is_dir())
    if len(found) != 1:
        raise CheckpointError(
            f"{path} is a Hugging Face hub cache folder with {len(found)} snapshots {found}: "
            f"pass one of them, e.g. {snapshots / found[0]}"
            if found
            else f"{path} is a Hugging Face hub cache folder without snapshots: download the model again"
        )
    return snapshots / found[0]


def read_json(file: Path) -> object:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} is not readable JSON ({e})") from None


def hub_name(path: Path) -> str:
    """``Helsinki-NLP/opus-mt-en-de`` for a hub cache snapshot, else the folder's name."""
    for part in reversed(path.parts):
        if part.startswith("models--"):
            return part[len("models--") :].replace("--", "/")
    return path.name


def read_hf_config(path: Path, model_type: str, expected: str) -> dict:
    """The config.json of a Hugging Face folder of ``model_type``, or a CheckpointError saying what is there.

    ``expected`` names the files such a folder holds and what it is, for the messages.
    """
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        found = folder_listing(path)
        raise CheckpointError(f"{config_file} is missing: {expected}; found {found or 'nothing'}")
    hf = read_json(config_file)
    if not isinstance(hf, dict):
        raise CheckpointError(f"{config_file} must hold a JSON object")
    if hf.get("model_type") != model_type:
        raise CheckpointError(
            f'{config_file} has "model_type": {hf.get("model_type")!r}; expected "{model_type}" ({expected}) '
            "or an attnviz checkpoint"
        )
    return hf
