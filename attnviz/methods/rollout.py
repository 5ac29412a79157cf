"""Attention rollout through the encoder and the decoder: how the input tokens flow into each position.

The encoder follows Abnar & Zuidema (2020, "Quantifying Attention Flow in Transformers",
arXiv:2005.00928), as `attnviz.analysis.attention_rollout`: per layer the heads' mean map W,
the residual connection as 0.5 I, and the layers multiplied, R_enc = A_L ... A_1 with A = 0.5 W + 0.5 I.

The decoder follows the structure of ALTI+ (Ferrando et al., 2022, "Towards Opening the Black Box of
Neural Machine Translation: Source and Target Contributions to the Model", EMNLP, arXiv:2205.11631,
section 3), with the same attention-weight contributions instead of ALTI's: each decoder position
holds a mixture of the T target tokens and the S source tokens, a row of P = [P_src | P_tgt]
(T x (S + T)), starting from P = [0 | I] (position t is its own embedding). Per decoder layer:

```text
self-attention:   P <- (0.5 W_self + 0.5 I) P                      (mixes target positions)
cross-attention:  P <- 0.5 P + 0.5 [W_cross R_enc | 0]             (the residual keeps half;
                                                                    the other half is source)
```

with W_self and W_cross that layer's mean maps over heads and R_enc the encoder's whole rollout
(the memory every decoder layer reads). After layer l, ``cross[l]`` is P_src (T x S) and
``decoder[l]`` is P_tgt (T x T): together each row sums to 1, so a row says how much of that target
position comes from the source and how much from the target prefix.

Assumptions, as in rollout: information mixes linearly through the attention weights alone; heads
count equally; the residual path weighs as much as the attention path; the values, W_O, the
feed-forward networks and the LayerNorms are ignored. It is a picture of possible token mixing,
not an attribution of the output.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from attnviz.analysis import attention_rollout, head_mean
from attnviz.methods.common import Contributions, check_pair
from attnviz.model import Transformer


def decoder_rollout(
    decoder_maps: np.ndarray, cross_maps: np.ndarray, encoder_rollout: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(target part (L, T, T), source part (L, T, S)) of the decoder's rollout after each layer, float64.

    ``decoder_maps`` (L, H, T, T) and ``cross_maps`` (L, H, T, S) are per-head post-softmax maps;
    ``encoder_rollout`` (S, S) is the encoder's rollout after its last layer.
    """
    L, _, T, _ = decoder_maps.shape
    S = cross_maps.shape[-1]
    self_mix = 0.5 * head_mean(decoder_maps).astype(np.float64) + 0.5 * np.eye(T)  # (L, T, T)
    from_source = head_mean(cross_maps).astype(np.float64) @ encoder_rollout  # (L, T, S): memory -> source tokens
    flow = np.concatenate([np.zeros((T, S)), np.eye(T)], axis=1)  # (T, S + T): [source | target]
    source, target = np.empty((L, T, S)), np.empty((L, T, T))
    for layer in range(L):
        flow = self_mix[layer] @ flow
        flow = 0.5 * flow
        flow[:, :S] += 0.5 * from_source[layer]
        source[layer], target[layer] = flow[:, :S], flow[:, S:]
    return target, source


@torch.no_grad()
def rollout(model: Transformer, src: Tensor, tgt: Tensor | None = None, position: int | None = None) -> Contributions:
    """The rollout after each layer: ``encoder`` (L, S, S); with a decoder, ``decoder`` (L, T, T) and ``cross``."""
    check_pair(model, src, tgt)
    attention = model(src, tgt, return_attention=True, return_logits=False).attention
    if model.cfg.decoder_only:  # a language model: the rollout of its causal self-attention alone
        decoder = attention_rollout(attention.stacked("decoder")[:, 0].double().cpu().numpy())
        return Contributions({"decoder": decoder.astype(np.float32)})
    encoder = attention_rollout(attention.stacked("encoder")[:, 0].double().cpu().numpy())
    maps = {"encoder": encoder.astype(np.float32)}
    if attention.decoder:
        target, source = decoder_rollout(
            attention.stacked("decoder")[:, 0].double().cpu().numpy(),
            attention.stacked("cross")[:, 0].double().cpu().numpy(),
            encoder[-1],
        )
        maps["decoder"], maps["cross"] = target.astype(np.float32), source.astype(np.float32)
    return Contributions(maps)
