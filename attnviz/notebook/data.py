"""What a notebook view is given, as attnviz's own types: an export, a tiled export, or a decoding.

A view takes what attnviz returns ([`AttentionExport`][attnviz.export.AttentionExport],
[`TiledAttention`][attnviz.tiles.TiledAttention], a [`Decoding`][attnviz.decoding.Decoding]), an
attnviz model and a text, or plain data from another library:

- Hugging Face's ``outputs.attentions`` (and ``encoder_attentions``, ``decoder_attentions``,
  ``cross_attentions``): one (batch, heads, query, key) tensor per layer;
- a TransformerLens pattern: ``cache["pattern", layer]`` (batch, head, query_pos, key_pos) per layer
  in a list, or ``cache.stack_activation("pattern")`` (layer, batch, head, query_pos, key_pos);
- attnviz's own layout, one bare (layer, head, query, key) array. A bare 4-D array is always read so:
  one layer's (batch, heads, query, key) tensor goes in a list, ``[t]``.

Plain data becomes an [`AttentionExport`][attnviz.export.AttentionExport] with no ids, so every view reads
one type and names rows and columns one way (`attnviz.export.row_labels`). Shape letters: L layers,
B batch, H heads, Q queries, K keys.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np

from attnviz.errors import ExportError, InputError, describe
from attnviz.export import AttentionExport, check_sizes
from attnviz.kinds import KINDS, held_axes
from attnviz.tiles import TiledAttention

LONG_TOKENS = 1024  # a model's text longer than this is opened tile by tile (attnviz.tiles), not as whole maps
WEIGHT_SLACK = 1e-3  # post-softmax weights lie in 0..1; a little float error either side is allowed
# The most MB one kind's plain maps (all layers and heads of one text, as float32) may take: a view holds them
# whole, and GPT-2 medium's 24 layers x 16 heads at 1024 tokens take 1.5 GB. Past it, tiles (docs/notebooks.md).
MAX_PLAIN_MB = 2048


def shown(value) -> str:
    """``value`` for a message: its repr when short, else what `attnviz.errors.describe` says of it, so a message
    never grows with what it quotes (the tokens of a whole text, given as one of its tokens)."""
    if isinstance(value, str):
        return describe(value)  # "a string of 4,600 characters", not reprlib's cut "'the cat ...the mat'"
    text = reprlib.repr(value)
    return text if len(text) <= 40 else describe(value)


def _numpy(value, what: str) -> np.ndarray:
    """``value`` (a torch tensor on any device, numpy, nested lists) as float32 numpy; complex numbers refused, as
    converting them would keep the real part and only warn."""
    complex_ = InputError(f"{what} holds complex numbers: attention weights are real, in 0..1")
    if hasattr(value, "detach"):  # torch, without importing it here
        if value.is_complex():
            raise complex_
        if value.is_meta:
            raise InputError(f"{what} is a tensor on the meta device: a shape with no values (a model not loaded?)")
        if str(value.layout) != "torch.strided":  # sparse: the same numbers, one layer of one text at a time here
            value = value.to_dense()
        value = value.detach().float().cpu().numpy()
    try:
        array = np.asarray(value)
        real = array.dtype.kind != "c"
        if real:
            array = array.astype(np.float32, copy=False)
    except (TypeError, ValueError) as e:
        raise InputError(f"{what} must be numbers (tensors or arrays): {e}") from None
    if not real:
        raise complex_
    return array


def _shaped(value, what: str):
    """``value`` as it is when it has a shape (a tensor or an array: converted later, a layer at a time), else
    as float32 numpy (nested lists)."""
    return value if hasattr(value, "shape") and hasattr(value, "__getitem__") else _numpy(value, what)


def _check_size(shape: tuple[int, ...], what: str) -> None:
    """Nothing, or an InputError when (L, H, Q, K) float32 maps of ``shape`` would pass `MAX_PLAIN_MB`."""
    mb = 4 * math.prod(shape) / 2**20
    if mb > MAX_PLAIN_MB:
        L, H, Q, K = shape
        raise InputError(
            f"{what}: {L} layers x {H} heads of {Q} x {K} weights take {mb:,.0f} MB as float32, over the "
            f"{MAX_PLAIN_MB:,} MB a view holds whole: pass fewer layers (e.g. attentions[-4:]) or a shorter text. "
            "A long text opens tile by tile from its queries and keys: attnviz.tiled_attention (head_view(model, "
            "text) does so by itself), or an attnviz.tiles.TiledAttention of your own"
        )


def stack_layers(maps, what: str, batch: int | None = None) -> np.ndarray:
    """(L, H, Q, K) float32 from per-layer maps as other libraries give them.

    ``maps`` is a tuple or list with one entry per layer, each (B, H, Q, K) (Hugging Face,
    TransformerLens per layer) or (H, Q, K); or one array (L, B, H, Q, K) (TransformerLens'
    ``stack_activation``) or (L, H, Q, K) (attnviz's own layout). With a batch axis of more than one
    text, ``batch`` says which text (from 0); without it the maps are refused. A bare 4-D array has no
    batch axis, so ``batch`` with one is refused: one layer's (B, H, Q, K) tensor goes in a list, ``[t]``.
    Maps over `MAX_PLAIN_MB` are refused before any is converted; the rest are converted a layer at a
    time into one preallocated array, so the input is never copied whole more than once.
    """
    if isinstance(maps, (str, bytes)):  # numpy would read it as a 0-D array of text, and quote it whole
        raise InputError(
            f"{what} is {shown(maps)}, not maps: a text goes with an attnviz model (head_view(model, text)), and an "
            "exported file's path ends in .npz"
        )
    if isinstance(maps, Mapping):  # per-layer maps by name, or a model's whole output (a dict of its own)
        named = [repr(k) for k in maps if isinstance(k, str) and k.endswith("attentions")]
        where = (
            f"pass its {' or '.join(named)} (e.g. outputs.attentions; an encoder-decoder's go in encoder=, "
            "decoder=, cross=)"
            if named
            else "e.g. [maps[name] for name in the layers' names in order]"
        )
        raise InputError(
            f"{what} is a dict of {len(maps):,} key{'s' if len(maps) != 1 else ''}: a view takes one map per layer, "
            f"as a tuple or list in layer order; {where}"
        )
    if isinstance(maps, (tuple, list)):
        if not maps:
            raise InputError(
                f"{what}: no layers given (an empty tuple: was the model run with output_attentions=True?)"
            )
        missing = next((i for i, layer in enumerate(maps) if layer is None), None)
        if missing is not None:
            raise InputError(
                f"{what}[{missing}] is None: the model gave no weights for that layer. Fused attention kernels (SDPA, "
                'flash attention) compute none: load the model with attn_implementation="eager"'
            )
        layers = [_shaped(layer, f"{what}[{i}]") for i, layer in enumerate(maps)]
        shapes = [tuple(layer.shape) for layer in layers]
        other = next((i for i, shape in enumerate(shapes) if shape != shapes[0]), None)
        if other is not None:
            raise InputError(
                f"{what}: every layer's maps must have one shape; layer {other} (from 0) is {shapes[other]}, "
                f"layer 0 {shapes[0]}"
            )
        if len(shapes[0]) not in (3, 4):
            first = ", ".join(str(shape) for shape in shapes[:4])
            raise InputError(
                f"{what}: each layer must be (batch, heads, queries, keys) or (heads, queries, keys); got {first}"
            )
    else:
        array = _shaped(maps, what)
        shape = tuple(array.shape)
        if len(shape) in (4, 5) and shape[0] == 0:
            raise InputError(f"{what}: no layers given (an array of shape {shape}, with a layer axis of size 0)")
        if len(shape) == 4 and batch is not None:
            raise InputError(
                f"{what} is one 4-D array {shape}, which a view reads as (layers, heads, queries, keys) with no batch "
                f"axis, but batch={batch!r} was given: is it one layer's (batch, heads, queries, keys) tensor? Then "
                "pass it in a list, [t] (Hugging Face's outputs.attentions is a tuple of them), or every layer as "
                "one 5-D (layers, batch, heads, queries, keys) array"
            )
        if len(shape) not in (4, 5):
            raise InputError(
                f"{what} must be one map per layer: a tuple of (batch, heads, queries, keys) tensors (Hugging Face's "
                f"outputs.attentions), or one (layers, batch, heads, queries, keys) or (layers, heads, queries, keys) "
                f"array; got an array of shape {shape}"
            )
        layers = [array[i] for i in range(shape[0])]  # (B, H, Q, K) or (H, Q, K) each: views, not copies
        shapes = [shape[1:]] * shape[0]
    has_batch = len(shapes[0]) == 4
    n_texts = shapes[0][0] if has_batch else 1
    if n_texts == 0:
        raise InputError(f"{what}: the batch axis holds no texts (each layer is {shapes[0]}); a view shows one text")
    if batch is None:
        if n_texts != 1:
            raise InputError(
                f"{what} holds a batch of {n_texts} texts; a view shows one: pass batch=i (from 0 to {n_texts - 1}) "
                "with the tokens of that text"
            )
        batch = 0
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or not 0 <= batch < n_texts:
        raise InputError(f"batch must be a text's index from 0 to {n_texts - 1}; got {batch!r}")
    stacked_shape = (len(layers), *shapes[0][-3:])  # (L, H, Q, K)
    _check_size(stacked_shape, what)
    stacked = np.empty(stacked_shape, dtype=np.float32)
    for i, layer in enumerate(layers):
        stacked[i] = _numpy(layer[batch] if has_batch else layer, f"{what}[{i}]")  # one text of one layer
    return stacked


def _check_weights(maps: np.ndarray, what: str) -> None:
    if maps.size == 0:
        raise InputError(f"{what} is empty: shape {maps.shape}")
    if not all(np.isfinite(layer).all() for layer in maps):  # a layer at a time: no mask the size of every map
        raise InputError(f"{what} holds NaN or infinite values: these are not attention weights")
    low, high = float(maps.min()), float(maps.max())
    if low < -WEIGHT_SLACK or high > 1 + WEIGHT_SLACK:
        raise InputError(
            f"{what} holds values from {low:.3g} to {high:.3g}: attention weights (after the softmax) lie in 0..1; "
            "pass the pattern (weights), not the scores"
        )


ROW_SLACK = 1e-2  # a softmax row sums to 1; float16 maps of thousands of keys round to within a few 1e-4
NO_KEY = 1e-6  # a row summing to at most this is a query that saw no key (a padded or masked one), not a row of weights


def _check_rows(maps: np.ndarray, what: str, causal: bool = False) -> None:
    """Every row a query's weights: summing to 1, or to 0 where the query saw no key (a padded or masked one).
    A map given keys by queries (transposed) has columns that sum to 1, and is refused here, not drawn; so is a
    map no row of which sums to 1 (all zeros, or normalised over the whole map), and, in a decoder's (``causal``)
    maps, a row that sums to 0: a causal query always sees itself."""
    sums = maps.sum(axis=-1, dtype=np.float64)  # (L, H, Q)
    no_key = sums <= NO_KEY
    off = (np.abs(sums - 1) > ROW_SLACK) & ~no_key
    if off.any():
        where = tuple(int(i) for i in np.argwhere(off)[0])
        raise InputError(
            f"{what}: the row at index {where} sums to {float(sums[where]):.3g}, not 1; a view takes post-softmax "
            "weights with rows as queries and columns as keys (is the map transposed, normalised over the whole "
            "map, or taken in training mode?)"
        )
    blank = no_key.all(axis=-1)  # (L, H)
    if blank.any():
        layer, head = (int(i) for i in np.argwhere(blank)[0])
        raise InputError(
            f"{what}: every row of layer {layer}, head {head} (from 0) sums to 0: no query saw any key, so it holds "
            "no weights to draw (is it all zeros?)"
        )
    if causal and no_key.any():
        where = tuple(int(i) for i in np.argwhere(no_key)[0])
        raise InputError(
            f"{what}: the row at index {where} sums to 0, but a decoder's (causal) query sees at least itself, so "
            "each of its rows sums to 1 (was a padding query's row zeroed? pass the maps of the text without padding)"
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
        _check_rows(maps, what, causal=kind == "decoder")
        if kind == "decoder":
            _check_causal(maps, what)
    return export


def token_list(tokens, what: str) -> tuple[str, ...]:
    """``tokens`` as a tuple of strings, or an InputError: str() of ids, bytes or None would label a map with
    text the user never read ("tensor(101)", "b'a'")."""
    if isinstance(tokens, str):
        raise InputError(f"{what} must be a list of strings, one per position, not one string")
    if isinstance(tokens, (Mapping, Set)) or not isinstance(tokens, Iterable):  # a set or a dict: no positions
        raise InputError(
            f"{what} must be a list of strings, one per position; got {type(tokens).__name__} (a tokenizer's "
            "output? give tokenizer.convert_ids_to_tokens(ids))"
        )
    listed = tuple(tokens)
    for token in listed:
        if not isinstance(token, str):
            hint = (
                "one text's tokens, not a list per text (tokens[0]?)"
                if isinstance(token, (list, tuple))
                else "ids? give the tokenizer's tokens (e.g. tokenizer.convert_ids_to_tokens(ids))"
            )
            raise InputError(
                f"{what} must be a list of strings, one per position; one is {shown(token)} "
                f"({type(token).__name__}): {hint}"
            )
    return listed


def check_tiled(tiled: TiledAttention) -> TiledAttention:
    """``tiled`` itself, checked as an export is: per kind, float32 queries (L, H, Q, D) and keys (L, H_kv, K, D),
    finite, sharing L and D, with H a multiple of H_kv (grouped-query heads), as many queries and keys as its
    tokens, and one L for every kind; an InputError otherwise. `attnviz.api.tiled_attention` makes them so; one
    made by hand may not, and would be drawn with rows no token labels, or fail deep in a head's tile."""
    queries, keys = tiled.queries, tiled.keys
    if not isinstance(queries, dict) or not isinstance(keys, dict) or not queries or set(queries) != set(keys):
        raise InputError(
            "a TiledAttention's queries and keys must be dicts with the same kinds ('encoder', 'decoder', 'cross'); "
            f"got {sorted(queries) if isinstance(queries, dict) else queries!r} and "
            f"{sorted(keys) if isinstance(keys, dict) else keys!r}"
        )
    unknown = sorted(set(queries) - set(KINDS))
    if unknown:
        raise InputError(f"a TiledAttention's kinds are 'encoder', 'decoder' and 'cross'; got {', '.join(unknown)}")
    layers = {kind: _check_tiled_kind(tiled, kind) for kind in tiled.kinds}
    if len(set(layers.values())) > 1:
        raise InputError(f"every kind needs the same layers; this TiledAttention has {layers}")
    return tiled


def _check_tiled_kind(tiled: TiledAttention, kind: str) -> int:
    """L, after checking ``kind``'s queries and keys (`check_tiled`)."""
    what = f"the TiledAttention's {kind}"
    q, k = tiled.queries[kind], tiled.keys[kind]
    for name, array in (("queries", q), ("keys", k)):
        if not isinstance(array, np.ndarray) or array.dtype != np.float32:
            got = f"{array.dtype} array" if isinstance(array, np.ndarray) else type(array).__name__
            raise InputError(f"{what} {name} must be a float32 numpy array; got {got}")
        if array.ndim != 4 or 0 in array.shape:
            raise InputError(f"{what} {name} must be (layers, heads, {name}, dimensions); got shape {array.shape}")
        if not all(np.isfinite(layer).all() for layer in array):  # a layer at a time: no mask of them all
            raise InputError(f"{what} {name} hold NaN or infinite values")
    (L, H, Q, D), (L_k, H_kv, K, D_k) = q.shape, k.shape
    if L != L_k:
        raise InputError(f"{what} has {L} layers of queries but {L_k} of keys")
    if D != D_k:
        raise InputError(f"{what} has queries of {D} dimensions but keys of {D_k}: a score is their dot product")
    if H % H_kv:
        raise InputError(
            f"{what}: {H} query heads is not a multiple of its {H_kv} key heads (grouped-query attention shares "
            "each key head among H / H_kv query heads)"
        )
    sides = {"encoder": ("src_tokens", "src_tokens"), "decoder": ("tgt_tokens", "tgt_tokens")}
    rows, columns = sides.get(kind, ("tgt_tokens", "src_tokens"))  # cross: target rows, source columns
    for n, axis, side in ((Q, "queries", rows), (K, "keys", columns)):
        tokens = token_list(getattr(tiled, side), f"{what} maps' {side}")
        if len(tokens) != n:
            raise InputError(f"{what} has {n} {axis} but {len(tokens)} tokens in {side}: one token per position")
    return L


def _tokens(tokens, n: int, what: str, axis: str) -> tuple[str, ...]:
    if tokens is None:
        raise InputError(f"{what}: give the tokens of its {axis} ({n} of them)")
    tokens = token_list(tokens, f"{what}: tokens")
    if len(tokens) != n:
        raise InputError(f"{what} has {n} {axis} positions but {len(tokens)} tokens were given: one token per position")
    return tokens


def causal_heads(maps: np.ndarray) -> np.ndarray:
    """(L, H) bool: whether each map of (L, H, T, T) is exactly 0 above its diagonal (a decoder's, causal).
    One head at a time, so the check never copies every map."""
    L, H, Q, K = maps.shape
    if Q != K:
        return np.zeros((L, H), dtype=bool)
    return np.array([[not np.triu(maps[la, h], k=1).any() for h in range(H)] for la in range(L)], bool).reshape(L, H)


def is_causal(maps: np.ndarray) -> bool:
    """Whether every map (L, H, T, T) is exactly 0 above its diagonal: a decoder's (causal) self-attention."""
    return bool(causal_heads(maps).all())


def _first_not_causal(causal: np.ndarray) -> str:
    layer, head = (int(i) for i in np.argwhere(~causal)[0])
    return f"layer {layer}, head {head} (from 0)"


def _check_causal(maps: np.ndarray, what: str) -> None:
    causal = causal_heads(maps)
    if not causal.all():
        raise InputError(
            f"{what} have weight above the diagonal, first in {_first_not_causal(causal)}: a decoder's "
            "self-attention is causal"
        )


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
    the maps are a decoder's when every one is exactly 0 above its diagonal, an encoder's when none is,
    and refused when some are and some are not (a decoder's leaking head, or a mask gone wrong). An
    encoder-decoder: ``encoder`` (S, S), ``decoder`` (T, T) and ``cross`` (T, S) per layer, any of
    them, with ``src_tokens`` and ``tgt_tokens``, each given only when a map has its positions. Each
    map is as [`stack_layers`][attnviz.notebook.data.stack_layers] takes it.
    """
    if attentions is not None:
        if any(m is not None for m in (encoder, decoder, cross)):
            raise InputError("give either attentions (one model's self-attention) or encoder/decoder/cross, not both")
        if src_tokens is not None or tgt_tokens is not None:
            raise InputError(
                "attentions takes its tokens as tokens=; src_tokens and tgt_tokens go with encoder=, decoder=, cross="
            )
        if kind not in ("auto", "encoder", "decoder"):
            raise InputError(f"kind must be 'auto', 'encoder' or 'decoder'; got {kind!r}")
        maps = stack_layers(attentions, "attentions", batch)
        _check_weights(maps, "attentions")
        if maps.shape[-1] != maps.shape[-2]:
            raise InputError(
                f"attentions are self-attention, one token per query and key, but the maps are {maps.shape[-2]} x "
                f"{maps.shape[-1]}; for cross-attention pass encoder=, decoder=, cross= with src_tokens and tgt_tokens"
            )
        causal = causal_heads(maps)
        if kind == "auto" and causal.any() and not causal.all():
            raise InputError(
                f"attentions: some maps are 0 above the diagonal (a decoder's) and some are not, first "
                f"{_first_not_causal(causal)}: a decoder's maps are all causal. Pass kind='encoder' if they are an "
                "encoder's; else fix that map's mask (a padding query's row spread over every key?)"
            )
        if kind == "auto":
            kind = "decoder" if causal.all() else "encoder"
        if kind == "decoder" and not causal.all():
            raise InputError(
                f"kind='decoder' but these maps have weight above the diagonal, first {_first_not_causal(causal)}: "
                "they are not causal"
            )
        _check_rows(maps, "attentions", causal=kind == "decoder")
        toks = _tokens(tokens, maps.shape[-1], "attentions", "query and key")
        if kind == "decoder":
            return _export(None, maps, None, None, toks, "a language model's self-attention, from plain data")
        return _export(maps, None, None, toks, None, "an encoder's self-attention, from plain data")
    if tokens is not None and encoder is None and decoder is None and cross is None:
        raise InputError(
            "the maps are None, beside tokens: was the model run with output_attentions=True? (Hugging Face's "
            "outputs.attentions is None without it) Pass its maps with the tokens"
        )
    if tokens is not None:
        raise InputError("tokens goes with attentions; an encoder-decoder takes src_tokens and tgt_tokens")
    if encoder is None and decoder is None and cross is None:
        raise InputError(
            "no maps given: pass attentions (e.g. outputs.attentions) with tokens, or encoder=, decoder=, cross= with "
            "src_tokens and tgt_tokens"
        )
    if src_tokens is not None and encoder is None and cross is None:
        raise InputError("src_tokens label the source, which only encoder= and cross= maps have: give them or neither")
    if tgt_tokens is not None and decoder is None and cross is None:
        raise InputError(
            "tgt_tokens label the decoder input, which only decoder= and cross= maps have: give them or neither"
        )
    stacked = {
        name: None if value is None else stack_layers(value, name, batch)
        for name, value in (("encoder", encoder), ("decoder", decoder), ("cross", cross))
    }
    for name, maps in stacked.items():
        if maps is not None:
            _check_weights(maps, name)
    S = T = None
    if stacked["encoder"] is not None:
        S = _square(stacked["encoder"], "encoder")
    if stacked["decoder"] is not None:
        T = _square(stacked["decoder"], "decoder")
        causal = causal_heads(stacked["decoder"])
        if not causal.all():
            raise InputError(
                f"decoder self-attention must be causal (0 above the diagonal); these maps are not, first "
                f"{_first_not_causal(causal)}"
            )
    for name, maps in stacked.items():
        if maps is not None:
            _check_rows(maps, name, causal=name == "decoder")
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
    held = [kind for kind, maps in zip(KINDS, (encoder, decoder, cross), strict=True) if maps is not None]
    manifest = {
        "model": what,
        "axes": held_axes(held),
        "note": "rows are queries, columns are keys; weights are post-softmax",
    }
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


def is_export_path(data) -> bool:
    """Whether ``data`` names an exported .npz file: a path object, or a string ending in ".npz"."""
    return (isinstance(data, str) and data.endswith(".npz")) or hasattr(data, "__fspath__")


def as_source(data=None, tokens=None, *, text=None, tgt=None, generate: int = 0, batch=None, kind="auto", **plain):
    """A [`Source`][attnviz.notebook.data.Source] from anything a view takes (the module's docstring lists them)."""
    from attnviz.export import load_export

    if _is_bundle(data):
        if tokens is not None and text is not None:
            raise InputError("the text twice: give a model's text as the second argument or as text=, not both")
        if plain:
            raise InputError(f"a model runs on its text: give no maps or tokens beside it ({', '.join(plain)})")
        if batch is not None:
            raise InputError("batch picks one text of plain maps; a model holds one text already")
        return from_model(bundle=data, text=text if text is not None else tokens, tgt=tgt, generate=generate)
    given = (("text", text is not None), ("tgt", tgt is not None), ("generate", generate != 0))
    unused = [name for name, is_given in given if is_given]
    if unused:
        raise InputError(
            f"{', '.join(unused)} go only with an attnviz model (head_view(model, text)): these maps are drawn as "
            "they are; give none of them"
        )
    if isinstance(data, (Source, AttentionExport, TiledAttention)) or is_export_path(data):
        if tokens is not None or plain:  # a path as an object: its own tokens and maps, never others beside them
            raise InputError("an attnviz export carries its own tokens: pass it alone")
        if batch is not None:
            raise InputError("batch picks one text of plain maps; an export holds one text already")
        if isinstance(data, Source):
            return data
        if isinstance(data, TiledAttention):
            return Source(check_tiled(data))
        return Source(check_export(data if isinstance(data, AttentionExport) else load_export(data)))
    return Source(plain_export(data, tokens, batch=batch, kind=kind, **plain))
