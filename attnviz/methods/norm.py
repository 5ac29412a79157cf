"""Norm-based attention (Kobayashi et al., 2020, "Attention is Not Only a Weight: Analyzing Transformers
with Vector Norms", EMNLP, arXiv:2004.10102, section 3).

Head h's output at query i is sum_j a_ij f_h(x_j) + (bias), with f_h(x) = (x W_V^h + b_V^h) W_O^h:
the value vector of key j taken through head h's rows of the output projection. The paper scores
each term by its length, ||a_ij f_h(x_j)||_2 = a_ij ||f_h(x_j)||_2 (a weight is never negative): a
large weight on a value vector that W_O shrinks to almost nothing counts for little.

x_j is what W_V multiplies: the layer input (post-LN) or its normalised copy (pre-LN) for
self-attention, the encoder output for cross-attention. It is read at the model's own ``v`` point
(`attnviz.hooks`), so whichever of these the model uses is the one scored. W_O's bias b_O
belongs to no key and is left out, as in the paper.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnviz.hooks import Recorder, act_name, attention_site
from attnviz.methods.common import Contributions, as_float32, attention_module, check_pair, kinds_of, n_layers
from attnviz.model import Transformer


def value_norms(v: Tensor, out_weight: Tensor) -> Tensor:
    """||f_h(x_j)||_2 = ||v_j^h W_O^h||_2 for every head and key: (B, H, K).

    ``v`` (B, H, K, Dh) holds the value vectors x_j W_V^h + b_V^h; ``out_weight`` is W_O as
    ``nn.Linear`` stores it, (D, H * Dh): its columns h * Dh .. (h + 1) * Dh take head h's output.
    """
    B, H, K, Dh = v.shape
    per_head = out_weight.view(out_weight.shape[0], H, Dh).permute(1, 2, 0)  # (D, H, Dh) -> (H, Dh, D)
    return torch.matmul(v, per_head).norm(dim=-1)  # (B, H, K, Dh) @ (H, Dh, D) -> (B, H, K, D) -> (B, H, K)


@torch.no_grad()
def norm_based(
    model: Transformer, src: Tensor, tgt: Tensor | None = None, position: int | None = None
) -> Contributions:
    """||a_ij f_h(x_j)||_2 for every layer, head, query i and key j: per kind (L, H, Q, K) float32.

    One forward pass records each attention's weights and value vectors; W_O comes from the model.
    """
    check_pair(model, src, tgt)
    sites = [(kind, layer) for kind in kinds_of(model, tgt) for layer in range(n_layers(model, kind))]
    names = {act_name(attention_site(kind, layer), part) for kind, layer in sites for part in ("v", "weights")}
    with Recorder(names) as rec:
        model(src, tgt, return_logits=False)
    maps: dict[str, list] = {}
    for kind, layer in sites:
        site = attention_site(kind, layer)
        weights = rec.tensors[act_name(site, "weights")]  # (1, H, Q, K)
        norms = value_norms(rec.tensors[act_name(site, "v")], attention_module(model, kind, layer).out_proj.weight)
        maps.setdefault(kind, []).append(weights * norms[:, :, None, :])  # a_ij * ||f_h(x_j)||
    return Contributions({kind: as_float32(torch.cat(per_layer)) for kind, per_layer in maps.items()})
