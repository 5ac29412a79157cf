"""Value zeroing (Mohebbi et al., 2023, "Quantifying Context Mixing in Transformers", EACL, arXiv:2301.12971,
section 2).

For layer l and key j: the value vectors of token j are set to zero in every head of that layer's
attention of one kind, the whole layer is recomputed from its original input (attention, residual
connections, LayerNorms, feed-forward network), and query i scores

```text
C_ij = 1 - cos(y_i, y_i^{-j})
```

with y_i the layer's output at position i, intact, and y_i^{-j} the same output without token j's
values. Each row is then divided by its sum (a row whose sum is 0 stays 0), so it reads as shares.
Keys a query cannot attend to (later positions in the decoder) score exactly 0.

The zeroing of token j changes only the attention of its own kind: decoder self-attention values
of target token j, cross-attention values of source token j (keys and queries are untouched). The
layer is recomputed by calling the model's own ``EncoderLayer`` / ``DecoderLayer`` on the input it
received (recorded at its ``input`` point), on a batch where row b zeroes token b through an
`Edit` of the ``v`` point, plus one row that zeroes nothing, whose output is
the intact y: one batched pass per layer and kind, not one per token, and the shared model is never
modified. A decoder layer reads the cross-attention's keys and values of the intact pass from its
key/value cache, as in decoding: the encoder output is the same in every row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnviz.errors import NonFiniteError
from attnviz.hooks import Edit, Recorder, act_name, attention_site
from attnviz.kinds import causal_mask
from attnviz.kvcache import KVCache, LayerCache
from attnviz.methods.common import Contributions, check_pair, kinds_of, layer_module, n_layers
from attnviz.model import Transformer, attention_masks

# Rows (zeroed tokens) per batched pass are capped so that one pass's largest activation, rows x
# positions x max(d_model, d_ff) floats, stays under this many elements (64 MB of float32).
MAX_ELEMENTS = 1 << 24


def _layer_input_name(kind: str, layer: int) -> str:
    block = "attn_block" if kind == "encoder" else "self_block"
    return act_name("encoder" if kind == "encoder" else "decoder", layer, block, "input")


def _zeroing_edit(site: str, tokens: Tensor) -> Edit:
    """Row b of the batch sees token ``tokens[b]``'s value vectors zeroed in every head; -1 zeroes nothing."""

    def zero(v: Tensor) -> Tensor:  # (B, H, K, Dh)
        keep = torch.ones(v.shape[0], 1, v.shape[2], 1, dtype=v.dtype, device=v.device)
        rows = torch.nonzero(tokens >= 0)[:, 0]
        keep[rows, 0, tokens[rows], 0] = 0.0
        return v * keep

    return Edit({act_name(site, "v"): zero})


def _layer_outputs(model: Transformer, kind: str, layer: int, inputs: dict, masks: dict, tokens: Tensor) -> Tensor:
    """Layer ``layer`` of ``kind`` recomputed from its recorded input, one row per entry of ``tokens``.

    A decoder layer gets the cross-attention's keys and values of the intact pass through its own
    key/value cache (as in decoding), since the encoder output is the same in every row: they are
    not projected again per row.
    """
    rows = tokens.shape[0]
    block = layer_module(model, kind, layer)
    x = inputs[_layer_input_name(kind, layer)]  # (1, Q, D)
    with _zeroing_edit(attention_site(kind, layer), tokens):
        xs = x.expand(rows, -1, -1).contiguous()  # contiguous: the fast linear kernel refuses stride-0 inputs
        if kind == "encoder":
            return block(xs, masks["encoder"])[0]
        if model.cfg.decoder_only:  # a language model's layer: no cross-attention
            return block(xs, None, masks["decoder"], None)[0]
        cross = attention_site("cross", layer)
        k, v = (inputs[act_name(cross, part)].expand(rows, -1, -1, -1) for part in ("k", "v"))  # (rows, H, S, Dh)
        cache = LayerCache(KVCache(grows=True), KVCache(grows=False, k=k, v=v))
        return block(xs, inputs["memory"], masks["decoder"], masks["cross"], cache=cache)[0]  # (rows, Q, D)


def _distances(model, kind, layer, inputs, masks, n_keys: int) -> Tensor:
    """1 - cos(y_i, y_i^{-j}) for every query i and key j: (Q, K), float64, unnormalised."""
    Q, D = inputs[_layer_input_name(kind, layer)].shape[1:]
    chunk = max(1, MAX_ELEMENTS // (Q * max(D, model.cfg.d_ff)) - 1)
    clean = None
    columns = []
    for start in range(0, n_keys, chunk):
        device = inputs[_layer_input_name(kind, layer)].device
        tokens = torch.arange(start, min(n_keys, start + chunk), device=device)
        tokens = torch.cat([tokens, tokens.new_full((1,), -1)])  # the last row zeroes nothing: the intact y
        y = _layer_outputs(model, kind, layer, inputs, masks, tokens).double()  # (rows, Q, D)
        if clean is None:
            clean = y[-1]
        zeroed = y[:-1]  # (rows - 1, Q, D)
        cos = torch.einsum("bqd,qd->bq", zeroed, clean) / (zeroed.norm(dim=-1) * clean.norm(dim=-1)).clamp_min(
            torch.finfo(torch.float64).tiny
        )
        columns.append((1.0 - cos).T)  # (Q, rows - 1): column j is token j zeroed
    return torch.cat(columns, dim=1)


@torch.no_grad()
def value_zeroing(
    model: Transformer, src: Tensor, tgt: Tensor | None = None, position: int | None = None
) -> Contributions:
    """Value-zeroing scores per layer, rows normalised to sum to 1: per kind (L, Q, K) float32."""
    check_pair(model, src, tgt)
    kinds = kinds_of(model, tgt)
    names = {_layer_input_name(kind, layer) for kind in kinds for layer in range(n_layers(model, kind))}
    if not model.cfg.decoder_only:
        names.add("memory")
    if tgt is not None and not model.cfg.decoder_only:
        names |= {act_name(attention_site("cross", i), part) for i in range(model.cfg.n_dec_layers) for part in "kv"}
    with Recorder(names) as rec:
        model(src, tgt, return_logits=False)
    if not all(bool(torch.isfinite(t).all()) for t in rec.tensors.values()):  # keys of 3e38 weights: infinite
        raise NonFiniteError(
            "the model's layer inputs, keys or values hold NaN or infinite values for this input: its numbers "
            "overflow, so no value-zeroing scores are given rather than wrong ones"
        )
    T = 0 if tgt is None else tgt.shape[1]
    masks = attention_masks(None, None, tgt_len=T, device=(tgt if src is None else src).device)
    maps = {}
    for kind in kinds:
        per_layer = []
        for layer in range(n_layers(model, kind)):
            n_keys = src.shape[1] if kind != "decoder" else T
            scores = _distances(model, kind, layer, rec.tensors, masks, n_keys).clamp_min(0.0)  # rounding dips below 0
            if kind == "decoder":  # a later token's values never reach this query: exactly 0, not rounding noise
                scores = scores * torch.from_numpy(causal_mask(T)).to(scores.device)
            sums = scores.sum(dim=-1, keepdim=True)
            # a row of zeros stays zeros; a NaN (a model whose numbers overflow) stays NaN, for the caller to refuse
            per_layer.append(torch.where(sums == 0, 0.0, scores / sums.clamp_min(torch.finfo(torch.float64).tiny)))
        maps[kind] = torch.stack(per_layer).float().cpu().numpy()
    return Contributions(maps)
