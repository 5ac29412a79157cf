"""Summaries of attention maps: head averages, attention rollout, per-head statistics, exports.

Everything here takes plain numpy arrays and token lists (the data of
[`attnviz.api.AttentionExport`][]) and returns numpy arrays or pandas DataFrames; nothing needs
torch, a model or Streamlit. Maps are per head and post-softmax, rows are queries and columns are
keys, as in the export: ``encoder`` (L, H, S, S), ``decoder`` (L, H, T, T), ``cross`` (L, H, T, S).

Shape letters: L layers, H heads, Q queries, K keys, S source length, T target (decoder input) length.
Layers and heads are numbered from 1 in every DataFrame, as in the app; token positions from 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from attnviz.kinds import KINDS, causal_mask

# What `mean_distance` measures for each kind of map; also in the `distance_note` attribute of the
# DataFrame `head_statistics` returns, so a page or a CSV export can show it beside the numbers.
DISTANCE_NOTES = {
    "encoder": "mean |query position - key position|, in source tokens",
    "decoder": "mean |query position - key position|, in target tokens (keys at or before the query)",
    "cross": (
        "target and source positions do not correspond one to one, so each query position t is first "
        "mapped onto the source axis, t * (S - 1) / (T - 1), the straight line from the first to the "
        "last token of both; the distance is |mapped position - key position|, in source tokens. "
        "It measures how far a head strays from a monotone, length-proportional alignment, "
        "not a distance between the words themselves"
    ),
}

# Row sums of a post-softmax map are 1, or 0 for a query whose every key is masked (the model's rule);
# float32 sums over a few hundred keys stay far inside this tolerance.
_ROW_SUM_TOLERANCE = 1e-3


def _check_head_axis(maps: np.ndarray) -> np.ndarray:
    maps = np.asarray(maps)
    if maps.ndim not in (3, 4):
        raise ValueError(
            f"expected attention maps of shape (layers, heads, query, key) or (heads, query, key), "
            f"got an array of shape {maps.shape}"
        )
    if maps.shape[-3] == 0:
        raise ValueError(f"the maps have no heads (shape {maps.shape}); there is nothing to combine")
    return maps


def head_mean(maps: np.ndarray) -> np.ndarray:
    """The mean over heads of (L, H, Q, K) or (H, Q, K) maps: (L, Q, K) or (Q, K).

    Each row is still a probability distribution over keys (a mean of distributions), and it is what
    the layer would attend with if its heads' outputs were weighted equally, which they are not: the
    output projection mixes heads with learned weights, and the values differ per head. The mean also
    hides disagreement: a head looking left and one looking right average to a blur that no head
    shows. Look at single heads, or at `head_max`, before reading much into a mean.
    """
    return _check_head_axis(maps).mean(axis=-3)


def head_max(maps: np.ndarray) -> np.ndarray:
    """The largest weight any head gives each (query, key) pair: (L, Q, K) or (Q, K).

    Use it to find where some head attends strongly, whichever head that is. It is not attention:
    rows do not sum to 1 (anything from 1 to the number of heads), so it cannot be used as weights,
    rolled out or fed to `head_statistics`, and it cannot tell one sharp head from several.
    """
    return _check_head_axis(maps).max(axis=-3)


def attention_rollout(encoder_maps: np.ndarray, add_residual: bool = True) -> np.ndarray:
    """The rollout of encoder self-attention up to and including each layer: (L, S, S), float64.

    Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers",
    arXiv:2005.00928, section 3). Per layer l, with W_l the mean of its heads' maps:

    ```text
    A_l = normalise_rows(0.5 * W_l + 0.5 * I)     (I only with add_residual)
    rollout_1 = A_1,    rollout_l = A_l @ rollout_{l-1}
    ```

    Row q of ``result[l - 1]`` says how much of the representation at source position q after layer
    l comes from each input token (rows: queries of layer l; columns: input tokens, the embeddings
    before layer 1). Each row sums to 1; a row of zeros (a fully masked query) stays zero without
    the residual.

    The 0.5 * I stands for the residual connection around each attention sub-layer, weighting the
    skip path and the attention path equally. Rollout assumes information mixes linearly through the
    attention weights alone: it ignores the values and output projection (a head that attends to a
    token but writes nothing from it still counts), the feed-forward sub-layers, LayerNorm, and the
    real relative size of the residual stream. It is a picture of possible token mixing, not an
    attribution of the model's output.
    """
    maps = np.asarray(encoder_maps)
    if maps.ndim != 4 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(
            f"attention rollout needs encoder self-attention maps of shape (layers, heads, S, S), got {maps.shape}"
        )
    n_layers, _, n_tokens, _ = maps.shape
    mixing = head_mean(maps).astype(np.float64)  # (L, S, S)
    if add_residual:
        mixing = 0.5 * mixing + 0.5 * np.eye(n_tokens)
    sums = mixing.sum(axis=-1, keepdims=True)
    mixing = np.divide(mixing, sums, out=np.zeros_like(mixing), where=sums > 0)
    rollout = np.empty((n_layers, n_tokens, n_tokens))
    flow = np.eye(n_tokens)
    for layer in range(n_layers):
        flow = mixing[layer] @ flow  # later layers on the left: rows are this layer's queries
        rollout[layer] = flow
    return rollout


def _check_maps(maps: np.ndarray, query_tokens: Sequence[str], key_tokens: Sequence[str]) -> np.ndarray:
    maps = np.asarray(maps)
    if maps.ndim != 4:
        raise ValueError(f"expected attention maps of shape (layers, heads, query, key), got {maps.shape}")
    n_queries, n_keys = maps.shape[-2:]
    if n_queries != len(query_tokens):
        raise ValueError(
            f"the maps have {n_queries} query rows but {len(query_tokens)} query tokens were given; "
            f"pass the tokens of the query axis (rows)"
        )
    if n_keys != len(key_tokens):
        raise ValueError(
            f"the maps have {n_keys} key columns but {len(key_tokens)} key tokens were given; "
            f"pass the tokens of the key axis (columns)"
        )
    return maps


def aligned_keys(n_queries: int, n_keys: int, kind: str) -> np.ndarray:
    """Float key position each query lines up with: itself for self-attention, the scaled diagonal for cross."""
    positions = np.arange(n_queries, dtype=np.float64)
    if kind != "cross":
        return positions
    if n_queries == 1:
        return np.zeros(1)
    return positions * (n_keys - 1) / (n_queries - 1)


def _mean_over(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Mean of (L, H, Q) ``values`` over the queries where ``rows`` (Q,) is True; NaN if there are none."""
    if not rows.any():
        return np.full(values.shape[:2], np.nan)
    return values[..., rows].mean(axis=-1)


