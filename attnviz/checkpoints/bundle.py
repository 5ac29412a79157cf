"""A loaded model with its tokenizer and description, and how every importer builds one."""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnviz.checkpoints.limits import check_config, current_limits
from attnviz.devices import resolve_device
from attnviz.model import Transformer, TransformerConfig
from attnviz.tokenizer import Tokenizer


@dataclass(frozen=True)
class Bundle:
    """A loaded model with everything needed to use and describe it. Treat it as read-only."""

    model: Transformer
    tokenizer: Tokenizer
    name: str
    path: Path
    sha256: str  # of the weights file
    info: dict = field(default_factory=dict)  # what the folder says about the model: family, examples, card data

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


def expected_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape for ``cfg``, from a model on the meta device; tied tensors appear once.

    Nothing is allocated, so a hostile config asking for a huge model cannot exhaust memory before
    the weights file is checked against these shapes. Kept per config for the process (`_shapes`).
    """
    return dict(_shapes(cfg))


@functools.lru_cache(maxsize=32)
def _shapes(cfg: TransformerConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """`expected_shapes` as a tuple, made once per config: building the meta model is most of a small
    model's load after the first (36 of en-de's 157 ms on a 2-core AMD EPYC with AVX2 only), and a
    process loads one model again and again (a server whose cache let it go, the tests' AppTests)."""
    with torch.device("meta"):
        return tuple((k, tuple(p.shape)) for k, p in Transformer(cfg).named_parameters())


def checked_shapes(cfg: TransformerConfig, source: str) -> tuple[dict[str, tuple[int, ...]], int]:
    """(every parameter's shape, the weights file's largest plausible size), once ``cfg`` is within the limits.

    The sizes are checked before the (meta) model is built and its parameter count after: a config
    asking for too much is refused before any memory is spent on it.
    """
    limits = current_limits()
    check_config(cfg, None, source, limits)
    shapes = expected_shapes(cfg)
    n_parameters = sum(math.prod(shape) for shape in shapes.values())
    check_config(cfg, n_parameters, source, limits)
    return shapes, limits.weights_bytes(n_parameters)


def make_bundle(
    cfg: TransformerConfig,
    tensors: dict[str, torch.Tensor],
    tokenizer: Tokenizer,
    weights_file: Path,
    info: dict,
    device: str,
    sha256: str | None = None,
) -> Bundle:
    """The read-only model in eval mode on ``device``, its parameters copied from checked ``tensors``.

    Every importer ends here, once the tensors are known to fit ``cfg``. The bundle is named by
    ``info["name"]``, else by the folder.
    """
    model = Transformer.holding(cfg, tensors)
    model.eval().requires_grad_(False)
    model = model.to(resolve_device(device))
    folder = weights_file.parent
    digest = sha256 or sha256_file(weights_file)
    return Bundle(model, tokenizer, info.get("name", folder.name), folder.resolve(), digest, info)
