"""Keys and values kept between decoding steps: the state of one decoding, never part of the model.

Decoding feeds the decoder only the newest token at each step; the keys and values of earlier
positions come from here (`attnviz.decoding`), and beam search reorders them with ``select``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class KVCache:
    """Keys and values one attention keeps between decoding steps: self-attention's grow by the new
    positions at every step (``grows``), cross-attention's are the encoder output's, projected once."""

    grows: bool
    k: Tensor | None = None  # (B, H, K, Dh)
    v: Tensor | None = None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values to attend to, after storing this step's."""
        if self.grows and self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)  # earlier positions first
        self.k, self.v = k, v
        return k, v

    def select(self, index: Tensor) -> KVCache:
        """The cache for the batch rows in ``index`` (beam search reorders hypotheses)."""
        take = lambda t: None if t is None else t.index_select(0, index)  # noqa: E731
        return KVCache(self.grows, take(self.k), take(self.v))


@dataclass
class LayerCache:
    """The key/value caches of one decoder layer's two attentions, kept between decoding steps."""

    self_attn: KVCache
    cross_attn: KVCache

    @classmethod
    def empty(cls) -> LayerCache:
        return cls(KVCache(grows=True), KVCache(grows=False))

    @property
    def length(self) -> int:
        """How many target positions the cache already holds."""
        return 0 if self.self_attn.k is None else self.self_attn.k.shape[2]

    def select(self, index: Tensor) -> LayerCache:
        return LayerCache(self.self_attn.select(index), self.cross_attn.select(index))