def head_statistics(
    maps: np.ndarray, query_tokens: Sequence[str], key_tokens: Sequence[str], kind: str
) -> pd.DataFrame:
    """One row of summary numbers per (layer, head) of one kind of attention map.

    ``maps`` is (L, H, Q, K), ``kind`` one of ``"encoder"``, ``"decoder"``, ``"cross"``, and the
    token lists label the query rows and key columns. Columns (``layer`` and ``head`` from 1; every
    other column a mean over the real query rows, those with any weight, so a fully masked query is
    left out):

    - ``entropy``: -sum_k p log p, in nats (0 log 0 = 0). Low is sharp, log(K) is uniform.
    - ``entropy_norm``: entropy / log(number of keys the query may attend to): K for the encoder and
      cross-attention, t + 1 for decoder query t (causal mask). 1 is uniform over the allowed keys;
      a query with one allowed key has no choice and contributes 0.
    - ``mean_distance``: sum_k p |aligned(q) - k|; see ``DISTANCE_NOTES`` and the frame's
      ``attrs["distance_note"]``. For self-attention aligned(q) = q, in tokens; for cross-attention
      the query position is scaled onto the source axis, aligned(t) = t (S - 1) / (T - 1).
    - ``diagonal``: weight on the aligned key, round(aligned(q)) rounded half up: the query itself
      for self-attention, the scaled diagonal for cross-attention.
    - ``previous``: weight on the key just before the aligned one, over the queries that have one
      (query 0 of self-attention has no previous token), so a previous-token head scores 1.
    - ``first``: weight on key 0 (the first source token, or ``<s>`` for the decoder).
    - ``end``: weight on the last key, which on the source side is the end token ``</s>``. NaN for
      decoder self-attention: the decoder input ``<s> pieces`` holds no end token, and only the last
      query may see its last key.
    - ``bos``: decoder self-attention only (NaN for the other kinds), the weight on key 0: the start
      token, a language model's BOS, or, for a model without one (GPT-2), the prompt's first token.
      A head with most of its weight there uses it as an attention sink (Xiao et al., 2023): it
      parks its weight where it changes the output least. Equal to ``first`` for the decoder,
      named for what it is there.
    - ``induction``: decoder self-attention only, over the queries whose token occurred before
      (`induction_targets`), the weight on the token right after its latest earlier occurrence:
      what an induction head attends to, to copy it (Olsson et al., 2022). On a text that repeats no
      token, and for the other kinds, NaN. The atlas measures it on repeated random tokens instead
      (`repeat_scores`); here it is measured on the text itself.

    Raises ValueError when the shape, the tokens or the kind do not fit, when rows are not
    distributions (sum 1, or 0 when fully masked: not a `head_max` map), or when a decoder
    map puts weight on future keys.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    maps = _check_maps(maps, query_tokens, key_tokens)
    n_layers, n_heads, n_queries, n_keys = maps.shape
    if kind != "cross" and n_queries != n_keys:
        raise ValueError(f"{kind} self-attention maps must be square, got {n_queries} queries and {n_keys} keys")
    if kind == "encoder" and tuple(query_tokens) != tuple(key_tokens):
        raise ValueError("encoder self-attention has the source tokens on both axes; the two token lists differ")
    weights = maps.astype(np.float64)  # (L, H, Q, K)
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise ValueError("attention weights must be finite and non-negative (post-softmax maps)")
    row_sums = weights.sum(axis=-1)  # (L, H, Q)
    if not (np.isclose(row_sums, 1.0, atol=_ROW_SUM_TOLERANCE) | (row_sums == 0)).all():
        raise ValueError(
            "every query row must sum to 1 (or 0 when fully masked): pass per-head post-softmax maps "
            "or head_mean, not head_max or a rollout of another kind"
        )
    if kind == "decoder" and weights[..., ~causal_mask(*weights.shape[-2:])].max(initial=0.0) > _ROW_SUM_TOLERANCE:
        raise ValueError("decoder self-attention must be causal, but these maps put weight on later positions")

    # Queries are "real" if any head of any layer gives them weight: masking is per query, not per head.
    real = (row_sums > 0).any(axis=(0, 1))  # (Q,)
    plogp = weights * np.log(np.where(weights > 0, weights, 1.0))
    entropy = -plogp.sum(axis=-1)  # (L, H, Q)
    allowed = np.arange(1, n_queries + 1) if kind == "decoder" else np.full(n_queries, n_keys)
    log_allowed = np.log(allowed.astype(np.float64))
    entropy_norm = np.divide(entropy, log_allowed, out=np.zeros_like(entropy), where=allowed > 1)

    query_at = np.arange(n_queries)
    aligned = aligned_keys(n_queries, n_keys, kind)  # (Q,)
    distance = np.abs(aligned[:, None] - np.arange(n_keys)[None, :])  # (Q, K)
    diagonal_key = np.floor(aligned + 0.5).astype(int)
    has_previous = diagonal_key >= 1

    columns = {
        "entropy": _mean_over(entropy, real),
        "entropy_norm": _mean_over(entropy_norm, real),
        "mean_distance": _mean_over((weights * distance).sum(axis=-1), real),
        "diagonal": _mean_over(weights[..., query_at, diagonal_key], real),
        "previous": _mean_over(weights[..., query_at, np.maximum(diagonal_key - 1, 0)], real & has_previous),
        "first": _mean_over(weights[..., 0], real),
        "end": (
            np.full((n_layers, n_heads), np.nan) if kind == "decoder" else _mean_over(weights[..., n_keys - 1], real)
        ),
        "bos": _mean_over(weights[..., 0], real) if kind == "decoder" else np.full((n_layers, n_heads), np.nan),
        "induction": np.full((n_layers, n_heads), np.nan),
    }
    rows, keys = induction_targets(query_tokens) if kind == "decoder" else (np.zeros(0, dtype=int),) * 2
    if rows.size:
        columns["induction"] = weights[..., rows, keys].mean(axis=-1)
    layer, head = np.meshgrid(np.arange(1, n_layers + 1), np.arange(1, n_heads + 1), indexing="ij")
    frame = pd.DataFrame(
        {"layer": layer.ravel(), "head": head.ravel(), **{name: v.ravel() for name, v in columns.items()}}
    )
    frame.attrs["distance_note"] = DISTANCE_NOTES[kind]
    return frame


def induction_targets(tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(queries, keys): each position whose token occurred before, and the position right after that
    token's latest earlier occurrence (what an induction head attends to). Empty when no token repeats."""
    last: dict[str, int] = {}
    rows, keys = [], []
    for i, token in enumerate(tokens):
        if token in last:
            rows.append(i)
            keys.append(last[token] + 1)
        last[token] = i
    return np.array(rows, dtype=int), np.array(keys, dtype=int)


