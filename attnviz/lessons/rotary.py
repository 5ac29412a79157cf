"""Rotary positions on real weights: a head's score depends on the two positions only through their offset.

Section 3.5 argues that PE(pos + k) is a linear function (a rotation) of PE(pos). RoPE (Su et al.,
2021; Llama, Qwen2, SmolLM) makes that rotation the mechanism: the query at position i and the
key at position j are each rotated by their own position's angles, and since rotations compose,
q_i^T R(i)^T R(j) k_j = q_i^T R(j - i) k_j. The score of a pair depends on j - i alone. Here that
is measured on the loaded model's own vectors, taken before the rotation (the points
``q_unrotated`` and ``k_unrotated`` of `attnviz.hooks`), and rotated again with both positions
moved by c: every score changes by float32 rounding only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnviz.hooks import Recorder, act_name, attention_site
from attnviz.later import Rotary, repeat_kv
from attnviz.model import rope_spec

SHIFTS = (1, 10, 100, 1000)


def unrotated(bundle, ids: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(queries (H, T, Dh), keys (H, T, Dh)) of decoder layer ``layer`` (from 0) before the rotation, float32;
    grouped keys repeated per query head, as attention reads them."""
    cfg = bundle.config
    if cfg.pos_encoding != "rotary" or not cfg.decoder_only:
        raise ValueError("this lesson needs a language model with rotary positions (Llama, Qwen2, SmolLM)")
    site = attention_site("decoder", layer)
    names = {act_name(site, "q_unrotated"), act_name(site, "k_unrotated")}
    with torch.no_grad(), Recorder(names) as rec:
        bundle.model(None, ids, return_logits=False)
    q = rec.tensors[act_name(site, "q_unrotated")][0].float()
    k = repeat_kv(rec.tensors[act_name(site, "k_unrotated")], cfg.n_heads)[0].float()
    return q, k


def scores_at(bundle, q: torch.Tensor, k: torch.Tensor, start: int) -> torch.Tensor:
    """The scores q_i R(start + i) . k_j R(start + j) / sqrt(d_k) of every head, (H, T, T), as if the
    sequence began at position ``start``."""
    rotary = Rotary(rope_spec(bundle.config))
    qr, kr = rotary(q[None], start)[0], rotary(k[None], start)[0]
    return qr @ kr.transpose(-1, -2) / q.shape[-1] ** 0.5


def shift_check(bundle, ids: torch.Tensor, layer: int, shifts=SHIFTS) -> pd.DataFrame:
    """Per head and shift c: the largest change of any causal pair's score when both positions move by c,
    alone and relative to the largest score. Rows: head (from 1), shift, largest_change, relative."""
    q, k = unrotated(bundle, ids, layer)
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    base = scores_at(bundle, q, k, 0)
    rows = []
    for c in shifts:
        change = (scores_at(bundle, q, k, c) - base).abs().masked_fill(~causal, 0)
        for h in range(q.shape[0]):
            largest = float(change[h].max())
            scale = float(base[h][causal].abs().max())
            rows.append({"head": h + 1, "shift": c, "largest_change": largest, "relative": largest / scale})
    return pd.DataFrame(rows)


def score_by_offset(bundle, ids: torch.Tensor, layer: int, query: int, key: int, max_offset: int) -> pd.DataFrame:
    """Per head: the score of the query vector of position ``query`` with the key vector of position
    ``key`` (their content, before the rotation) when the query stands ``offset`` positions after the
    key, for offsets 0..max_offset. Rows: head (from 1), offset, score."""
    q, k = unrotated(bundle, ids, layer)
    rotary = Rotary(rope_spec(bundle.config))
    offsets = torch.arange(max_offset + 1)
    # the key at position 0, the query at position `offset`: the score depends on the offset alone
    qs = torch.stack([rotary(q[None, :, query : query + 1], int(o))[0, :, 0] for o in offsets], dim=1)  # (H, O, Dh)
    k0 = rotary(k[None, :, key : key + 1], 0)[0, :, 0]  # (H, Dh)
    scores = (qs @ k0[:, :, None])[..., 0] / q.shape[-1] ** 0.5  # (H, O)
    H = scores.shape[0]
    return pd.DataFrame(
        {
            "head": np.repeat(np.arange(1, H + 1), len(offsets)),
            "offset": np.tile(offsets.numpy(), H),
            "score": scores.flatten().numpy(),
        }
    )


