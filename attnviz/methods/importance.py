"""Head importance: how much the log-probability of an output drops when one head alone is switched off.

Michel, Levy & Neubig (2019, "Are Sixteen Heads Really Better than One?", NeurIPS,
arXiv:1905.10650) ablate heads one at a time (section 3) and define an importance score as the
expected sensitivity of the loss to a head's mask (section 4.1, a first-order estimate of that same
change). Here the change itself is measured: for each head h of each kind and layer,

    importance(h) = ( sum_n log p(y_n | x_n) - log p_{-h}(y_n | x_n) ) / (number of target tokens)

in nats per target token, with p_{-h} the model with head h's output set to zero before W_O
(:mod:`attnviz.methods.ablation`, ``zero`` mode), over sentence pairs (x_n, y_n): references, or the
model's own output. Positive: the head helps produce y; negative: the output is more likely
without it. A head can matter only together with another (heads can back each other up), which a
one-at-a-time ablation does not show.

The sentences are padded into one batch, and for each layer and kind every head is ablated in the
same pass (the batch repeated once per head, each copy with its own head zeroed); decoder and
cross-attention heads reuse the intact encoder output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attnviz.errors import InputError
from attnviz.hooks import Edit, act_name, attention_site
from attnviz.kinds import KINDS
from attnviz.model import Transformer
from attnviz.tokenizer import pad_batch

# Rows per pass are capped so that the largest tensor of a pass (the logits, rows x T x V floats)
# stays under this many elements (64 MB of float32).
MAX_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class HeadImportance:
    """Mean drop in log-probability per target token when each head alone is zeroed.

    ``scores``: kind -> (L, H) float64, layers and heads from 0 along the axes. ``intact_logprob``:
    the intact model's mean log-probability per target token. ``n_sentences`` and ``n_tokens``:
    how much it was averaged over (target tokens include the end token).
    """

    scores: dict[str, np.ndarray]
    intact_logprob: float
    n_sentences: int
    n_tokens: int


@dataclass(frozen=True)
class _Batch:
    src: Tensor  # (N, S)
    src_valid: Tensor
    tgt: Tensor  # (N, T): the decoder input, <s> then the output without its last token
    tgt_valid: Tensor
    labels: Tensor  # (N, T): the output, each position's next token


def _batch(model: Transformer, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> _Batch:
    cfg, device = model.cfg, model.device
    if not pairs:
        raise InputError("head importance needs at least one sentence")
    for src, out in pairs:
        if not src or not out:
            raise InputError("every sentence and every output must have at least one token")
    src, src_valid = pad_batch([tuple(s) for s, _ in pairs], cfg.pad_id, device)
    tgt, tgt_valid = pad_batch([(cfg.bos_id, *out[:-1]) for _, out in pairs], cfg.pad_id, device)
    labels, _ = pad_batch([tuple(out) for _, out in pairs], cfg.pad_id, device)
    return _Batch(src, src_valid, tgt, tgt_valid, labels)


def _logprobs(
    model: Transformer, batch: _Batch, rows: Tensor, heads: Tensor, site: str | None, memory: Tensor
) -> Tensor:
    """Each row's summed output log-probability: row r is sentence ``rows[r]``, ``site``'s head ``heads[r]`` off."""
    cfg = model.cfg
    per_row = max(batch.src.shape[1], batch.tgt.shape[1]) * max(cfg.tgt_vocab_size, cfg.d_ff, cfg.d_model)
    chunk = max(1, MAX_ELEMENTS // per_row)
    out = []
    for start in range(0, rows.shape[0], chunk):
        r, h = rows[start : start + chunk], heads[start : start + chunk]
        edits = {}
        if site is not None:
            keep = torch.ones(r.shape[0], cfg.n_heads, 1, 1, device=memory.device)
            keep[torch.arange(r.shape[0], device=memory.device), h] = 0.0
            edits[act_name(site, "heads")] = lambda x, keep=keep: x * keep.to(x.dtype)  # (R, H, Q, Dh)
        with Edit(edits):
            if site is not None and site.startswith("encoder"):
                logits = model(batch.src[r], batch.tgt[r], batch.src_valid[r], batch.tgt_valid[r]).logits
            else:
                logits, _, _ = model.decode(batch.tgt[r], memory[r], batch.src_valid[r], batch.tgt_valid[r])
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.labels[r][..., None])[..., 0]  # (R, T)
        out.append((logp * batch.tgt_valid[r]).sum(dim=-1).double())
    return torch.cat(out)


@torch.no_grad()
def head_importance(
    model: Transformer, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], kinds: Sequence[str] = KINDS
) -> HeadImportance:
    """Importance of every head of ``kinds`` over ``pairs`` of (source ids, output ids), each ending with </s>."""
    if model.cfg.encoder_only:
        raise InputError("head importance measures the log-probability of an output: this model is encoder-only")
    batch = _batch(model, pairs)
    n, H = batch.src.shape[0], model.cfg.n_heads
    memory, _ = model.encode(batch.src, batch.src_valid)
    everyone = torch.arange(n, device=memory.device)
    intact = _logprobs(model, batch, everyone, everyone, None, memory)  # (N,)
    n_tokens = int(batch.tgt_valid.sum())
    rows = everyone.repeat(H)  # row h * N + i: sentence i with head h zeroed
    heads = torch.arange(H, device=memory.device).repeat_interleave(n)
    scores = {}
    for kind in kinds:
        layers = model.cfg.n_enc_layers if kind == "encoder" else model.cfg.n_dec_layers
        drops = np.empty((layers, H))
        for layer in range(layers):
            ablated = _logprobs(model, batch, rows, heads, attention_site(kind, layer), memory).view(H, n)
            drops[layer] = ((intact[None] - ablated).sum(dim=1) / n_tokens).cpu().numpy()
        scores[kind] = drops
    return HeadImportance(scores, float(intact.sum()) / n_tokens, n, n_tokens)