SINK_SHARE = 0.5  # a head with at least this mean weight on the first or the last key mostly rests there


def repeat_scores(maps: np.ndarray, start: int, period: int) -> dict[str, np.ndarray]:
    """Each head's induction and previous-token scores on a repeated sequence: {name: (L, H)}.

    ``maps`` (L, H, T, T) are the causal maps of a sequence whose tokens ``start .. start + period``
    are repeated at ``start + period ..`` (Olsson et al., 2022, the repeated random tokens probe;
    ``start`` is 1 after a BOS). Over the queries i of the repeated part:

    - ``induction``: the weight on i - period + 1, the token after the current token's earlier
      occurrence (what an induction head attends to, to copy it);
    - ``previous``: the weight on i - 1, the token just before (a previous-token head);
    - ``bos``: the weight on position 0, the first token (an attention sink).

    Each is a mean over those queries, in [0, 1].
    """
    maps = np.asarray(maps)
    if maps.ndim != 4 or maps.shape[-1] != maps.shape[-2]:
        raise ValueError(f"maps must be (layers, heads, T, T), got {maps.shape}")
    T = maps.shape[-1]
    if not (0 <= start and period >= 1 and start + 2 * period <= T):
        raise ValueError(f"a sequence of {T} tokens has no repeat of {period} tokens from position {start}")
    queries = np.arange(start + period, start + 2 * period)
    return {
        "induction": maps[..., queries, queries - period + 1].mean(axis=-1),
        "previous": maps[..., queries, queries - 1].mean(axis=-1),
        "bos": maps[..., queries, 0].mean(axis=-1),
    }


