"""The forward-pass walkthrough: the stages of one sentence's pass, and the matrices each one shows.

Every matrix is SELECTED (indexed or sliced) from a `Walkthrough`, the tensors the model
itself recorded during the forward pass (named by `attnviz.hooks.act_name`), or from the
model's own embedding/output weights; nothing is recomputed here, so what the page shows is what
the model computed. The one exception is the output stage's probabilities: the softmax of the
model's real logits, a display of them.

Shape letters: S source length, T decoder input length, H heads, Dh d_k, D d_model, F d_ff,
V vocabulary size. Layers, heads and positions are numbered from 0 here; the page adds 1 to layers
and heads.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnviz.analysis import CSV_BLOCK_ROWS, CSV_VALUE_CHARS, csv_field
from attnviz.export import ForwardPass
from attnviz.hooks import act_name, attention_site
from attnviz.kinds import SIDES, axis_names, writing_labels

ENCODER_STAGES = (
    ("tokens", "1. Tokens"),
    ("embedding", "2. Embedding"),
    ("positions", "3. Positional encoding added"),
    ("enc_qkv", "4a. Encoder: Q, K, V of one head"),
    ("enc_scores", "4b. Encoder: scores and softmax weights"),
    ("enc_heads", "4c. Encoder: weighted sum, concatenation, W^O"),
    ("enc_norm", "4d. Encoder: residual and LayerNorm"),
    ("enc_ffn", "4e. Encoder: feed-forward and second Add & Norm"),
)
DECODER_STAGES = (
    ("dec_input", "5a. Decoder: shifted target input"),
    ("dec_self", "5b. Decoder: masked self-attention"),
    ("dec_cross", "5c. Decoder: cross-attention"),
    ("dec_ffn", "5d. Decoder: feed-forward"),
    ("output", "6. Output: linear layer and softmax"),
)
# A language model (a decoder alone) reads its prompt: its stages are the decoder's, with the
# rotation of queries and keys as a stage of its own where positions are rotary (Llama, Qwen2).
LM_STAGES = (
    ("tokens", "1. Tokens of the prompt"),
    ("dec_input", "2. Embedding and positions"),
    ("dec_self", "3. Masked self-attention"),
    ("rope", "3a. Rotary positions: Q and K turned"),
    ("dec_ffn", "4. Feed-forward"),
    ("output", "5. Output: the next token"),
)
USES_LAYER = {"enc_qkv", "enc_scores", "enc_heads", "enc_norm", "enc_ffn", "dec_self", "dec_cross", "dec_ffn", "rope"}
USES_HEAD = {"enc_qkv", "enc_scores", "enc_heads", "dec_self", "dec_cross", "rope"}
USES_STEP = {"dec_input", "dec_self", "dec_cross", "dec_ffn", "output", "rope"}
TOP_CANDIDATES = 10


@dataclass(frozen=True)
class Matrix:
    """One 2-D matrix a stage shows, and the full tensor it was selected from (for the CSV download).

    ``style`` is "matrix" (a labelled heatmap), "weights" or "scores" (an attention map, drawn with
    ``attention_kind``'s axis titles; ``mask`` True = may attend).
    """

    title: str
    values: np.ndarray  # (rows, columns), float32
    row_axis: str
    col_axis: str
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...] | None  # None: columns are numbered dimensions
    source: str  # the trace name (or model weight) it was selected from
    full: np.ndarray  # that whole tensor
    full_axes: tuple[str, ...]  # one name per axis of ``full``
    style: str = "matrix"
    attention_kind: str | None = None
    mask: np.ndarray | None = None

    @property
    def shape_text(self) -> str:
        """'head x source position x d_k = 4 x 12 x 32': the full tensor's axes, then their sizes.

        (Not "head 4": that would read as the fourth head.)
        """
        return " x ".join(self.full_axes) + " = " + " x ".join(str(n) for n in self.full.shape)

    @property
    def file_name(self) -> str:
        """The CSV's name: the recorded name with its layer counted from 1, as the app and the file's own head
        column count (``decoder.1.cross_attn.weights`` gives ``decoder-layer2-cross_attn-weights``)."""
        stack, _, rest = self.source.partition(".")
        index, _, point = rest.partition(".")
        name = f"{stack}-layer{int(index) + 1}-{point}" if index.isdigit() else self.source
        return name.replace(".", "-").replace("[", "_").replace("]", "")

    @property
    def recorded_layer(self) -> str | None:
        """'decoder layer 1' for a tensor recorded as ``decoder.0.…``: its stack and layer counted from 1,
        as every label of the app counts them; None for a tensor of no layer (``memory``, ``logits``)."""
        stack, _, rest = self.source.partition(".")
        index = rest.split(".", 1)[0]
        return f"{stack} layer {int(index) + 1}" if index.isdigit() else None


@dataclass(frozen=True)
class Stage:
    key: str
    title: str
    text: str  # two sentences: what happens here
    matrices: tuple[Matrix, ...]
    notes: tuple[str, ...] = ()  # extra lines: the model's own order, which tensor feeds which
    table: pd.DataFrame | None = None  # tokens and ids, or the top candidates
    arrow: tuple[str, str] | None = None  # (from, to): which tensor feeds this stage
    candidates: tuple[tuple[str, float], ...] = ()  # (token, probability), most likely first
    chosen: str | None = None


def stage_list(encoder_only: bool, decoder_only: bool = False, rotary: bool = False) -> tuple[tuple[str, str], ...]:
    """(key, title) of every stage, in order; an encoder-only model stops after the encoder, and a
    language model has the decoder's stages alone (the rotation only where positions are rotary)."""
    if decoder_only:
        return tuple(s for s in LM_STAGES if rotary or s[0] != "rope")
    return ENCODER_STAGES if encoder_only else ENCODER_STAGES + DECODER_STAGES


@dataclass(frozen=True)
class MatrixView:
    shown: np.ndarray  # (rows, min(k, columns)): the first k columns
    columns: tuple[str, ...]
    csv: str  # long form of the whole matrix: row, token, column, value


def matrix_view(matrix: np.ndarray, row_labels: Sequence[str], k: int) -> MatrixView:
    """The first ``k`` columns of a (rows, columns) matrix, and a long-form CSV of all of it."""
    matrix = np.asarray(matrix)
    if matrix.ndim != 2:
        raise ValueError(f"matrix must have 2 axes, got shape {matrix.shape}")
    if len(row_labels) != matrix.shape[0]:
        raise ValueError(f"{len(row_labels)} row labels for {matrix.shape[0]} rows")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    shown = matrix[:, :k]
    return MatrixView(
        shown, tuple(f"dim {j}" for j in range(shown.shape[1])), tensor_csv(matrix, ("row", "column"), row_labels)
    )


def tensor_csv(tensor: np.ndarray, axes: Sequence[str], row_labels: Sequence[str] | None = None) -> str:
    """Long form of a whole tensor: one line per entry, an index column per axis, then the value.

    With ``row_labels`` (one per entry of the second-to-last axis, the token positions) a ``token``
    column names each row's token. What `write_tensor_csv` writes, as text.
    """
    out = io.BytesIO()
    write_tensor_csv(out, tensor, axes, row_labels)
    return out.getvalue().decode("utf-8")


COUNTED_FROM_1 = ("head", "layer")  # axes whose index a file writes as the app counts them; positions count from 0


def _first_index(axes: Sequence[str]) -> list[int]:
    return [1 if name in COUNTED_FROM_1 else 0 for name in axes]


def _tensor_columns(ndim: int, axes: Sequence[str], row_labels: Sequence[str] | None) -> list[str]:
    if len(axes) != ndim or ndim < 1:
        raise ValueError(f"{len(axes)} axis names for a tensor of {ndim} axes")
    columns = [name.replace(" ", "_") for name in axes]
    if row_labels is not None and ndim >= 2:
        columns.insert(ndim - 1, "token")
    return [*columns, "value"]


def tensor_csv_size(shape: tuple[int, ...], axes: Sequence[str], row_labels: Sequence[str] | None = None) -> int:
    """The most bytes `write_tensor_csv` writes for a tensor of ``shape``, known before it is made: exact
    but for the values, each counted at its widest (`attnviz.analysis.CSV_VALUE_CHARS`)."""
    columns = _tensor_columns(len(shape), axes, row_labels)
    n = math.prod(shape)
    size = len((",".join(csv_field(c) for c in columns) + "\n").encode()) + n * (len(columns) + CSV_VALUE_CHARS)
    for length, first in zip(shape, _first_index(axes), strict=True):  # each index value appears n / length times
        last = length - 1 + first
        digits = sum(len(str(i)) for i in range(first, last + 1)) if length < 10**6 else len(str(last)) * length
        size += digits * (n // max(length, 1))
    if "token" in columns:
        size += sum(len(csv_field(str(t)).encode()) for t in row_labels) * (n // max(shape[-2], 1))
    return size


def write_tensor_csv(out, tensor: np.ndarray, axes: Sequence[str], row_labels: Sequence[str] | None = None) -> None:
    """`tensor_csv` written to the binary file ``out`` a block of rows at a time: what it holds beyond the
    tensor is one block, whatever the tensor's size. Values to nine significant digits."""
    tensor = np.asarray(tensor)
    columns = _tensor_columns(tensor.ndim, axes, row_labels)
    out.write((",".join(csv_field(c) for c in columns) + "\n").encode())
    rows = tensor.reshape(-1, tensor.shape[-1])  # (entries of the leading axes, last axis)
    leading = tensor.shape[:-1]
    labels = None
    if "token" in columns:
        labels = [csv_field(str(t)) for t in row_labels]
        if len(labels) != tensor.shape[-2]:
            raise ValueError(f"{len(labels)} row labels for {tensor.shape[-2]} rows")
    first = _first_index(axes)
    parts = [f"{j + first[-1]},{{:.9g}}\n" for j in range(tensor.shape[-1])]
    step = max(1, CSV_BLOCK_ROWS // max(tensor.shape[-1], 1))
    for start in range(0, rows.shape[0], step):
        lines = []
        for r, row in enumerate(rows[start : start + step].tolist(), start):
            index = np.unravel_index(r, leading) if leading else ()
            prefix = "".join(f"{int(i) + f}," for i, f in zip(index, first, strict=False))
            prefix += f"{labels[int(index[-1])]}," if labels else ""
            lines.append(prefix + prefix.join([part.format(v) for part, v in zip(parts, row, strict=True)]))
        out.write("".join(lines).encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# Building the stages


@dataclass(frozen=True)
class ModelFacts:
    """What the stages need to know about the model besides its traced tensors."""

    d_model: int
    n_heads: int
    d_ff: int
    n_enc_layers: int
    n_dec_layers: int
    norm_first: bool
    scale_embedding: bool
    embed_norm: bool
    pos_encoding: str
    activation: str
    tie_output: bool
    output_bias: bool
    n_kv_heads: int = 0  # later: grouped-query attention (0: one key/value head per query head)

    @classmethod
    def of(cls, cfg) -> ModelFacts:
        return cls(**{f: getattr(cfg, f) for f in cls.__dataclass_fields__})


def _m(wt: ForwardPass, name: str, axes, rows, title, select=(), cols=None, **kw) -> Matrix:
    full = wt.tensors[name]
    values = full[select] if select != () else full
    return Matrix(
        title=title,
        values=values,
        row_axis=axes[-2] if len(axes) >= 2 else "",
        col_axis=axes[-1],
        row_labels=tuple(rows),
        col_labels=None if cols is None else tuple(cols),
        source=name,
        full=full,
        full_axes=tuple(axes),
        **kw,
    )


def _order_note(facts: ModelFacts) -> str:
    if facts.norm_first:
        return (
            "This model is pre-LN (a later variant): it normalises the sub-layer's INPUT, x + Sublayer(LN(x)), "
            "so the block's output is the residual sum itself; the paper's post-LN order is LN(x + Sublayer(x))."
        )
    return "Post-LN, the paper's order: LayerNorm(x + Sublayer(x)), so the block's output is the normalised sum."


def build_stage(
    wt: ForwardPass,
    facts: ModelFacts,
    key: str,
    layer: int = 0,
    head: int = 0,
    step: int = 0,
    embedding: np.ndarray | None = None,
    output_weight: np.ndarray | None = None,
    output_bias: np.ndarray | None = None,
    token_of: Callable[[int], str] | None = None,
) -> Stage:
    """The stage ``key`` for encoder or decoder ``layer``, ``head`` and decoder ``step`` (all from 0).

    ``embedding`` (V, D) is the raw embedding matrix (stage 2); ``output_weight`` (V, D) and
    ``output_bias`` (V,) the output layer and ``token_of`` maps a vocabulary id to its piece (stage 6).
    """
    titles = dict(LM_STAGES) if facts.n_enc_layers == 0 else dict(stage_list(False))
    if key not in titles:
        raise ValueError(f"unknown stage {key!r}; stages: {', '.join(titles)}")
    builder = _BUILDERS[key]
    matrices, text, extra = builder(
        wt,
        facts,
        layer=layer,
        head=head,
        step=step,
        embedding=embedding,
        output_weight=output_weight,
        output_bias=output_bias,
        token_of=token_of,
    )
    return Stage(key=key, title=titles[key], text=text, matrices=tuple(matrices), **extra)


S_AX, T_AX = f"{SIDES['source']} position", f"{SIDES['target']} position"


def _tokens(wt, facts, **_):
    rows = [
        {"side": "source", "position": i, "piece": t, "id": int(n)}
        for i, (t, n) in enumerate(zip(wt.src_tokens or (), wt.src_ids or (), strict=True))
    ]
    if wt.tgt_ids is not None:
        rows += [
            {"side": "decoder input", "position": i, "piece": t, "id": int(n)}
            for i, (t, n) in enumerate(zip(wt.tgt_tokens, wt.tgt_ids, strict=True))
        ]
    text = (
        "The tokenizer cuts the sentence into pieces and maps each piece to an id in the vocabulary. "
        "The model never sees letters: from here on, every row of every matrix is one of these pieces."
    )
    return [], text, {"table": pd.DataFrame(rows)}


def _embedding(wt, facts, embedding=None, **_):
    mats = []
    if embedding is not None:
        ids = np.asarray(wt.src_ids)
        raw = embedding[ids]  # the rows of E for these ids: a selection, not a computation
        mats.append(
            Matrix(
                "Rows of the embedding matrix E",
                raw,
                S_AX,
                "d_model",
                wt.src_tokens,
                None,
                "model.src_embed.weight[ids]",
                raw,
                (S_AX, "d_model"),
            )
        )
    scaled = f"multiplied by sqrt(d_model) = {math.sqrt(facts.d_model):.2f} (section 3.4)"
    mats.append(
        _m(
            wt,
            act_name("src", "embed"),
            (S_AX, "d_model"),
            wt.src_tokens,
            "Token embeddings" + (", scaled by sqrt(d_model)" if facts.scale_embedding else ""),
        )
    )
    text = f"Each id selects one row of the embedding matrix E, a vector of d_model = {facts.d_model} numbers. " + (
        f"The rows are {scaled}." if facts.scale_embedding else "This model does not scale them (the paper does)."
    )
    return mats, text, {}


def _positions(wt, facts, **_):
    ax = (S_AX, "d_model")
    mats = [_m(wt, act_name("src", "embed"), ax, wt.src_tokens, "Embedding")]
    if act_name("src", "pos") in wt.tensors:
        mats.append(_m(wt, act_name("src", "pos"), ax, wt.src_tokens, f"Positional encoding ({facts.pos_encoding})"))
    mats.append(_m(wt, act_name("src", "input"), ax, wt.src_tokens, "Encoder input"))
    notes = []
    if act_name("src", "pos") not in wt.tensors:
        notes.append("This model has no positional encoding: the encoder input is the embedding itself.")
    if facts.embed_norm:
        notes.append(
            "This model (BERT-style) adds a token-type row and applies a LayerNorm to the sum; the paper does neither."
        )
    text = (
        "Attention alone cannot tell positions apart, so a vector that depends only on the position is added "
        "to each embedding (section 3.5). The sum, row by row, is the encoder's input."
    )
    return mats, text, {"notes": tuple(notes)}


def _qkv(wt, p, head, q_rows, kv_rows, q_ax, kv_ax, q_n=None, kv_n=None):
    qs = slice(None) if q_n is None else slice(0, q_n)
    ks = slice(None) if kv_n is None else slice(0, kv_n)
    return [
        _m(wt, act_name(p, "q"), ("head", q_ax, "d_k"), q_rows, f"Q, head {head + 1}", (head, qs)),
        _m(wt, act_name(p, "k"), ("head", kv_ax, "d_k"), kv_rows, f"K, head {head + 1}", (head, ks)),
        _m(wt, act_name(p, "v"), ("head", kv_ax, "d_k"), kv_rows, f"V, head {head + 1}", (head, ks)),
    ]


def _maps(wt, p, head, q_rows, kv_rows, q_ax, kv_ax, kind, q_n=None, kv_n=None):
    qs = slice(None) if q_n is None else slice(0, q_n)
    ks = slice(None) if kv_n is None else slice(0, kv_n)
    scores = wt.tensors[act_name(p, "scores")][head, qs, ks]
    mask = np.isfinite(scores)  # the model's own mask: it wrote -inf where a query may not look
    axes = ("head", q_ax, kv_ax)
    titles = {"scores": "Scores Q K^T / sqrt(d_k)", "weights": "Weights after the softmax"}
    return [
        _m(
            wt,
            act_name(p, name),
            axes,
            q_rows,
            f"{title}, head {head + 1}",
            (head, qs, ks),
            kv_rows,
            style=name,
            attention_kind=kind,
            mask=mask,
        )
        for name, title in titles.items()
    ]


def _enc_qkv(wt, facts, layer, head, **_):
    p = attention_site("encoder", layer)
    text = (
        f"Layer {layer + 1}'s input is multiplied by W^Q, W^K and W^V and cut into {facts.n_heads} heads of "
        f"d_k = {facts.d_model // facts.n_heads} columns each. Every position gets a query (what it looks for), "
        "a key (what it offers) and a value (what it passes on)."
    )
    mats = [
        _m(
            wt,
            act_name("encoder", layer, "attn_block", "input"),
            (S_AX, "d_model"),
            wt.src_tokens,
            f"Layer {layer + 1} input",
        )
    ]
    mats += _qkv(wt, p, head, wt.src_tokens, wt.src_tokens, S_AX, S_AX)
    notes = (_order_note(facts),) if facts.norm_first else ()
    if facts.norm_first:
        notes += ("Pre-LN: Q, K and V are projected from LayerNorm(input), not from the input shown here.",)
    return mats, text, {"notes": notes}


def _enc_scores(wt, facts, layer, head, **_):
    p = attention_site("encoder", layer)
    mats = _maps(wt, p, head, wt.src_tokens, wt.src_tokens, *axis_names("encoder"), "encoder")
    text = (
        "Each query is compared with every key by a dot product divided by sqrt(d_k) (equation 1), and a softmax "
        "turns each row into weights that sum to 1. Padding positions would be masked (grey); one sentence "
        "alone has no padding, so every key is allowed."
    )
    return mats, text, {}


def _heads(wt, p, head, rows, ax, n=None):
    s = slice(None) if n is None else slice(0, n)
    return [
        _m(wt, act_name(p, "heads"), ("head", ax, "d_k"), rows, f"Weighted sum of values, head {head + 1}", (head, s)),
        _m(wt, act_name(p, "concat"), (ax, "d_model"), rows, "All heads concatenated", (s,)),
        _m(wt, act_name(p, "out"), (ax, "d_model"), rows, "After W^O", (s,)),
    ]


def _enc_heads(wt, facts, layer, head, **_):
    text = (
        "Each head mixes the value rows with its weights, giving one d_k-wide vector per position. "
        f"The {facts.n_heads} heads are laid side by side (concatenated) and W^O maps them back to d_model."
    )
    return _heads(wt, attention_site("encoder", layer), head, wt.src_tokens, S_AX), text, {}


def _block(wt, p, rows, ax, sub_out, sub_title, n=None):
    s = slice(None) if n is None else slice(0, n)
    return [
        _m(wt, act_name(p, "input"), (ax, "d_model"), rows, "Block input x", (s,)),
        _m(wt, sub_out, (ax, "d_model"), rows, sub_title, (s,)),
        _m(wt, act_name(p, "residual"), (ax, "d_model"), rows, "Residual: x + sub-layer output", (s,)),
        _m(wt, act_name(p, "output"), (ax, "d_model"), rows, "Block output", (s,)),
    ]


def _enc_norm(wt, facts, layer, **_):
    text = (
        "The attention output is added to the layer's input (a residual connection), so the layer only has "
        "to learn a correction. " + _order_note(facts)
    )
    mats = _block(
        wt,
        act_name("encoder", layer, "attn_block"),
        wt.src_tokens,
        S_AX,
        act_name("encoder", layer, "attn", "out"),
        "Attention output",
    )
    return mats, text, {}


def _ffn(wt, p, rows, ax, facts, n=None):
    s = slice(None) if n is None else slice(0, n)
    return [
        _m(wt, act_name(p, "ffn_block", "input"), (ax, "d_model"), rows, "Feed-forward input", (s,)),
        _m(wt, act_name(p, "ffn", "hidden"), (ax, "d_ff"), rows, f"Hidden layer after {facts.activation}", (s,)),
        _m(wt, act_name(p, "ffn", "out"), (ax, "d_model"), rows, "Feed-forward output", (s,)),
        _m(wt, act_name(p, "ffn_block", "residual"), (ax, "d_model"), rows, "Residual sum", (s,)),
        _m(wt, act_name(p, "ffn_block", "output"), (ax, "d_model"), rows, "Layer output", (s,)),
    ]


def _enc_ffn(wt, facts, layer, **_):
    text = (
        f"Each position goes alone through the same two linear layers, d_model {facts.d_model} -> d_ff {facts.d_ff} "
        f"-> d_model {facts.d_model}, with a {facts.activation} between (equation 2). "
        "Then a second Add & Norm; its output is the next layer's input."
    )
    notes = [_order_note(facts)]
    if layer == facts.n_enc_layers - 1:
        notes.append(
            "This is the last encoder layer: its output is the encoder output (memory)"
            + (" after a final LayerNorm (pre-LN)." if facts.norm_first else ".")
        )
    return _ffn(wt, act_name("encoder", layer), wt.src_tokens, S_AX, facts), text, {"notes": tuple(notes)}


def _dec_input(wt, facts, step, **_):
    n = step + 1
    ax = (T_AX, "d_model")
    rows = wt.tgt_tokens[:n]
    mats = [_m(wt, act_name("tgt", "embed"), ax, rows, "Target embedding", (slice(0, n),))]
    if act_name("tgt", "pos") in wt.tensors:
        mats.append(_m(wt, act_name("tgt", "pos"), ax, rows, "Positional encoding", (slice(0, n),)))
    mats.append(_m(wt, act_name("tgt", "input"), ax, rows, "Decoder input", (slice(0, n),)))
    if facts.n_enc_layers == 0:  # a language model
        rotary = " (none is added: rotary positions turn Q and K inside attention, stage 3a)"
        text = (
            "A language model reads its prompt one position after another: at position "
            f"{step} it sees positions 0..{step} and predicts the next token. Each piece is embedded, and its "
            f"position added{rotary if facts.pos_encoding == 'rotary' else ''}."
        )
        return mats, text, {}
    text = (
        "The decoder reads the target shifted right by one: a start token, then the tokens written so far, "
        f"so at step {step + 1} it sees positions 0..{step}. They are embedded and get positions like the source."
    )
    return mats, text, {}


def _writing(wt, n: int) -> list[str]:
    """The first ``n`` decoder positions as "input → the token it writes" (the last input writes </s>; a
    language model's last position, or a greedy output's cut at the length limit, writes a token its input does
    not hold: "…", as the explorer's labels say it, `attnviz.export.written`)."""
    last = "…" if wt.src_tokens is None or wt.tgt_truncated else "</s>"
    return writing_labels(wt.tgt_tokens[:n], [*wt.tgt_tokens[1:], last][:n])


def _rope(wt, facts, layer, head, step, **_):
    """Rotary positions: one head's queries and keys before and after their rotation."""
    n, rows = step + 1, wt.tgt_tokens[: step + 1]
    p = attention_site("decoder", layer)
    group = facts.n_heads // (facts.n_kv_heads or facts.n_heads)  # query heads per key/value head
    kv_head = head // group
    k_name = f"key/value head {kv_head + 1}" if group > 1 else f"head {head + 1}"  # the head its rows are
    ax = ("head", T_AX, "d_k")
    mats = [
        _m(wt, act_name(p, "q_unrotated"), ax, rows, f"Q, head {head + 1}, before the rotation", (head, slice(0, n))),
        _m(wt, act_name(p, "q"), ax, rows, f"Q, head {head + 1}, turned by its position", (head, slice(0, n))),
        _m(wt, act_name(p, "k_unrotated"), ax, rows, f"K, {k_name}, before the rotation", (kv_head, slice(0, n))),
        _m(wt, act_name(p, "k"), ax, rows, f"K, head {head + 1}, turned by its position", (head, slice(0, n))),
    ]
    notes = ()
    if group > 1:  # every query head of a group, the first included (its index had been compared with the group's)
        notes = (f"Grouped-query attention: head {head + 1} reads key/value head {kv_head + 1}, shared by its group.",)
    text = (
        "Here positions enter: each pair of dimensions (i, i + d_k/2) of a query or key is turned by the angle "
        "position × θ^(−2i/d_k). The first pair (i = 0) turns fastest, one radian per position; each later pair "
        "turns more slowly, the last barely at all. "
        "Rotations compose, so the score q_i·k_j depends on the positions only through j − i: the relative-position "
        "property of section 3.5, inside attention (the linearity page measures it on this model)."
    )
    return mats, text, {"notes": notes}


def _dec_self(wt, facts, layer, head, step, **_):
    n, rows = step + 1, wt.tgt_tokens[: step + 1]
    p = attention_site("decoder", layer)
    mats = _qkv(wt, p, head, rows, rows, T_AX, T_AX, n, n)
    mats += _maps(wt, p, head, _writing(wt, n), rows, *axis_names("decoder"), "decoder", n, n)
    mats += [_m(wt, act_name(p, "out"), (T_AX, "d_model"), rows, "After W^O", (slice(0, n),))]
    mats += [
        _m(
            wt,
            act_name("decoder", layer, "self_block", "output"),
            (T_AX, "d_model"),
            rows,
            "After Add & Norm",
            (slice(0, n),),
        )
    ]
    text = (
        "Self-attention in the decoder is masked: a position may attend only to itself and earlier positions "
        "(the subsequent mask, grey above the diagonal), since later tokens are not written yet. "
        "Otherwise it is the encoder's attention: Q, K, V, scores, softmax, heads, W^O, Add & Norm."
    )
    return mats, text, {}


def _dec_cross(wt, facts, layer, head, step, **_):
    n, rows = step + 1, wt.tgt_tokens[: step + 1]
    p = attention_site("cross", layer)
    mats = [_m(wt, act_name("memory"), (S_AX, "d_model"), wt.src_tokens, "Encoder output (memory)")]
    mats += _qkv(wt, p, head, rows, wt.src_tokens, T_AX, S_AX, q_n=n)
    mats += _maps(wt, p, head, _writing(wt, n), wt.src_tokens, *axis_names("cross"), "cross", q_n=n)
    mats += [
        _m(
            wt,
            act_name("decoder", layer, "cross_block", "output"),
            (T_AX, "d_model"),
            rows,
            "After Add & Norm",
            (slice(0, n),),
        )
    ]
    source = f"encoder layer {facts.n_enc_layers} output" + (" + final LayerNorm" if facts.norm_first else "")
    text = (
        "Cross-attention takes its queries from the decoder and its keys and values from the encoder output, "
        "so each target position can look at every source token. The same memory feeds every decoder layer."
    )
    arrow = (f"memory ({source}), {S_AX} x d_model", f"K and V of decoder layer {layer + 1}'s cross-attention")
    return mats, text, {"arrow": arrow}


def _dec_ffn(wt, facts, layer, step, **_):
    n = step + 1
    mats = _ffn(wt, act_name("decoder", layer), wt.tgt_tokens[:n], T_AX, facts, n)
    notes = [_order_note(facts)]
    if layer == facts.n_dec_layers - 1:
        mats.append(
            _m(wt, act_name("decoder_out"), (T_AX, "d_model"), wt.tgt_tokens[:n], "Decoder output", (slice(0, n),))
        )
        notes.append("This is the last decoder layer: its output goes to the output layer.")
    text = (
        f"As in the encoder, each position goes alone through d_model {facts.d_model} -> d_ff {facts.d_ff} -> "
        f"d_model {facts.d_model}, followed by Add & Norm. The last decoder layer's output feeds the output layer."
    )
    return mats, text, {"notes": tuple(notes)}


def _output(wt, facts, step, output_weight=None, output_bias=None, token_of=None, **_):
    n, rows = step + 1, wt.tgt_tokens[: step + 1]
    logits = wt.tensors[act_name("logits")][step]
    z = logits.astype(np.float64) - logits.max()
    probs = np.exp(z) / np.exp(z).sum()  # a display of the real logits, not a new computation of the model
    top = np.argsort(-probs, kind="stable")[:TOP_CANDIDATES]
    name = token_of or str
    candidates = tuple((name(int(i)), float(probs[i])) for i in top)
    best = name(int(top[0]))
    mats = [
        _m(wt, act_name("decoder_out"), (T_AX, "d_model"), rows, "Decoder output", (slice(0, n),)),
        _m(
            wt,
            act_name("logits"),
            (T_AX, "vocabulary"),
            rows,
            "Logits (scores for every vocabulary entry)",
            (slice(0, n),),
        ),
    ]
    if output_weight is not None:
        w = output_weight[top]  # rows of the output matrix for the top candidates: a selection
        src = "model.tgt_embed.weight" if facts.tie_output else "model.out_proj"
        mats.append(
            Matrix(
                "Output-layer rows of the top candidates",
                w,
                "candidate",
                "d_model",
                tuple(c for c, _ in candidates),
                None,
                f"{src}[top]",
                w,
                ("candidate", "d_model"),
            )
        )
    given = wt.tgt_ids[step + 1] if step + 1 < len(wt.tgt_ids) else None
    chosen = best if given is None else name(int(given))
    tied = "tied to the embedding matrix E (section 3.4)" if facts.tie_output else "its own matrix (not tied)"
    text = (
        f"The output layer multiplies the decoder output by a {facts.d_model} x vocabulary matrix, {tied}"
        + (", plus a bias" if facts.output_bias else "")
        + ", giving one logit per vocabulary entry. A softmax turns the logits into probabilities "
        "(computed here from the real logits, for display), and the chosen token becomes the next decoder input."
    )
    notes = [f"The model's most likely token at step {step + 1}: {best} (p = {candidates[0][1]:.3f})."]
    if given is not None:
        notes.append(f"The next decoder input (position {step + 1}) is {chosen}.")
    else:
        notes.append("This is the last position: the decoder input ends here.")
    return mats, text, {"notes": tuple(notes), "candidates": candidates, "chosen": chosen}


_BUILDERS = {
    "tokens": _tokens,
    "embedding": _embedding,
    "positions": _positions,
    "enc_qkv": _enc_qkv,
    "enc_scores": _enc_scores,
    "enc_heads": _enc_heads,
    "enc_norm": _enc_norm,
    "enc_ffn": _enc_ffn,
    "dec_input": _dec_input,
    "dec_self": _dec_self,
    "dec_cross": _dec_cross,
    "dec_ffn": _dec_ffn,
    "output": _output,
    "rope": _rope,
}


def matrix_csv(matrix: Matrix, wt: ForwardPass) -> str:
    """Long-form CSV of the whole tensor ``matrix`` was selected from, rows named by their tokens."""
    return tensor_csv(matrix.full, matrix.full_axes, matrix_labels(matrix, wt))


def matrix_labels(matrix: Matrix, wt: ForwardPass) -> Sequence[str] | None:
    """The token of each row of the whole tensor ``matrix`` was selected from, None when rows are not tokens."""
    n_rows = matrix.full.shape[-2] if matrix.full.ndim >= 2 else 0
    labels = None
    for axis_part, tokens in (("source", wt.src_tokens), ("decoder input", wt.tgt_tokens)):
        if matrix.full.ndim >= 2 and axis_part in matrix.full_axes[-2] and tokens is not None and len(tokens) == n_rows:
            labels = tokens
    if labels is None and len(matrix.row_labels) == n_rows:
        labels = matrix.row_labels
    return labels
