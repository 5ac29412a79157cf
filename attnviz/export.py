"""What one sentence's forward pass gives back as plain numpy data, and the .npz export of its maps.

The export holds only numbers, unicode strings and a JSON manifest, so ``numpy.load(path,
allow_pickle=False)`` reads it and nothing in it is ever unpickled.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from attnviz.kinds import KINDS, axis_names

STANDARD_ARRAYS = ("encoder", "decoder", "cross", "src_ids", "tgt_ids", "src_tokens", "tgt_tokens", "manifest")
# What each axis of each exported array holds; written into every manifest.
AXES = {kind: ["layer", "head", *axis_names(kind)] for kind in KINDS}


def package_version(name: str) -> str:
    """The installed version of a distribution, or "not installed"."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class AttentionExport:
    """Every attention map for one sentence pair, as numpy arrays, with token labels.

    ``encoder`` (L, H, S, S), ``decoder`` (L, H, T, T), ``cross`` (L, H, T, S), float32: rows are
    queries, columns are keys. ``tgt_ids`` is exactly the decoder input, starting with the start token.
    """

    encoder: np.ndarray
    decoder: np.ndarray | None  # None for an encoder-only model, like cross, tgt_ids, tgt_tokens
    cross: np.ndarray | None
    src_ids: np.ndarray
    tgt_ids: np.ndarray | None
    src_tokens: tuple[str, ...]
    tgt_tokens: tuple[str, ...] | None
    manifest: dict
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # further named arrays, e.g. a method's relevance

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of the .npz file: numbers, unicode strings and a JSON manifest; no objects.

        An encoder-only model's file holds ``encoder``, ``src_ids``, ``src_tokens`` and ``manifest``,
        and every file also holds ``extras`` under their own names.
        """
        arrays = {
            "encoder": self.encoder,
            "decoder": self.decoder,
            "cross": self.cross,
            "src_ids": self.src_ids,
            "tgt_ids": self.tgt_ids,
            "src_tokens": np.array(self.src_tokens, dtype=str),
            "tgt_tokens": None if self.tgt_tokens is None else np.array(self.tgt_tokens, dtype=str),
            "manifest": np.array(json.dumps(self.manifest, ensure_ascii=False)),
        }
        clash = sorted(set(arrays) & set(self.extras))
        if clash:
            raise ValueError(f"extra arrays may not reuse the export's own names {clash}")
        return {name: a for name, a in {**arrays, **self.extras}.items() if a is not None}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_bytes(self.to_bytes())  # bytes, so numpy does not append ".npz" to the name
        return path

    def to_bytes(self) -> bytes:
        """The .npz file's content (what `attnviz attention --out` writes)."""
        buf = io.BytesIO()
        np.savez_compressed(buf, **self.arrays())
        return buf.getvalue()


def load_export(path: str | Path) -> AttentionExport:
    """Read a file written by :meth:`AttentionExport.save` (never unpickles)."""
    with np.load(path, allow_pickle=False) as z:
        get = lambda name: z[name] if name in z.files else None  # noqa: E731
        return AttentionExport(
            encoder=z["encoder"],
            decoder=get("decoder"),
            cross=get("cross"),
            src_ids=z["src_ids"],
            tgt_ids=get("tgt_ids"),
            src_tokens=tuple(z["src_tokens"].tolist()),
            tgt_tokens=None if get("tgt_tokens") is None else tuple(z["tgt_tokens"].tolist()),
            manifest=json.loads(str(z["manifest"])),
            extras={name: z[name] for name in z.files if name not in STANDARD_ARRAYS},
        )


@dataclass(frozen=True)
class ForwardPass:
    """Every intermediate tensor of one teacher-forced forward pass, as recorded by the model.

    ``tensors`` maps point names (:mod:`attnviz.hooks`), such as ``encoder.0.attn.weights``, to
    float32 arrays without the batch axis; ``tgt_ids`` and ``tgt_tokens`` are None for an
    encoder-only model. The forward-pass walkthrough shows it stage by stage.
    """

    tensors: dict[str, np.ndarray]
    src_ids: tuple[int, ...]
    src_tokens: tuple[str, ...]
    tgt_ids: tuple[int, ...] | None
    tgt_tokens: tuple[str, ...] | None