CLEAREST_RULE = (
    "the lowest mean entropy of its rows (normalised, over the model's example sentences), among the heads that "
    f"put less than {SINK_SHARE:.0%} of their weight on the first or the last token"
)


def clearest_head(tables: Sequence[pd.DataFrame]) -> tuple[int, int]:
    """(layer, head), from 1, of the sharpest head that is not a sink: `CLEAREST_RULE`.

    ``tables`` are `head_statistics` of one kind, one per sentence; each sentence counts
    equally. A head that rests on the first or the last token (``<s>``, ``</s>``, ``[CLS]``,
    ``[SEP]``) is sharp but shows nothing of the sentence, so it is passed over, unless every head
    does. Ties go to the earlier layer and head.
    """
    if not tables:
        raise ValueError("clearest_head needs the head statistics of at least one sentence")
    columns = ["entropy_norm", "first", "end"]
    mean = pd.concat([t.set_index(["layer", "head"])[columns] for t in tables]).groupby(level=[0, 1]).mean()
    sink = (mean["first"].fillna(0.0) >= SINK_SHARE) | (mean["end"].fillna(0.0) >= SINK_SHARE)
    candidates = mean[~sink] if (~sink).any() else mean
    layer, head = candidates["entropy_norm"].idxmin()
    return int(layer), int(head)


def _select(chosen: Iterable[int] | None, count: int, what: str) -> np.ndarray:
    """0-based indices for 1-based ``chosen`` numbers (all when None), checked against ``count``."""
    if chosen is None:
        return np.arange(count)
    numbers = np.array(list(chosen), dtype=int)
    bad = [int(n) for n in numbers if not 1 <= n <= count]
    if bad:
        raise ValueError(f"{what} numbers start at 1 and these maps have {count}; got {bad}")
    return numbers - 1


def long_form(
    maps: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
) -> pd.DataFrame:
    """One row per (layer, head, query, key) weight of (L, H, Q, K) maps, for CSV export.

    Columns: ``layer``, ``head`` (from 1, as in the app), ``query_index``, ``query_token``,
    ``key_index``, ``key_token`` (positions from 0) and ``weight``. ``layers`` and ``heads`` pick
    1-based layers and heads in the given order (None: all), so the export can match the view shown.
    Rows are ordered by layer, head, query, then key.
    """
    maps = _check_maps(maps, query_tokens, key_tokens)
    n_layers, n_heads, n_queries, n_keys = maps.shape
    layer_at = _select(layers, n_layers, "layer")
    head_at = _select(heads, n_heads, "head")
    chosen = maps[np.ix_(layer_at, head_at)]  # (l, h, Q, K), the selected layers and heads
    layer, head, query, key = (
        a.ravel() for a in np.meshgrid(layer_at, head_at, np.arange(n_queries), np.arange(n_keys), indexing="ij")
    )
    return pd.DataFrame(
        {
            "layer": layer + 1,
            "head": head + 1,
            "query_index": query,
            "query_token": np.asarray(query_tokens, dtype=object)[query],
            "key_index": key,
            "key_token": np.asarray(key_tokens, dtype=object)[key],
            "weight": chosen.ravel(),
        }
    )


