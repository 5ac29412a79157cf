"""The linear layers' matrix multiply: oneDNN's kernel on x86-64 CPUs at inference, else ``F.linear``.

Why: on CPU, torch's ``F.linear`` calls MKL, which picks its kernels by processor vendor: on some
processors its float32 products run at a fraction of oneDNN's speed for the base model's shapes
(docs/benchmarks.md has the figures and names the CPUs). oneDNN ships inside every x86-64 torch
wheel and picks the widest vector unit the processor has; ``mkldnn::_linear_pointwise`` is the
kernel torch.compile's CPU backend uses for frozen linear layers, called here directly.
``benchmarks/bench_forward.py`` prints the effect on a whole forward pass, and the same pass with
oneDNN off.

It is the same float32 arithmetic summed in a different order: results equal ``F.linear``'s to
about 1e-6 relative (``tests/test_linear.py``). oneDNN is used only where all of these hold:

- a CPU float32 input and weight, on an x86-64 torch built with oneDNN;
- no gradient is being recorded: the kernel has no backward, so training always takes ``F.linear``;
- the product is large enough, (rows x out x in) >= ``MIN_WORK``: each oneDNN call costs about 25 us
  more than MKL's, which only pays off above about 2 million multiply-adds (docs/benchmarks.md);
- input and weight are contiguous (a strided weight is re-laid out on every call);
- no ``torch.autocast`` region is active on the CPU: there ``F.linear`` runs, so that autocast
  casts the product to bfloat16 (``attnviz atlas --precision bf16``); calling oneDNN's float32
  kernel directly would silently bypass it;
- it is not switched off: ``ATTNVIZ_ONEDNN=0`` in the environment, or `use_onednn`.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` a `Linear` layer runs oneDNN's bfloat16
kernel instead, on the same conditions otherwise, from a bfloat16 copy of its weight and bias made
once and kept while they are unchanged: autocast would cast every weight again on every call. The
product is autocast's (bfloat16 operands, float32 sums, a bfloat16 result), and the activation is
applied before the result is rounded to bfloat16 rather than after (docs/benchmarks.md has its
speed against autocast's). The copies cost 2 bytes per weight, only where bf16 ran.

Should oneDNN ever refuse a product, ``F.linear`` computes it and every later one, with a warning.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

logger = logging.getLogger(__name__)

MIN_WORK = 2**21  # multiply-adds below which MKL's lower fixed cost wins


def onednn_supported() -> bool:
    """Whether this torch and machine have oneDNN's linear kernel (x86-64 only)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._linear_pointwise  # noqa: B018  (a private op: absent from some builds)
    except (AttributeError, RuntimeError):
        return False
    return True


_enabled = onednn_supported() and os.environ.get("ATTNVIZ_ONEDNN", "1") != "0"


def _onednn_bf16_supported() -> bool:
    """Whether this torch's oneDNN runs bfloat16 products on this CPU, as torch reports it."""
    try:
        return onednn_supported() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a private op: absent from some builds
        return False


_bf16_enabled = _onednn_bf16_supported()


@contextmanager
def use_onednn(enabled: bool) -> Iterator[None]:
    """Within the block, use oneDNN where it applies (``True``) or always ``F.linear`` (``False``).

    The switch is process-wide, like ``torch.backends`` flags: meant for benchmarks and tests, not
    for threads that want different answers at the same time.
    """
    global _enabled
    before = _enabled
    _enabled = enabled and onednn_supported()
    try:
        yield
    finally:
        _enabled = before


def onednn_enabled() -> bool:
    """Whether linear layers currently take oneDNN where it applies."""
    return _enabled


