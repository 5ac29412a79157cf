"""Gradient-weighted attention and its relevance propagation (Chefer, Gur & Wolf, 2021, "Generic
Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers", ICCV,
arXiv:2103.15679, section 3).

What is explained: the logit y of the token the model predicts at decoder position t (the argmax of
that position's logits). For every attention map A (per layer and kind, heads h), equation 5:

```text
Abar = mean_h max(0, dy/dA_h * A_h)                      (elementwise; (Q, K) per layer)
```

The relevance maps start as R_ss = I (source x source), R_tt = I (target x target) and R_ts = 0
(target x source), and take every layer in the model's order (equations 6, 7 and 10, as in the
paper's encoder-decoder code):

```text
encoder self-attention:   R_ss += Abar R_ss
decoder self-attention:   R_tt += Abar R_tt,   R_ts += Abar R_ts
cross-attention:          R_ts += norm(R_tt)^T Abar norm(R_ss)
```

where norm(R) = rownorm(R - I) + I (equations 8 and 9: the identity set aside, each row's remaining
relevance scaled to sum to 1). Row t of R_ts is the relevance of each source token for the
prediction, row t of R_tt that of each target (decoder input) token; R_tt keeps the 1 its identity
start puts on position t itself. One deviation: a row of R - I that sums to 0 (a decoder position
after t, which receives no gradient) stays 0, where the reference code divides by zero and then
zeroes the NaNs of the product, which would blank the whole row t whenever t is not the last
position.

The gradient comes from one backward pass. The shared model is not modified: its parameters do not
require grad; the embeddings' outputs are replaced (`Edit`) by copies that do,
and the weights are recorded attached to the graph (``Recorder(keep_graph=True)``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from attnviz.errors import InputError
from attnviz.hooks import Edit, Recorder, act_name, attention_site
from attnviz.methods.common import Contributions, as_float32, check_pair, kinds_of, n_layers
from attnviz.model import Transformer


def residual_normalised(relevance: np.ndarray) -> np.ndarray:
    """Equations 8 and 9: rownorm(R - I) + I, a row whose R - I sums to 0 staying the identity row."""
    n = relevance.shape[0]
    without_identity = relevance - np.eye(n)
    sums = without_identity.sum(axis=-1, keepdims=True)
    scaled = np.divide(without_identity, sums, out=np.zeros_like(without_identity), where=sums != 0)
    return scaled + np.eye(n)


def propagate(encoder: np.ndarray, decoder: np.ndarray, cross: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(R_ss (S, S), R_tt (T, T), R_ts (T, S)) from the gradient-weighted maps, float64.

    ``encoder`` (L_enc, S, S), ``decoder`` (L_dec, T, T), ``cross`` (L_dec, T, S): Abar per layer.
    """
    S, T = encoder.shape[-1], decoder.shape[-1]
    r_ss, r_tt, r_ts = np.eye(S), np.eye(T), np.zeros((T, S))
    for a in encoder:
        r_ss = r_ss + a @ r_ss
    for a_self, a_cross in zip(decoder, cross, strict=True):
        r_tt, r_ts = r_tt + a_self @ r_tt, r_ts + a_self @ r_ts
        r_ts = r_ts + residual_normalised(r_tt).T @ a_cross @ residual_normalised(r_ss)
    return r_ss, r_tt, r_ts


def check_position(position, length: int) -> int:
    """``position`` as an int, or an InputError unless it is a decoder position 0 .. length - 1."""
    if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or not 0 <= position < length:
        raise InputError(
            f"the position must be a decoder position from 0 to {length - 1} (the decoder input has {length} "
            f"tokens), got {position!r}"
        )
    return int(position)


def _requires_grad(x: Tensor) -> Tensor:
    return x.detach().requires_grad_(True)


def grad_attention(
    model: Transformer, src: Tensor, tgt: Tensor | None = None, position: int | None = None
) -> Contributions:
    """Abar per layer and kind, (L, Q, K) float32, for the prediction at decoder position ``position``.

    ``position`` counts from 0 along the decoder input (default: the last). Extras:
    ``source_relevance`` (S,) and ``target_relevance`` (T,), rows ``position`` of R_ts and R_tt.
    Rows of the decoder-side maps after ``position`` are 0: those queries do not reach the logit.
    """
    check_pair(model, src, tgt, needs_target=True)
    T = tgt.shape[1]
    position = check_position(T - 1 if position is None else position, T)
    sites = [(kind, layer) for kind in kinds_of(model, tgt) for layer in range(n_layers(model, kind))]
    names = {act_name(attention_site(kind, layer), "weights"): (kind, layer) for kind, layer in sites}
    with torch.enable_grad():
        embeddings = ("tgt.embed",) if model.cfg.decoder_only else ("src.embed", "tgt.embed")
        with Edit(dict.fromkeys(embeddings, _requires_grad)), Recorder(names, keep_graph=True) as rec:
            logits = model(src, tgt).logits  # (1, T, V)
        for weights in rec.tensors.values():
            weights.retain_grad()
        predicted = int(logits[0, position].argmax())
        logits[0, position, predicted].backward()
    maps: dict[str, list] = {}
    for name, (kind, _) in names.items():
        weights = rec.tensors[name]  # (1, H, Q, K)
        maps.setdefault(kind, []).append((weights.grad * weights).clamp_min(0.0).mean(dim=1)[0].detach())
    stacked = {kind: as_float32(torch.stack(per_layer)) for kind, per_layer in maps.items()}
    if model.cfg.decoder_only:  # a language model: relevance flows through its self-attention alone
        r_tt = np.eye(T)
        for a in stacked["decoder"].astype(np.float64):
            r_tt = r_tt + a @ r_tt
        extras = {"target_relevance": r_tt[position].astype(np.float32)}
    else:
        _, r_tt, r_ts = propagate(*(stacked[kind].astype(np.float64) for kind in ("encoder", "decoder", "cross")))
        extras = {
            "source_relevance": r_ts[position].astype(np.float32),
            "target_relevance": r_tt[position].astype(np.float32),
        }
    return Contributions(stacked, extras, {"position": position, "predicted_token_id": predicted})
