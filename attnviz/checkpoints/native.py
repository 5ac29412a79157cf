"""attnviz's own checkpoint directories: config.json, model.safetensors, sentencepiece model(s), README.md.

Loading never unpickles: weights are read with safetensors only, and every problem (a missing
file, a truncated or foreign weights file, a shape that does not fit the config) raises a
[`CheckpointError`][attnviz.errors.CheckpointError] that names the file and says what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from attnviz.checkpoints.bundle import Bundle, checked_shapes, make_bundle
from attnviz.checkpoints.files import CONFIG_FILE, SAFETENSORS_FILE, WeightsFile, read_bytes, read_config
from attnviz.errors import CheckpointError, ConfigError, describe
from attnviz.model import Transformer, TransformerConfig
from attnviz.tokenizer import SentencePieceTokenizer

FAMILY = "attnviz"
DESCRIPTION = f"an attnviz checkpoint ({CONFIG_FILE}, {SAFETENSORS_FILE}, spm.model)"
FORMAT = "attnviz"
FORMAT_VERSION = 1
WEIGHTS_FILE = SAFETENSORS_FILE
CARD_FILE = "README.md"
SPM_FILE = "spm.model"


def save_checkpoint(model: Transformer, out_dir: str | Path, spm_model: bytes, info: dict, card: str) -> Path:
    """Write a checkpoint directory; the same model and info give the same bytes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # named_parameters lists a tied tensor once, so the shared embedding is stored once.
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.named_parameters()}
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


def detect(path: Path) -> bool:
    """Whether ``path`` holds an attnviz config.json."""
    try:
        return read_config(path).get("format") == FORMAT
    except CheckpointError:
        return False


def _read_tokenizer(path: Path, data: dict, cfg: TransformerConfig) -> SentencePieceTokenizer:
    names = data.get("tokenizer", {})
    if not isinstance(names, dict):
        raise CheckpointError(
            f'{path / CONFIG_FILE}: "tokenizer" must be an object like {{"source": "{SPM_FILE}", '
            f'"target": "{SPM_FILE}"}}, got {describe(names)}'
        )
    models, files = {}, {}
    for side in ("source", "target"):
        name = names.get(side, SPM_FILE)
        if not isinstance(name, str) or not name:
            raise CheckpointError(f'{path / CONFIG_FILE}: tokenizer "{side}" must be a file name, got {describe(name)}')
        file = path / Path(name).name  # a bare file name: never read outside the directory
        if not file.exists():
            raise CheckpointError(f"{file} is missing: the {side} sentencepiece model of this checkpoint")
        models[side], files[side] = read_bytes(file), file
        if not models[side]:  # sentencepiece would write its own log lines about it to stderr
            raise CheckpointError(f"{file} is empty: the {side} sentencepiece model of this checkpoint")
    for side in ("source", "target"):
        try:
            sp = SentencePieceTokenizer(models[side])
        except RuntimeError as e:
            raise CheckpointError(f"{files[side]} is not a readable sentencepiece model ({e})") from None
        want = cfg.src_vocab_size if side == "source" else cfg.tgt_vocab_size
        if sp.src_vocab_size != want:
            raise CheckpointError(
                f"{files[side]} has {sp.src_vocab_size} pieces but {CONFIG_FILE} says the {side} "
                f"vocabulary has {want}: the file is empty, corrupt or from another model"
            )
    return SentencePieceTokenizer(
        models["source"], models["target"], max_tokens=cfg.max_len, decoder_only=cfg.decoder_only
    )


def _config(path: Path, data: dict) -> TransformerConfig:
    if not isinstance(data.get("model"), dict):
        raise CheckpointError(f'{path / CONFIG_FILE}: "model" must be a JSON object holding the model config')
    try:
        return TransformerConfig.from_dict(data["model"])
    except ConfigError as e:
        raise CheckpointError(f"{path / CONFIG_FILE}: {e}") from None


# What a checkpoint says about itself that attnviz shows: the longest each may be.
INFO_TEXTS = {"name": 200, "task": 200, "description": 2000}
MAX_EXAMPLES, MAX_EXAMPLE_CHARS = 100, 2000


def _info(path: Path, data: dict) -> dict:
    """What config.json says about the model besides its config and tokenizer, the fields attnviz shows checked."""
    source = path / CONFIG_FILE
    version = data.get("version", FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise CheckpointError(
            f'{source}: "version" must be a whole number from 1 to {FORMAT_VERSION}, got {describe(version)} '
            "(a newer attnviz may have written it)"
        )
    info = {k: v for k, v in data.items() if k not in ("model", "tokenizer")}
    for key, longest in INFO_TEXTS.items():
        if key in info and not (isinstance(info[key], str) and len(info[key]) <= longest):
            raise CheckpointError(
                f'{source}: "{key}" must be a text of at most {longest:,} characters, got {describe(info[key])}'
            )
    examples = info.get("examples", [])
    if not (
        isinstance(examples, list)
        and len(examples) <= MAX_EXAMPLES
        and all(isinstance(e, str) and len(e) <= MAX_EXAMPLE_CHARS for e in examples)
    ):
        raise CheckpointError(
            f'{source}: "examples" must be a list of at most {MAX_EXAMPLES} texts of at most {MAX_EXAMPLE_CHARS:,} '
            f"characters, got {describe(examples)}"
        )
    return info


def probe(path: Path) -> TransformerConfig:
    """The model ``path/config.json`` describes, refused when it is over the limits; reads no other file."""
    cfg = _config(path, read_config(path))
    checked_shapes(cfg, str(path / CONFIG_FILE))
    return cfg


def load(path: Path, device: str = "auto") -> Bundle:
    """An attnviz checkpoint directory, loaded onto ``device`` in eval mode."""
    data = read_config(path)
    cfg = _config(path, data)
    info = _info(path, data)
    expected, max_bytes = checked_shapes(cfg, str(path / CONFIG_FILE))
    tokenizer = _read_tokenizer(path, data, cfg)
    weights_file = path / WEIGHTS_FILE
    tensors = WeightsFile(weights_file, max_bytes).read({k: [k] for k in expected}, expected, strict=True)
    return make_bundle(cfg, tensors, tokenizer, weights_file, info, device)
