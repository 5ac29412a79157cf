"""What every contribution method shares: its result, the kinds a model has, and input checks.

A method takes the model and one sentence pair as token ids, ``src`` (1, S) and ``tgt`` (1, T) (the
decoder input, starting with the start token; None for an encoder-only model; a language model
reads no ``src``, None, and its prompt as ``tgt``), and returns a
`Contributions`: per kind of attention a float32 array shaped like the maps, (L, H, Q, K)
per head or (L, Q, K) per layer, rows queries and columns keys, plus any further named arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torch import Tensor, nn

from attnviz.errors import InputError
from attnviz.kinds import KINDS
from attnviz.model import MultiHeadAttention, Transformer


@dataclass(frozen=True)
class Contributions:
    """A method's numbers for one sentence pair.

    ``maps``: kind -> float32 array, (L, H, Q, K) or (L, Q, K); only the kinds the model has (and
    the decoder input allows). ``extras``: further named arrays, e.g. propagated relevance.
    ``notes``: JSON-able facts about this run for the export's manifest (e.g. the token explained).
    """

    maps: dict[str, np.ndarray]
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    notes: dict = field(default_factory=dict)


def kinds_of(model: Transformer, tgt: Tensor | None) -> tuple[str, ...]:
    """The kinds of attention a forward pass on (src, tgt) runs: the encoder's, and the decoder's with a
    target; a language model's decoder alone."""
    if model.cfg.decoder_only:
        return ("decoder",)
    if tgt is None or model.cfg.encoder_only:
        return ("encoder",)
    return KINDS


def n_layers(model: Transformer, kind: str) -> int:
    return model.cfg.n_layers_of(kind)


def layer_module(model: Transformer, kind: str, layer: int) -> nn.Module:
    """The EncoderLayer or DecoderLayer holding the attention of ``kind`` in ``layer`` (from 0)."""
    return model.encoder_layers[layer] if kind == "encoder" else model.decoder_layers[layer]


def attention_module(model: Transformer, kind: str, layer: int) -> MultiHeadAttention:
    """The attention module of ``kind`` in ``layer`` (from 0)."""
    block = layer_module(model, kind, layer)
    if kind == "encoder":
        return block.self_attn
    return block.self_attn if kind == "decoder" else block.cross_attn


def check_pair(model: Transformer, src: Tensor | None, tgt: Tensor | None, needs_target: bool = False) -> None:
    """InputError unless ``src`` is (1, S) and ``tgt`` (1, T) or None; methods explain one sentence at a time.

    A language model reads no ``src`` (None) and its prompt as ``tgt``.
    """
    if model.cfg.decoder_only:
        if src is not None or tgt is None or tgt.dim() != 2 or tgt.shape[0] != 1 or tgt.shape[1] == 0:
            raise InputError("a language model's method explains one prompt: src None and tgt shaped (1, T)")
        return
    if src is None:
        raise InputError("this model reads a source sentence: src must be shaped (1, S), not None")
    if src.dim() != 2 or src.shape[0] != 1 or src.shape[1] == 0:
        raise InputError(f"a method explains one sentence: src must be shaped (1, S), got {tuple(src.shape)}")
    if tgt is not None and (model.cfg.encoder_only or tgt.dim() != 2 or tgt.shape[0] != 1 or tgt.shape[1] == 0):
        if model.cfg.encoder_only:
            raise InputError("this model is encoder-only: it takes no decoder input")
        raise InputError(f"the decoder input must be shaped (1, T), got {tuple(tgt.shape)}")
    if needs_target and tgt is None:
        raise InputError(
            "this method explains a prediction of the decoder"
            + (": this model is encoder-only and has none" if model.cfg.encoder_only else "; give a decoder input")
        )


def as_float32(tensor: Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()
