"""Models by their Hugging Face hub id (``Helsinki-NLP/opus-mt-en-de``), through ``huggingface_hub``.

An id resolves to a folder of the hub's own cache (``models--org--name/snapshots/<sha>/``, with
``refs/main`` naming the snapshot): downloaded into it when the hub can be reached, read from it
when not, and only read from it with ``HF_HUB_OFFLINE=1``. The cache is ``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (`attnviz.checkpoints.catalog.hf_cache_dir`,
read at each call, so that a setting made after import counts).

Only the files an importer reads are fetched, and the config first: a model of a family attnviz
cannot load, or over the size limits (`attnviz.checkpoints.limits`), is refused before any
weights are downloaded. A visitor of the app reaches this only when the operator sets
``ATTNVIZ_ALLOW_DOWNLOADS=1`` (`downloads_allowed`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from attnviz.checkpoints import IMPORTERS
from attnviz.checkpoints.files import CONFIG_FILE, SAFETENSORS_FILE, one_read
from attnviz.errors import CheckpointError

# An id as the hub allows it: an owner and a name of letters, digits, ".", "_" and "-", neither
# starting with a dot or a dash; "--" and ".." are refused by the hub itself.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
# What the importers read: configs, tokenizers and vocabularies, a card, and one weights file.
HUB_FILES = [CONFIG_FILE, "README.md", "*.spm", "spm.model", "vocab.json", "target_vocab.json", "tokenizer.json"]
SHARDS = ["model.safetensors.index.json", "model-*-of-*.safetensors"]  # a large model's weights, in parts
PICKLE_FILE = "pytorch_model.bin"  # fetched only when a model has no model.safetensors
ALLOW_DOWNLOADS = "ATTNVIZ_ALLOW_DOWNLOADS"
_TRUE = {"1", "on", "yes", "true"}


def is_hub_id(text: str) -> bool:
    """Whether ``text`` reads as ``owner/name`` on the hub (not a path such as ``./x/y`` or ``/x/y``)."""
    return bool(HUB_ID.fullmatch(text)) and "--" not in text and ".." not in text


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids reaching the hub (read now, as huggingface_hub reads it at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def downloads_allowed() -> bool:
    """Whether the operator of an app lets visitors download models: ``ATTNVIZ_ALLOW_DOWNLOADS=1``."""
    return os.environ.get(ALLOW_DOWNLOADS, "").strip().lower() in _TRUE


def cache_folder(repo_id: str, cache: Path) -> Path:
    """Where the hub's cache keeps ``repo_id``: ``cache/models--owner--name``."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def _copy_advice(repo_id: str) -> str:
    """How to give this machine ``repo_id`` without the hub: a command to run elsewhere, and where to copy the result.

    It names the settings, never their values: it is shown to visitors of the app, who are not told
    the server's paths.
    """
    return (
        f"download it where the hub can be reached (hf download {repo_id}, or huggingface-cli download {repo_id} "
        f"with huggingface_hub < 1.0) and copy its cache folder {cache_folder(repo_id, Path()).name} into the hub "
        "cache here (HF_HUB_CACHE) or into a folder listed in ATTNVIZ_MODEL_ROOTS"
    )


def _fetch(repo_id: str, cache: Path, patterns: list[str], offline: bool) -> Path:
    """The snapshot folder ``snapshot_download`` gives, or a CheckpointError that says why the hub gave none.

    Both messages name the real reason, as far as huggingface_hub's exceptions tell it: offline
    mode, a hub that cannot be reached, an id it does not have, a gated model. The public one names
    no path (the full one names the cache, for the log); a visitor reaches it only where the
    operator allows downloads (`attnviz.checkpoints.catalog.visitor_model`).
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError
    from huggingface_hub.utils import OfflineModeIsEnabled

    login = "log in where attnviz runs (hf auth login, or huggingface-cli login)"
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, allow_patterns=patterns, local_files_only=offline))
    except GatedRepoError:
        why = (
            f"{repo_id} is a gated model on the Hugging Face hub: accept its terms on its page there and {login}; "
            f"or {_copy_advice(repo_id)}"
        )
        raise CheckpointError(why, why) from None
    except RepositoryNotFoundError:
        why = (
            f"the Hugging Face hub has no model {repo_id}, or it is private: check the id (owner/name, as on its "
            f"page on huggingface.co); for a private model {login}, or {_copy_advice(repo_id)}"
        )
        raise CheckpointError(why, why) from None
    except LocalEntryNotFoundError as e:
        if hub_offline() or isinstance(e.__cause__, OfflineModeIsEnabled):
            why = "HF_HUB_OFFLINE=1 forbids reaching the Hugging Face hub"
        elif offline:
            why = "only the cache was read"
        else:
            why = "the Hugging Face hub could not be reached (no network, a proxy in the way, or the hub is down)"
        advice = f"To use it: {_copy_advice(repo_id)}"
        raise CheckpointError(
            f"{repo_id} is not in the Hugging Face cache ({cache}), and {why}. {advice}; or point --model at a "
            "folder that has it",
            f"{repo_id} is not in the Hugging Face cache on this machine, and {why}. {advice}",
        ) from None
    except (OSError, ValueError) as e:  # an invalid id the pattern let through, a full disk, a network error
        raise CheckpointError(
            f"could not get {repo_id} from the Hugging Face hub: {e}",
            f"could not get {repo_id} from the Hugging Face hub (the server's log says why)",
        ) from None


def _probe(folder: Path, repo_id: str) -> None:
    """Refuse a model that no importer can load, or that is over the limits, before its weights are fetched."""
    with one_read():
        for importer in IMPORTERS:
            if importer.detect(folder):
                importer.probe(folder)
                return
    raise CheckpointError(
        f"{repo_id} is not a model attnviz can load: attnviz reads Marian (opus-mt), BERT, GPT-2, Llama-family "
        "and Qwen2 models and its own checkpoints from the hub",
        f"{repo_id} is not a model attnviz can load",
    )


def hub_snapshot(repo_id: str, cache: Path, download: bool = True) -> Path:
    """The snapshot folder of ``repo_id`` in the hub's ``cache``, downloading what is missing.

    With ``download`` False, or ``HF_HUB_OFFLINE`` set, only the cache is read, and a model that is
    not in it is a CheckpointError that says so. Online, the config comes first and is checked
    (`_probe`); then the tokenizer files and ``model.safetensors`` (``pytorch_model.bin`` only
    when the model has neither model.safetensors nor its shards).
    """
    if not is_hub_id(repo_id):
        raise CheckpointError(f"{repo_id!r} is not a Hugging Face hub id (owner/name)")
    offline = not download or hub_offline()
    if not offline:
        _probe(_fetch(repo_id, cache, [CONFIG_FILE], offline), repo_id)
    folder = _fetch(repo_id, cache, [*HUB_FILES, SAFETENSORS_FILE], offline)
    if not offline and not (folder / SAFETENSORS_FILE).exists():
        folder = _fetch(repo_id, cache, SHARDS, offline)
    if not offline and not (folder / SAFETENSORS_FILE).exists() and not (folder / SHARDS[0]).exists():
        folder = _fetch(repo_id, cache, [PICKLE_FILE], offline)
    return folder
