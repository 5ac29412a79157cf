"""Head importance: how much the log-probability of an output drops when one head alone is switched off.

Michel, Levy & Neubig (2019, "Are Sixteen Heads Really Better than One?", NeurIPS,
arXiv:1905.10650) ablate heads one at a time (section 3) and define an importance score as the
expected sensitivity of the loss to a head's mask (section 4.1, a first-order estimate of that same
change). Here the change itself is measured: for each head h of each kind and layer,

```text
importance(h) = ( sum_n log p(y_n | x_n) - log p_{-h}(y_n | x_n) ) / (number of target tokens)
```

in nats per target token, with p_{-h} the model with head h's output set to zero before W_O
(`attnviz.methods.ablation`, ``zero`` mode), over sentence pairs (x_n, y_n): references, or the
model's own output. Positive: the head helps produce y; negative: the output is more likely
without it. A head can matter only together with another (heads can back each other up), which a
one-at-a-time ablation does not show.

For a language model (no encoder) a pair (x_n, y_n) is read as one text, x_n then y_n, and every
token after the first is predicted: the log-probability is the text's own, token by token.

The sentences are padded into one batch (longest first, so that a chunk of rows drops the padding
none of its rows needs), and for each layer and kind every head is ablated in the same pass: the
batch repeated once per head, each copy with its own head zeroed. A head in layer l cannot change
what comes before it, so the pass starts at layer l from the inputs recorded in one intact pass
(and a decoder or cross-attention head reuses the intact encoder output).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from attnviz.errors import InputError
from attnviz.hooks import Edit, Recorder, act_name, attention_site
from attnviz.kinds import KINDS
from attnviz.kvcache import KVCache, LayerCache
from attnviz.model import Transformer, attention_masks
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
    """The sentence pairs padded into one batch, longest first, with every layer's intact input."""

    src_valid: Tensor  # (N, S) bool
    tgt_valid: Tensor  # (N, T) bool
    labels: Tensor  # (N, T): the output, each position's next token
    src_len: Tensor  # (N,): real tokens per row, so a chunk of rows can drop the columns none of them uses
    tgt_len: Tensor
    states: dict[str, Tensor]  # intact: every layer's input, the memory, cross-attention's keys and values


def _layer_input(kind: str, layer: int) -> str:
    return (
        act_name("encoder", layer, "attn_block", "input")
        if kind == "encoder"
        else act_name("decoder", layer, "self_block", "input")
    )