# The CSV that `long_form_csv` writes: `long_form`'s columns, a value to nine significant digits (a
# float32 read back exactly), at most CSV_VALUE_CHARS characters ("-1.23456789e-308"), and rows built a
# block at a time: a pandas long form of every head of a 2,000-token text took 5.5 GB to write.
CSV_VALUE_CHARS = 16
CSV_BLOCK_ROWS = 1 << 18


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet reads as the start of a formula


def csv_field(text: str) -> str:
    """``text`` as one CSV field: quoted, its quotes doubled, when it holds a comma, a quote or a line break.

    A field of two characters or more that begins as a formula does (``=HYPERLINK(...)``, ``@SUM(A1)``,
    ``+1``) gets a leading apostrophe, which a spreadsheet shows as text rather than runs (OWASP's advice
    on CSV injection): the app's files hold a visitor's text, and a shared link's text reaches every
    visitor who downloads. A lone ``-`` or ``+`` piece is left as it is: no spreadsheet runs it.
    """
    if len(text) > 1 and text.startswith(FORMULA_STARTS):
        text = "'" + text
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n\r') else text


def _long_form_labels(
    shape: tuple[int, ...], layers: Iterable[int] | None, heads: Iterable[int] | None, names: tuple | None
) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """(layer indices, head indices, their labels in the file): 1-based numbers, or ``names``."""
    layer_at, head_at = _select(layers, shape[0], "layer"), _select(heads, shape[1], "head")
    layer_names, head_names = names or (layer_at + 1, head_at + 1)
    if len(layer_names) != len(layer_at) or len(head_names) != len(head_at):
        raise ValueError("names must give one label per chosen layer and one per chosen head")
    return layer_at, head_at, [csv_field(str(n)) for n in layer_names], [csv_field(str(n)) for n in head_names]


def long_form_csv_size(
    shape: tuple[int, ...],
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    value_name: str = "weight",
    names: tuple | None = None,
) -> int:
    """The most bytes `long_form_csv` writes for maps of ``shape`` (L, H, Q, K), known before any is made.

    Exact but for the values, each counted at its widest (`CSV_VALUE_CHARS`).
    """
    layer_at, head_at, layer_names, head_names = _long_form_labels(shape, layers, heads, names)
    Q, K = shape[-2:]
    if (Q, K) != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"maps of {Q} x {K} tokens, but {len(query_tokens)} x {len(key_tokens)} tokens given")

    def digits(n: int) -> int:  # characters of the numbers 0 .. n-1
        return sum(d * (min(n, 10**d) - (10 ** (d - 1) if d > 1 else 0)) for d in range(1, len(str(max(n - 1, 0))) + 1))

    def chars(tokens: Sequence[str]) -> int:
        return sum(len(csv_field(t).encode("utf-8")) for t in tokens)

    per_head = (
        Q * K * (7 + CSV_VALUE_CHARS) + K * (digits(Q) + chars(query_tokens)) + Q * (digits(K) + chars(key_tokens))
    )
    labels = (
        K
        * Q
        * (
            len(head_at) * sum(len(n.encode()) for n in layer_names)
            + len(layer_at) * sum(len(n.encode()) for n in head_names)
        )
    )
    header = len(f"layer,head,query_index,query_token,key_index,key_token,{csv_field(value_name)}\n".encode())
    return header + per_head * len(layer_at) * len(head_at) + labels


