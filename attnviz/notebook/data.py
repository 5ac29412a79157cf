"""What a notebook view is given, as attnviz's own types: an export, a tiled export, or a decoding.

A view takes what attnviz returns ([`AttentionExport`][attnviz.export.AttentionExport],
[`TiledAttention`][attnviz.tiles.TiledAttention], a [`Decoding`][attnviz.decoding.Decoding]), an
attnviz model and a text, or plain data from another library:

- Hugging Face's ``outputs.attentions`` (and ``encoder_attentions``, ``decoder_attentions``,
  ``cross_attentions``): one (batch, heads, query, key) tensor per layer;
- a TransformerLens pattern: ``cache["pattern", layer]`` (batch, head, query_pos, key_pos) per layer
  in a list, or ``cache.stack_activation("pattern")`` (layer, batch, head, query_pos, key_pos).

Plain data becomes an [`AttentionExport`][attnviz.export.AttentionExport] with no ids, so every view reads
one type and names rows and columns one way (`attnviz.export.row_labels`). Shape letters: L layers,
B batch, H heads, Q queries, K keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnviz.errors import ExportError, InputError
from attnviz.export import AXES, AttentionExport, check_sizes
from attnviz.kinds import KINDS
from attnviz.tiles import TiledAttention

LONG_TOKENS = 1024  # a model's text longer than this is opened tile by tile (attnviz.tiles), not as whole maps
WEIGHT_SLACK = 1e-3  # post-softmax weights lie in 0..1; a little float error either side is allowed


def _numpy(value, what: str) -> np.ndarray:
    """``value`` (a torch tensor on any device, numpy, nested lists) as float32 numpy."""
    if hasattr(value, "detach"):  # torch, without importing it here
        value = value.detach().float().cpu().numpy()
    try:
        array = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise InputError(f"{what} must be numbers (tensors or arrays): {e}") from None
    return array


def stack_layers(maps, what: str, batch: int | None = None) -> np.ndarray:
    """(L, H, Q, K) float32 from per-layer maps as other libraries give them.

    ``maps`` is a tuple or list with one entry per layer, each (B, H, Q, K) (Hugging Face,
    TransformerLens per layer) or (H, Q, K); or one array (L, B, H, Q, K) (TransformerLens'
    ``stack_activation``) or (L, H, Q, K) (attnviz's own layout). With a batch axis of more than one
    text, ``batch`` says which text (from 0); without it the maps are refused.
    """
    if isinstance(maps, (tuple, list)):
        if not maps:
            raise InputError(
                f"{what}: no layers given (an empty tuple: was the model run with output_attentions=True?)"
            )
        layers = [_numpy(layer, f"{what}[{i}]") for i, layer in enumerate(maps)]
        other = next((i for i, layer in enumerate(layers) if layer.shape != layers[0].shape), None)
        if other is not None:
            raise InputError(
                f"{what}: every layer's maps must have one shape; layer {other} (from 0) is {layers[other].shape}, "
                f"layer 0 {layers[0].shape}"
            )
        ranks = {layer.ndim for layer in layers}
        if ranks == {4}:
            array = np.stack(layers, axis=0)  # (L, B, H, Q, K)
        elif ranks == {3}:
            array = np.stack(layers, axis=0)[:, None]  # (L, 1, H, Q, K)
        else:
            shapes = ", ".join(str(layer.shape) for layer in layers[:4])
            raise InputError(
                f"{what}: each layer must be (batch, heads, queries, keys) or (heads, queries, keys); got {shapes}"
            )
    else:
        array = _numpy(maps, what)
        if array.ndim == 4:
            array = array[:, None]
        elif array.ndim != 5:
            raise InputError(
                f"{what} must be one map per layer: a tuple of (batch, heads, queries, keys) tensors (Hugging Face's "
                f"outputs.attentions), or one (layers, batch, heads, queries, keys) or (layers, heads, queries, keys) "
                f"array; got an array of shape {array.shape}"
            )
    n_texts = array.shape[1]
    if batch is None:
        if n_texts != 1:
            raise InputError(
                f"{what} holds a batch of {n_texts} texts; a view shows one: pass batch=i (from 0 to {n_texts - 1}) "
                "with the tokens of that text"
            )
        batch = 0
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or not 0 <= batch < n_texts:
        raise InputError(f"batch must be a text's index from 0 to {n_texts - 1}; got {batch!r}")
    return np.ascontiguousarray(array[:, batch])


def _check_weights(maps: np.ndarray, what: str) -> None:
    if maps.size == 0:
        raise InputError(f"{what} is empty: shape {maps.shape}")
    if not np.isfinite(maps).all():
        raise InputError(f"{what} holds NaN or infinite values: these are not attention weights")
    low, high = float(maps.min()), float(maps.max())
    if low < -WEIGHT_SLACK or high > 1 + WEIGHT_SLACK:
        raise InputError(
            f"{what} holds values from {low:.3g} to {high:.3g}: attention weights (after the softmax) lie in 0..1; "
            "pass the pattern (weights), not the scores"
        )


ROW_SLACK = 1e-2  # a softmax row sums to 1; float16 maps of thousands of keys round to within a few 1e-4


def _check_rows(maps: np.ndarray, what: str) -> None:
    """Every row a query's weights: summing to 1, or to 0 where the query saw no key (a padded or masked one).
    A map given keys by queries (transposed) has columns that sum to 1, and is refused here, not drawn."""
    sums = maps.sum(axis=-1, dtype=np.float64)
    off = (np.abs(sums - 1) > ROW_SLACK) & (sums > ROW_SLACK)
    if off.any():
        where = tuple(int(i) for i in np.argwhere(off)[0])
        raise InputError(
            f"{what}: the row at index {where} sums to {float(sums[where]):.3g}, not 1; a view takes post-softmax "
            "weights with rows as queries and columns as keys (is the map transposed, or taken in training mode?)"
        )


def check_export(export: AttentionExport) -> AttentionExport:
    """``export`` itself, checked as plain maps are: weights in 0..1, finite, rows summing to 1, a causal
    decoder, and as many tokens as each map's axes (`attnviz.export.check_sizes`); an InputError otherwise."""
    method = export.manifest.get("method")
    if method is not None:
        raise InputError(
            f"this export holds the {method!r} method's maps, not attention weights: the views draw weights; "
            "attnviz.figures.contributions.contribution_heatmap draws a method's maps"
        )
    try:
        check_sizes(export, "the export")
    except ExportError as e:
        raise InputError(str(e)) from None
    for kind in KINDS:
        maps = getattr(export, kind)
        if maps is None:
            continue
        what = f"the export's {kind} maps"
        if np.ndim(maps) != 4:
            raise InputError(f"{what} must be (layers, heads, queries, keys); got shape {np.shape(maps)}")
        _check_weights(maps, what)
        _check_rows(maps, what)
        if kind == "decoder" and not is_causal(maps):
            raise InputError(f"{what} have weight above the diagonal: a decoder's self-attention is causal")
    return export


def _tokens(tokens, n: int, what: str, axis: str) -> tuple[str, ...]:
    if tokens is None:
        raise InputError(f"{what}: give the tokens of its {axis} ({n} of them)")
    if isinstance(tokens, str):
        raise InputError(f"{what}: tokens must be a list of strings, one per position, not one string")
    tokens = tuple(str(t) for t in tokens)
    if len(tokens) != n:
        raise InputError(f"{what} has {n} {axis} positions but {len(tokens)} tokens were given: one token per position")
    return tokens


def is_causal(maps: np.ndarray) -> bool:
    """Whether every map (L, H, T, T) is exactly 0 above its diagonal: a decoder's (causal) self-attention."""
    return maps.shape[-1] == maps.shape[-2] and not np.triu(maps, k=1).any()


def plain_export(
    attentions=None,
    tokens: Sequence[str] | None = None,
    *,
    encoder=None,
    decoder=None,
    cross=None,
    src_tokens: Sequence[str] | None = None,
    tgt_tokens: Sequence[str] | None = None,
    kind: str = "auto",
    batch: int | None = None,
) -> AttentionExport:
    """An [`AttentionExport`][attnviz.export.AttentionExport] of plain maps from another library.

    One model's self-attention (``attentions`` with ``tokens``): a decoder-only model's
    (``kind="decoder"``) or an encoder's such as BERT (``kind="encoder"``); with ``kind="auto"``
    maps that are exactly 0 above the diagonal are a decoder's. An encoder-decoder: ``encoder``
    (S, S), ``decoder`` (T, T) and ``cross`` (T, S) per layer, any of them, with ``src_tokens``
    and ``tgt_tokens``. Each map is as [`stack_layers`][attnviz.notebook.data.stack_layers] takes it.
    """
    if attentions is not None:
        if any(m is not None for m in (encoder, decoder, cross)):
            raise InputError("give either attentions (one model's self-attention) or encoder/decoder/cross, not both")
        maps = stack_layers(attentions, "attentions", batch)
        if kind not in ("auto", "encoder", "decoder"):
            raise InputError(f"kind must be 'auto', 'encoder' or 'decoder'; got {kind!r}")
        _check_weights(maps, "attentions")
        _check_rows(maps, "attentions")
        if maps.shape[-1] != maps.shape[-2]:
            raise InputError(
                f"attentions are self-attention, one token per query and key, but the maps are {maps.shape[-2]} x "
                f"{maps.shape[-1]}; for cross-attention pass encoder=, decoder=, cross= with src_tokens and tgt_tokens"
            )
        if kind == "auto":
            kind = "decoder" if is_causal(maps) else "encoder"
        if kind == "decoder" and not is_causal(maps):
            raise InputError("kind='decoder' but these maps have weight above the diagonal: they are not causal")
        toks = _tokens(tokens, maps.shape[-1], "attentions", "query and key")
        if kind == "decoder":
            return _export(None, maps, None, None, toks, "a language model's self-attention, from plain data")
        return _export(maps, None, None, toks, None, "an encoder's self-attention, from plain data")
    if tokens is not None:
        raise InputError("tokens goes with attentions; an encoder-decoder takes src_tokens and tgt_tokens")
    if encoder is None and decoder is None and cross is None:
        raise InputError(
            "no maps given: pass attentions (e.g. outputs.attentions) with tokens, or encoder=, decoder=, cross= with "
            "src_tokens and tgt_tokens"
        )
    stacked = {
        name: None if value is None else stack_layers(value, name, batch)
        for name, value in (("encoder", encoder), ("decoder", decoder), ("cross", cross))
    }
    for name, maps in stacked.items():
        if maps is not None:
            _check_weights(maps, name)
            _check_rows(maps, name)
    S = T = None
    if stacked["encoder"] is not None:
        S = _square(stacked["encoder"], "encoder")
    if stacked["decoder"] is not None:
        T = _square(stacked["decoder"], "decoder")
        if not is_causal(stacked["decoder"]):
            raise InputError("decoder self-attention must be causal (0 above the diagonal); these maps are not")
    if stacked["cross"] is not None:
        T_cross, S_cross = stacked["cross"].shape[-2:]
        for name, want, got in (("decoder", T, T_cross), ("encoder", S, S_cross)):
            if want is not None and want != got:
                raise InputError(f"cross-attention is {T_cross} x {S_cross} but the {name} has {want} positions")
        S, T = S_cross, T_cross
    src = None if S is None else _tokens(src_tokens, S, "the encoder-decoder's maps", "source")
    tgt = None if T is None else _tokens(tgt_tokens, T, "the encoder-decoder's maps", "target (decoder input)")
    return _export(
        stacked["encoder"], stacked["decoder"], stacked["cross"], src, tgt, "an encoder-decoder, from plain data"
    )


def _square(maps: np.ndarray, name: str) -> int:
    Q, K = maps.shape[-2:]
    if Q != K:
        raise InputError(f"{name} self-attention must be square (as many queries as keys); got {Q} x {K}")
    return Q


def _export(encoder, decoder, cross, src_tokens, tgt_tokens, what: str) -> AttentionExport:
    shapes = [m.shape[:2] for m in (encoder, decoder, cross) if m is not None]
    if len(set(shapes)) > 1:
        raise InputError(
            f"every kind of map needs the same layers and heads; got (layers, heads) {sorted(set(shapes))}"
        )
    manifest = {"model": what, "axes": AXES, "note": "rows are queries, columns are keys; weights are post-softmax"}
    return AttentionExport(encoder, decoder, cross, None, None, src_tokens, tgt_tokens, manifest)


@dataclass(frozen=True)
class Source:
    """What a head or model view draws: an export (whole maps) or tiles, and the same maps over words."""

    pieces: AttentionExport | TiledAttention
    words: AttentionExport | None = None  # the maps over words (attnviz.words), when the words are known

    @property
    def tiled(self) -> bool:
        return isinstance(self.pieces, TiledAttention)

    @property
    def kinds(self) -> list[str]:
        if self.tiled:
            return self.pieces.kinds
        return [k for k in KINDS if getattr(self.pieces, k) is not None]

    def shape(self, kind: str) -> tuple[int, int, int, int]:
        """(L, H, Q, K) of ``kind``'s maps over pieces."""
        if self.tiled:
            return self.pieces.shape(kind)
        return getattr(self.pieces, kind).shape


def _is_bundle(value) -> bool:
    from attnviz.checkpoints.bundle import Bundle

    return isinstance(value, Bundle)


def from_model(bundle, text: str, tgt: str | None = None, generate: int = 0) -> Source:
    """A source from an attnviz model and a text: whole maps and words, or tiles past `LONG_TOKENS` tokens."""
    from attnviz import api

    if not isinstance(text, str):
        raise InputError(f"a model needs a text (a string) to run on; got {type(text).__name__}")
    n_tokens, _ = api.maps_size(bundle, text, tgt, generate)
    if n_tokens + generate > LONG_TOKENS:
        return Source(api.tiled_attention(bundle, text, tgt, generate=generate))
    pieces = api.attention(bundle, text, tgt, generate=generate)
    words = api.attention(bundle, text, tgt, generate=generate, words=True)
    return Source(pieces, words)


def as_source(data=None, tokens=None, *, text=None, tgt=None, generate: int = 0, batch=None, kind="auto", **plain):
    """A [`Source`][attnviz.notebook.data.Source] from anything a view takes (the module's docstring lists them)."""
    from attnviz.export import load_export

    if isinstance(data, Source):
        return data
    if isinstance(data, (AttentionExport, TiledAttention)):
        if tokens is not None or plain:
            raise InputError("an attnviz export carries its own tokens: pass it alone")
        return Source(data if isinstance(data, TiledAttention) else check_export(data))
    if _is_bundle(data):
        return from_model(bundle=data, text=text if text is not None else tokens, tgt=tgt, generate=generate)
    if (isinstance(data, str) and data.endswith(".npz")) or hasattr(data, "__fspath__"):
        return Source(check_export(load_export(data)))
    return Source(plain_export(data, tokens, batch=batch, kind=kind, **plain))