def _onednn_pays(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """What both oneDNN kernels need beyond their dtypes: no gradient, matching shapes, contiguous
    operands and a product large enough to pay for the call."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if any(t.device.type != "cpu" for t in tensors):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False  # no backward: the gradients would be silently wrong
    if x.shape[-1] != weight.shape[-1] or (bias is not None and bias.shape != weight.shape[:1]):
        return False  # F.linear raises its own clear error
    if not (x.is_contiguous() and weight.is_contiguous()):
        return False  # a strided weight is re-laid out on every call (100x slower); some strided inputs fail
    rows = x.numel() // max(x.shape[-1], 1)
    return rows * weight.shape[0] * weight.shape[1] >= MIN_WORK


def _takes_onednn(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    if not _enabled or torch.is_autocast_enabled("cpu"):
        return False  # under autocast it chooses the product's precision, and only sees F.linear
    if any(t.dtype != torch.float32 for t in (x, weight) + (() if bias is None else (bias,))):
        return False
    return _onednn_pays(x, weight, bias)


def _takes_onednn_bf16(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether a Linear layer's product under CPU autocast to bfloat16 takes oneDNN's bfloat16 kernel."""
    if not (_enabled and _bf16_enabled and torch.is_autocast_enabled("cpu")):
        return False
    if torch.get_autocast_dtype("cpu") != torch.bfloat16 or x.dtype not in (torch.float32, torch.bfloat16):
        return False
    if weight.dtype != torch.float32 or (bias is not None and bias.dtype != torch.float32):
        return False
    return _onednn_pays(x, weight, bias)


# activation -> (the eager function, oneDNN's fused post-op and its algorithm argument)
ACTIVATIONS = {
    None: (None, "none", ""),
    "relu": (F.relu, "relu", ""),
    "gelu": (F.gelu, "gelu", "none"),  # the exact (erf) GELU, as F.gelu's default
    "gelu_tanh": (partial(F.gelu, approximate="tanh"), "gelu", "tanh"),  # GPT-2's "gelu_new"
    "swish": (F.silu, "swish", ""),
}


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """act(x W^T + b), shaped (..., out), like ``F.linear``; through oneDNN where that is faster.

    ``activation`` (None, "relu", "gelu" or "swish") is applied to the result; oneDNN applies it as
    the product is written, saving a pass over (and an allocation of) the output.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(a for a in ACTIVATIONS if a)} or None, got {activation!r}")
    act, post_op, algorithm = ACTIVATIONS[activation]
    if _takes_onednn(x, weight, bias):
        try:
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, post_op, [], algorithm)
        except RuntimeError as err:  # a primitive this build or CPU cannot make: F.linear from now on
            global _enabled
            _enabled = False
            logger.warning("oneDNN's linear kernel failed (%s); using F.linear from now on", err)
    out = F.linear(x, weight, bias)
    return out if act is None else act(out)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state_dict keys) whose forward calls `linear`, or
    oneDNN's bfloat16 kernel under CPU autocast to bfloat16 (see the module's docstring)."""

    def forward(self, x: Tensor, activation: str | None = None) -> Tensor:
        if activation in ACTIVATIONS and _takes_onednn_bf16(x, self.weight, self.bias):
            _, post_op, algorithm = ACTIVATIONS[activation]
            weight, bias = self._bf16_copies()
            try:
                return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), weight, bias, post_op, [], algorithm)
            except RuntimeError as err:  # a primitive this build or CPU cannot make: autocast from now on
                global _bf16_enabled
                _bf16_enabled = False
                logger.warning("oneDNN's bfloat16 linear kernel failed (%s); leaving bf16 to autocast", err)
        return linear(x, self.weight, self.bias, activation)

    def _bf16_copies(self) -> tuple[Tensor, Tensor | None]:
        """bfloat16 copies of the weight and bias, made again whenever either has changed.

        A tensor's ``_version`` counts its in-place changes (``load_state_dict`` copies in place),
        and its memory's address tells a replaced tensor (or ``.data``) from the one copied: the
        cache holds the source's memory, so that no new tensor can take its address. Two threads
        may both make a copy, never a wrong one.
        """
        params = (self.weight,) if self.bias is None else (self.weight, self.bias)
        key = tuple((t._version, t.data_ptr()) for t in params)
        cached = self.__dict__.get("_bf16")
        if cached is None or cached[0] != key:
            sources = tuple(t.detach() for t in params)  # held: the addresses in `key` stay theirs
            copies = tuple(t.to(torch.bfloat16) for t in sources)
            cached = (key, copies[0], copies[1] if len(copies) > 1 else None, sources)
            self.__dict__["_bf16"] = cached
        return cached[1], cached[2]