def _batch(model: Transformer, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> _Batch:
    """Pad the pairs, longest first, and record every layer's input in one intact forward pass."""
    cfg, device = model.cfg, model.device
    if not pairs:
        raise InputError("head importance needs at least one sentence")
    for src, out in pairs:
        if not src or not out:
            raise InputError("every sentence and every output must have at least one token")
    pairs = sorted(pairs, key=lambda p: -max(len(p[0]), len(p[1])))  # neighbours in a chunk have like lengths
    src, src_valid = pad_batch([tuple(s) for s, _ in pairs], cfg.pad_id, device)
    if cfg.decoder_only:  # a language model reads x then y, and predicts every token after the first
        tgt, tgt_valid = pad_batch([(*s, *out[:-1]) for s, out in pairs], cfg.pad_id, device)
        labels, _ = pad_batch([(*s[1:], *out) for s, out in pairs], cfg.pad_id, device)
        src_valid = src_valid[:, :0]  # no encoder: no source columns
    else:
        tgt, tgt_valid = pad_batch([(cfg.bos_id, *out[:-1]) for _, out in pairs], cfg.pad_id, device)
        labels, _ = pad_batch([tuple(out) for _, out in pairs], cfg.pad_id, device)
    names = {_layer_input("decoder", i) for i in range(cfg.n_dec_layers)}
    if not cfg.decoder_only:
        names |= {"memory"} | {_layer_input("encoder", i) for i in range(cfg.n_enc_layers)}
        names |= {act_name(attention_site("cross", i), part) for i in range(cfg.n_dec_layers) for part in "kv"}
    with Recorder(names) as rec:
        if cfg.decoder_only:
            model(None, tgt, None, tgt_valid, return_logits=False)
        else:
            model(src, tgt, src_valid, tgt_valid, return_logits=False)
    return _Batch(src_valid, tgt_valid, labels, src_valid.sum(1), tgt_valid.sum(1), rec.tensors)


def _logprobs(model: Transformer, batch: _Batch, rows: Tensor, heads: Tensor, kind: str, layer: int) -> Tensor:
    """Each row's summed output log-probability: row r is sentence ``rows[r]`` with head ``heads[r]`` of
    ``kind``'s attention in ``layer`` zeroed (``heads[r]`` -1: nothing zeroed).

    The layers before ``layer`` are not recomputed: they cannot see the head, and their outputs
    (each layer's recorded input) are taken from the intact pass; so are cross-attention's keys and
    values when the encoder is intact (passed through the layers' key/value cache, as in decoding).
    The rest runs through the model's own layer modules, the head zeroed by an Edit of its
    ``heads`` point.
    """
    cfg = model.cfg
    per_row = int(max(batch.src_len.max(), batch.tgt_len.max())) * max(cfg.tgt_vocab_size, cfg.d_ff, cfg.d_model)
    chunk = max(1, MAX_ELEMENTS // per_row)
    site = act_name(attention_site(kind, layer), "heads")
    out = []
    for start in range(0, rows.shape[0], chunk):
        r, h = rows[start : start + chunk], heads[start : start + chunk]
        S, T = int(batch.src_len[r].max()), int(batch.tgt_len[r].max())  # padding no row of the chunk needs: dropped
        src_valid, tgt_valid = batch.src_valid[r, :S], batch.tgt_valid[r, :T]
        masks = attention_masks(None if cfg.decoder_only else src_valid, tgt_valid)
        keep = torch.ones(r.shape[0], cfg.n_heads, 1, 1, device=r.device)
        zeroed = torch.nonzero(h >= 0)[:, 0]
        keep[zeroed, h[zeroed]] = 0.0
        with Edit({site: lambda x, keep=keep: x * keep.to(x.dtype)}):  # x (R, H, Q, Dh)
            if kind == "encoder":
                x = batch.states[_layer_input("encoder", layer)][r, :S]
                for block in model.encoder_layers[layer:]:
                    x = block(x, masks["encoder"])[0]
                memory, first = model.encoder_norm(x), 0
            elif cfg.decoder_only:
                memory, first = None, layer
            else:
                memory, first = batch.states["memory"][r, :S], layer
            x = batch.states[_layer_input("decoder", first)][r, :T]
            for i, block in enumerate(model.decoder_layers[first:], start=first):
                cache = None
                if kind != "encoder" and memory is not None:  # the encoder output is intact: its keys and values
                    k, v = (batch.states[act_name(attention_site("cross", i), p)][r, :, :S] for p in "kv")
                    cache = LayerCache(KVCache(grows=True), KVCache(grows=False, k=k, v=v))
                x = block(x, memory, masks["decoder"], masks["cross"], cache=cache)[0]
            logits = model.logits(model.decoder_norm(x))  # (R, T, V)
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.labels[r, :T, None])[..., 0]  # (R, T)
        out.append((logp * tgt_valid).sum(dim=-1).double())
    return torch.cat(out)


@torch.no_grad()
def head_importance(
    model: Transformer, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], kinds: Sequence[str] = KINDS
) -> HeadImportance:
    """Importance of every head of ``kinds`` over ``pairs`` of (source ids, output ids), each ending with </s>."""
    if model.cfg.encoder_only:
        raise InputError("head importance measures the log-probability of an output: this model is encoder-only")
    batch = _batch(model, pairs)
    n, H = batch.labels.shape[0], model.cfg.n_heads
    device = batch.labels.device
    everyone = torch.arange(n, device=device)
    # The intact baseline runs the same code with nothing zeroed (heads -1), so that a head without
    # effect scores 0 up to rounding.
    intact = _logprobs(model, batch, everyone, torch.full((n,), -1, device=device), "decoder", 0)  # (N,)
    n_tokens = int(batch.tgt_valid.sum())
    rows = everyone.repeat_interleave(H)  # row i * H + h: sentence i with head h zeroed (like lengths together)
    heads = torch.arange(H, device=device).repeat(n)
    scores = {}
    for kind in kinds:
        layers = model.cfg.n_layers_of(kind)
        if not layers:  # a kind this model does not have (a language model's encoder and cross-attention)
            continue
        drops = np.empty((layers, H))
        for layer in range(layers):
            ablated = _logprobs(model, batch, rows, heads, kind, layer).view(n, H)
            drops[layer] = ((intact[:, None] - ablated).sum(dim=0) / n_tokens).cpu().numpy()
        scores[kind] = drops
    return HeadImportance(scores, float(intact.sum()) / n_tokens, n, n_tokens)
