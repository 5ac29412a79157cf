"""What came after 2017: the parts of GPT-2 and the Llama family that the paper's model does not have.

`attnviz.model` is the paper's Transformer; each class there takes one of these parts only
where a config asks for it, and the defaults are the paper's. Each part says where it comes from.

- `RMSNorm` (Zhang & Sennrich, 2019): LayerNorm without the mean and the bias (Llama).
- `Rotary`, rotary position embeddings, RoPE (Su et al., 2021, "RoFormer"): positions
  enter as a rotation of each query and key, by an angle proportional to the position, so that
  q·k depends on the two positions only through their offset. It is the sequel of section 3.5's
  remark that PE(pos + k) is a linear function of PE(pos). The layout is Hugging Face's "half
  split": dimension i is paired with i + d/2 (the RoFormer paper pairs 2i with 2i + 1; the two are
  the same rotation with the dimensions permuted). Llama 3.1's frequency scaling (``llama3``) is
  implemented as Meta's reference code and transformers compute it.
- `GatedFeedForward`, SwiGLU (Shazeer, 2020): the feed-forward network with a gate,
  act(x W_gate) * (x W_up), then W_down (Llama; act is SiLU, which the config calls "swish").
- `repeat_kv`, grouped-query attention (Ainslie et al., 2023): fewer key/value heads than
  query heads, each shared by a group of consecutive query heads (Llama 2 70B, Llama 3, Qwen2).
  Maps stay one per query head.

GPT-2 needs only options `attnviz.model` already had: pre-LN (Radford et al., 2019; also
Xiong et al., 2020), learned positions, and GELU, in its tanh approximation ("gelu_tanh").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor, nn

from attnviz.hooks import point
from attnviz.linear import Linear


def make_norm(kind: str, d_model: int, eps: float) -> nn.Module:
    """The normalisation a config names: the paper's LayerNorm, or RMSNorm."""
    return RMSNorm(d_model, eps) if kind == "rmsnorm" else nn.LayerNorm(d_model, eps=eps)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * g: LayerNorm without centring and without a bias, in float32."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Rotary positions


@dataclass(frozen=True)
class RopeSpec:
    """What fixes a model's rotary angles: theta, the head size, and Llama 3's frequency scaling."""

    d_head: int
    theta: float = 10000.0
    scaling: str = ""  # "" (none) or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192

    def frequencies(self) -> np.ndarray:
        """The d_head / 2 angular frequencies theta^(-2i/d_head), float64, scaled as the config says."""
        inv_freq = self.theta ** (-np.arange(0, self.d_head, 2, dtype=np.float64) / self.d_head)
        if self.scaling != "llama3":
            return inv_freq
        # Llama 3.1: long wavelengths are stretched by `factor`, short ones kept, and the band between
        # interpolated smoothly (transformers' _compute_llama3_parameters, Meta's apply_scaling).
        low_wavelen = self.original_max_len / self.low_freq_factor
        high_wavelen = self.original_max_len / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
        smooth = (self.original_max_len / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled)


@lru_cache(maxsize=64)
def _cos_sin(spec: RopeSpec, start: int, length: int, device: str) -> tuple[Tensor, Tensor]:
    """cos and sin of the angles of positions start.., (length, d_head), half-split layout.

    The angles pos * omega are computed in float64 (transformers computes them in float32, which at
    position 4000 is off by about 2e-4 rad) and rounded to float32 once. Cached: decoding asks for
    the same few tables at every layer.
    """
    angles = (start + np.arange(length, dtype=np.float64))[:, None] * spec.frequencies()[None, :]
    angles = np.concatenate([angles, angles], axis=-1)  # dimension i and i + d/2 share an angle
    cos = torch.from_numpy(np.cos(angles).astype(np.float32)).to(device)
    sin = torch.from_numpy(np.sin(angles).astype(np.float32)).to(device)
    return cos, sin


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the last axis's halves: a quarter turn of each pair (i, i + d/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Rotary(nn.Module):
    """Rotate queries or keys (B, H, L, Dh) of positions start.. by their positions' angles."""

    def __init__(self, spec: RopeSpec):
        super().__init__()
        self.spec = spec

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        cos, sin = _cos_sin(self.spec, start, x.shape[2], str(x.device))
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return x * cos + rotate_half(x) * sin


# ---------------------------------------------------------------------------------------------
# Grouped-query attention and the gated feed-forward network


def repeat_kv(x: Tensor, n_heads: int) -> Tensor:
    """Key or value heads (B, Hkv, K, Dh) -> one per query head (B, H, K, Dh): head h reads group h // (H / Hkv)."""
    B, n_kv, K, Dh = x.shape
    if n_kv == n_heads:
        return x
    return x[:, :, None].expand(B, n_kv, n_heads // n_kv, K, Dh).reshape(B, n_heads, K, Dh)


class GatedFeedForward(nn.Module):
    """SwiGLU: down(act(x W_gate) * (x W_up)), applied to each position alone."""

    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool, site: str = "ffn"):
        super().__init__()
        self.site = site
        self.gate = Linear(d_model, d_ff, bias=bias)
        self.up = Linear(d_model, d_ff, bias=bias)
        self.down = Linear(d_ff, d_model, bias=bias)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        hidden = point(self.gate(x, activation=self.activation) * self.up(x), self.site, "hidden")  # (B, L, F)
        return point(self.down(hidden), self.site, "out")