def long_form_csv(
    out,
    maps: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    layers: Iterable[int] | None = None,
    heads: Iterable[int] | None = None,
    value_name: str = "weight",
    names: tuple | None = None,
) -> int:
    """Write `long_form`'s table of (L, H, Q, K) ``maps`` as CSV to the binary file ``out``; the bytes written.

    The same rows and columns as `long_form` (the value column named ``value_name``), written
    `CSV_BLOCK_ROWS` rows at a time: what it holds beyond the maps is one block, whatever their size.
    ``names`` = (layer labels, head labels) replaces the 1-based numbers of the chosen layers and heads
    in the file (an aggregate's ``head`` is "mean"). At most `long_form_csv_size` bytes.
    """
    maps = _check_maps(maps, query_tokens, key_tokens)
    layer_at, head_at, layer_names, head_names = _long_form_labels(maps.shape, layers, heads, names)
    Q, K = maps.shape[-2:]
    written = out.write(f"layer,head,query_index,query_token,key_index,key_token,{csv_field(value_name)}\n".encode())
    # Each row of a map is one %-format of its K values, run in C: the row's template is its prefix before each
    # key's part, every "%" of the labels doubled. The same bytes as a format call per value, 1.5 times as fast
    # (4 heads of 1000 x 1000: 1.2-1.3 against 1.9-2.0 million rows a second on a 2-core AMD EPYC with AVX2
    # only, where formatting one float with %.9g alone takes 0.32 us).
    query_fields = [csv_field(t).replace("%", "%%") for t in query_tokens]
    key_parts = [f"{k},{csv_field(t).replace('%', '%%')},%.9g\n" for k, t in enumerate(key_tokens)]
    step = max(1, CSV_BLOCK_ROWS // max(K, 1))
    for li, layer in zip(layer_at, layer_names, strict=True):
        for hi, head in zip(head_at, head_names, strict=True):
            labels = f"{layer},{head},".replace("%", "%%")
            for start in range(0, Q, step):
                rows = maps[li, hi, start : start + step].tolist()  # (rows, K) Python floats
                lines = []
                for q, row in enumerate(rows, start):
                    prefix = f"{labels}{q},{query_fields[q]},"
                    lines.append((prefix + prefix.join(key_parts)) % tuple(row))
                written += out.write("".join(lines).encode("utf-8"))
    return written


def _block_edges(length: int, n_blocks: int) -> np.ndarray:
    """Start of each of ``n_blocks`` contiguous blocks covering ``length``, sizes differing by at most 1."""
    sizes = np.full(n_blocks, length // n_blocks)
    sizes[: length % n_blocks] += 1  # the first blocks take the remainder, as np.array_split does
    return np.concatenate([[0], np.cumsum(sizes)])


def downsample(
    matrix: np.ndarray, max_size: int, how: str = "mean"
) -> tuple[np.ndarray, list[tuple[int, int]], list[tuple[int, int]]]:
    """A block-pooled (Q, K) matrix of at most ``max_size`` x ``max_size`` cells, with each cell's ranges.

    Returns ``(cells, row_ranges, col_ranges)``: cell (i, j) is the mean (``how="mean"``) or the
    largest value (``how="max"``) of ``matrix[r0:r1, c0:c1]`` with ``(r0, r1) = row_ranges[i]`` and
    ``(c0, c1) = col_ranges[j]`` (half-open). Blocks are contiguous and their sizes differ by at most
    one; an axis already short enough keeps one position per cell, so a small matrix comes back
    unchanged (as float64).

    The mean preserves the sum of every block (cell * block area), hence the total and the
    area-weighted mean; for attention rows, sum_j cells[i, j] * (c1 - c0) of column block j is the
    mean row sum of the rows in block i, that is 1. A sharp single weight is spread over its block,
    so a thumbnail of a long map fades a previous-token head. The max keeps every peak: a block
    shows its strongest weight, so a diagonal of 1s stays a diagonal of 1s at any length; it is
    not a distribution (rows no longer sum to anything in particular).
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or 0 in matrix.shape:
        raise ValueError(f"expected a non-empty (query, key) matrix, got shape {matrix.shape}")
    if isinstance(max_size, bool) or not isinstance(max_size, (int, np.integer)) or max_size < 1:
        raise ValueError(f"max_size must be a positive integer, got {max_size!r}")
    if how not in ("mean", "max"):
        raise ValueError(f"how must be 'mean' or 'max', got {how!r}")
    row_edges = _block_edges(matrix.shape[0], min(matrix.shape[0], max_size))
    col_edges = _block_edges(matrix.shape[1], min(matrix.shape[1], max_size))
    reduce = np.maximum if how == "max" else np.add
    pooled = reduce.reduceat(reduce.reduceat(matrix, row_edges[:-1], axis=0), col_edges[:-1], axis=1)
    if how == "mean":
        pooled = pooled / np.outer(np.diff(row_edges), np.diff(col_edges))
    row_ranges = [(int(a), int(b)) for a, b in zip(row_edges[:-1], row_edges[1:], strict=True)]
    col_ranges = [(int(a), int(b)) for a, b in zip(col_edges[:-1], col_edges[1:], strict=True)]
    return pooled, row_ranges, col_ranges