# ---------------------------------------------------------------------------------------------
# The three kinds of positions, on the same two measurements

FIT_OFFSET = 8  # the offset k of "PE(pos + k) from PE(pos)"


def rotary_table(n: int, d_head: int, theta: float = 10000.0) -> np.ndarray:
    """RoPE's angles as a table (n, d_head): cos and sin of pos * theta^(-2i/d_head), float64.

    Nothing adds it to the embeddings; it is what the rotation of position pos is made of, so it
    takes the place of the additive table in the fit below.
    """
    angles = np.arange(n, dtype=np.float64)[:, None] * theta ** (-np.arange(0, d_head, 2) / d_head)[None, :]
    return np.concatenate([np.cos(angles), np.sin(angles)], axis=1)


def additive_shift_check(bundle, ids: torch.Tensor, layer: int, shifts) -> float:
    """The largest relative change of any causal score of decoder ``layer`` when the position table's rows
    added to the prompt are those of positions c.. instead of 0.. (a model whose positions are added)."""
    from attnviz.hooks import Edit

    table = bundle.model.pos.table
    T = ids.shape[1]
    name = act_name(attention_site("decoder", layer), "scores")

    def scores(c: int) -> torch.Tensor:
        with torch.no_grad(), Edit({"tgt.pos": lambda _: table[c : c + T]}), Recorder({name}) as rec:
            bundle.model(None, ids, return_logits=False)
        return rec.tensors[name][0]

    base = scores(0)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scale = float(base[:, causal].abs().max())
    return max(float((scores(c) - base)[:, causal].abs().max()) / scale for c in shifts)


def kinds_table(bundle=None, ids: torch.Tensor | None = None, n: int = 256, d: int = 64) -> pd.DataFrame:
    """Sinusoidal, learned and rotary positions on the same two measurements, one row each.

    - ``fit_residual``: the best linear map from a position's code to the code ``FIT_OFFSET`` positions
      later, fitted over ``n`` positions; what it leaves unexplained, relative (section 3.5's claim:
      0 up to rounding). The sinusoids are the paper's table (d columns); the learned table is the
      loaded model's when it has one, over at least twice its width in positions where it has them (a
      fit over no more positions than dimensions fits any table: GPT-2's 768 had been refused over 256),
      None when it has no more than its width and ``FIT_OFFSET``; the rotary code is its angles (with
      the loaded model's theta).
    - ``shift_change``: on the loaded model only (the others need a model of their kind), the largest
      relative change of any score of its first layer when every position moves by the same amount.
    """
    from attnviz.lessons import positional as pe

    cfg = None if bundle is None else bundle.config
    kind = None if cfg is None else cfg.pos_encoding
    rows = []
    sinusoids = pe.encoding_matrix(n, d).astype(np.float64)
    theta = cfg.rope_theta if kind == "rotary" else 10000.0
    d_head = cfg.d_head if kind == "rotary" else d
    learned = None
    if kind == "learned":
        full = bundle.model.pos.table.detach().double().cpu().numpy()
        width = full.shape[1]
        if len(full) - FIT_OFFSET > width:  # else any table would fit exactly: no measurement
            learned = full[: max(n, 2 * width + FIT_OFFSET)]
    for name, table in (
        ("sinusoidal", sinusoids),
        ("learned", learned),
        ("rotary", rotary_table(n, d_head, theta)),
    ):
        fit = None if table is None else float(pe.fit_residual_by_offset(table, [FIT_OFFSET])[0])
        change = None
        if bundle is not None and ids is not None and (kind == name or kind.startswith(name)):
            room = cfg.max_len - ids.shape[1]
            shifts = [c for c in (1, 10, 100) if name == "rotary" or c <= room]
            if name == "rotary":
                change = float(shift_check(bundle, ids, 0, shifts)["relative"].max())
            elif shifts:
                change = additive_shift_check(bundle, ids, 0, shifts)
        rows.append({"kind": name, "fit_residual": fit, "shift_change": change})
    return pd.DataFrame(rows)
