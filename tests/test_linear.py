"""The linear layers' kernel choice: oneDNN where it applies gives F.linear's numbers, else F.linear runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import EAGER_ACTIVATIONS, seeded_model
from torch.profiler import ProfilerActivity, profile

from attnviz.linear import (
    MIN_WORK,
    Linear,
    _onednn_bf16_supported,
    linear,
    onednn_enabled,
    onednn_supported,
    use_onednn,
)
from attnviz.model import TransformerConfig

needs_onednn = pytest.mark.skipif(not onednn_supported(), reason="this torch or CPU has no oneDNN linear kernel")
EAGER = {None: lambda x: x, **EAGER_ACTIVATIONS}


def ran_onednn(fn) -> bool:
    """Whether calling ``fn`` ran oneDNN's linear kernel (read from torch's profiler)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return any("_linear_pointwise" in event.name for event in prof.events())


def operands(rows: int, d_in: int, d_out: int, seed: int = 0, batch: tuple[int, ...] = (1,)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, rows, d_in, generator=g)
    return x, torch.randn(d_out, d_in, generator=g) / d_in**0.5, torch.randn(d_out, generator=g)


def assert_like_f_linear(got, want):
    """Equal to F.linear up to summation order: float32 rounding, about 1e-6 of the values' size."""
    torch.testing.assert_close(got, want, atol=2e-5 * float(want.abs().max()), rtol=0)


@needs_onednn
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "swish"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("batch", [(1,), (3,), (2, 2), ()], ids=["1", "3", "2x2", "2d"])
def test_onednn_gives_f_linears_numbers(activation, with_bias, batch):
    x, w, b = operands(70, 256, 512, batch=batch)  # 70 * 256 * 512 multiply-adds: above MIN_WORK
    b = b if with_bias else None
    with torch.no_grad():
        assert ran_onednn(lambda: linear(x, w, b, activation))
        got = linear(x, w, b, activation)
    assert got.shape == (*batch, 70, 512)
    assert_like_f_linear(got, EAGER[activation](F.linear(x, w, b)))


@pytest.mark.parametrize(
    "case",
    ["small", "float64", "strided input", "strided weight", "switched off"],
)
def test_where_onednn_does_not_pay_or_cannot_run_f_linear_runs(case):
    x, w, b = operands(64, 512, 512)
    context = use_onednn(case != "switched off")
    if case == "small":
        x, w, b = operands(8, 128, 128)
        assert 8 * 128 * 128 < MIN_WORK
    elif case == "float64":
        x, w, b = x.double(), w.double(), b.double()
    elif case == "strided input":
        x = torch.randn(1, 600, 64).transpose(-2, -1)[..., :512]  # (1, 64, 512), not contiguous
    elif case == "strided weight":
        w = w.T.contiguous().T
    with torch.no_grad(), context:
        assert not ran_onednn(lambda: linear(x, w, b))
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))  # bit for bit: the very same call


@needs_onednn
def test_training_takes_f_linear_and_gets_its_gradients():
    """oneDNN's kernel has no backward; while autograd records, F.linear must run."""
    x, w, b = operands(64, 512, 512)
    w.requires_grad_(True)
    assert not ran_onednn(lambda: linear(x, w, b, "relu"))
    (grad,) = torch.autograd.grad(linear(x, w, b, "relu").sum(), w)
    (expected,) = torch.autograd.grad(F.relu(F.linear(x, w, b)).sum(), w)
    assert torch.equal(grad, expected)
    with torch.no_grad():
        assert ran_onednn(lambda: linear(x, w, b))  # the same weight, not recording: oneDNN


def test_an_unknown_activation_is_refused():
    x, w, b = operands(2, 4, 4)
    with pytest.raises(ValueError, match="activation must be one of"):
        linear(x, w, b, "tanh")


def test_linear_is_an_nn_linear_with_the_same_state_dict():
    ours, theirs = Linear(6, 3), torch.nn.Linear(6, 3)
    assert isinstance(ours, torch.nn.Linear)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 6)
    assert torch.equal(ours(x), theirs(x))


@needs_onednn
def test_the_base_model_gives_the_same_maps_and_logits_with_and_without_onednn():
    cfg = TransformerConfig(src_vocab_size=1000, tgt_vocab_size=1000, n_enc_layers=2, n_dec_layers=2)
    model = seeded_model(cfg, seed=3)
    g = torch.Generator().manual_seed(4)
    src, tgt = torch.randint(4, 1000, (2, 40), generator=g), torch.randint(4, 1000, (2, 30), generator=g)
    with torch.no_grad():
        assert ran_onednn(lambda: model(src, tgt))
        fast = model(src, tgt, return_attention=True)
        with use_onednn(False):
            assert not ran_onednn(lambda: model(src, tgt))
            plain = model(src, tgt, return_attention=True)
    torch.testing.assert_close(fast.logits, plain.logits, atol=1e-4, rtol=1e-5)
    for kind in ("encoder", "decoder", "cross"):
        for got, want in zip(getattr(fast.attention, kind), getattr(plain.attention, kind), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_the_switch_restores_what_was_there():
    before = onednn_enabled()
    with use_onednn(False):
        assert not onednn_enabled()
        with use_onednn(True):
            assert onednn_enabled() == onednn_supported()
        assert not onednn_enabled()
    assert onednn_enabled() == before


@pytest.mark.slow
def test_the_environment_variable_turns_onednn_off():
    code = "import attnviz.linear as l; print(l.onednn_enabled())"
    env = {**os.environ, "ATTNVIZ_ONEDNN": "0"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_mismatched_shapes_raise_torchs_error_and_leave_onednn_on():
    x, w, b = operands(64, 512, 512)
    before = onednn_enabled()
    with torch.no_grad(), pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        linear(x[..., :500], w, b)
    assert onednn_enabled() == before


@pytest.mark.parametrize("activation", [None, "swish"])
def test_autocast_reaches_the_product(activation):
    """Under torch.autocast the product runs in bfloat16, as F.linear's would; oneDNN's float32 kernel would not."""
    x, w, b = operands(70, 256, 512)  # large enough that oneDNN would otherwise run
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert not ran_onednn(lambda: linear(x, w, b, activation))
        got = linear(x, w, b, activation)
        want = EAGER[activation](F.linear(x, w, b))
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, want)


needs_onednn_bf16 = pytest.mark.skipif(not _onednn_bf16_supported(), reason="this torch or CPU has no oneDNN bf16")


def _layer(d_in: int = 256, d_out: int = 512, seed: int = 0) -> Linear:
    layer = Linear(d_in, d_out)
    x, w, b = operands(1, d_in, d_out, seed)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    return layer.requires_grad_(False)


@needs_onednn_bf16
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "swish"])
def test_a_linear_layer_under_bf16_autocast_runs_onednns_bf16_kernel_with_autocasts_product(activation):
    """The product of the bfloat16-rounded operands, summed in float32, rounded to bfloat16 once."""
    layer = _layer()
    x, _, _ = operands(70, 256, 512, seed=1, batch=(2,))
    rounded = {name: t.detach().to(torch.bfloat16).float() for name, t in (("w", layer.weight), ("b", layer.bias))}
    want = EAGER[activation](F.linear(x.to(torch.bfloat16).float(), rounded["w"], rounded["b"]))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert ran_onednn(lambda: layer(x, activation))
        got = layer(x, activation)
        by_autocast = EAGER[activation](F.linear(x, layer.weight, layer.bias))
    assert got.dtype == by_autocast.dtype == torch.bfloat16 and got.shape == (2, 70, 512)
    bound = 2**-8 * float(want.abs().max())  # one rounding to bfloat16 (8 bits of mantissa) of the largest value
    torch.testing.assert_close(got.float(), want, atol=bound, rtol=0)
    torch.testing.assert_close(by_autocast.float(), want, atol=2 * bound, rtol=0)  # autocast rounds twice


def _bf16_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b from the bfloat16-rounded operands, in float32."""
    r = lambda t: None if t is None else t.detach().to(torch.bfloat16).float()  # noqa: E731
    return F.linear(r(x), r(weight), r(bias))


@needs_onednn_bf16
def test_the_bf16_copy_is_made_once_and_again_when_the_weight_changes():
    layer = _layer()
    x, _, _ = operands(70, 256, 512, seed=2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x)
        copy = layer._bf16[1]
        layer(x)
        assert layer._bf16[1] is copy, "the same copy on the next call"
        layer.weight.mul_(2)  # in place, as load_state_dict writes
        doubled = layer(x)
        assert layer._bf16[1] is not copy
        bias, weight = layer.bias.clone(), layer.weight.clone()
        layer.bias = torch.nn.Parameter(torch.zeros(512), requires_grad=False)  # replaced
        no_bias = layer(x)
        layer.weight.data = -layer.weight.data  # new memory under the same Parameter, its version unchanged
        negated = layer(x)
    for got, want in (
        (doubled, _bf16_product(x, weight, bias)),
        (no_bias, _bf16_product(x, weight, None)),
        (negated, _bf16_product(x, -weight, None)),
    ):
        torch.testing.assert_close(got.float(), want, atol=2**-8 * float(want.abs().max()), rtol=0)


@needs_onednn_bf16
@pytest.mark.parametrize("case", ["gradients", "switched off", "small", "float16 autocast"])
def test_where_the_bf16_kernel_does_not_apply_autocast_runs_as_before(case):
    layer = _layer(d_in=8, d_out=8) if case == "small" else _layer()
    if case == "gradients":
        layer.requires_grad_(True)
    x, _, _ = operands(70, layer.in_features, layer.out_features, seed=3)
    dtype = torch.float16 if case == "float16 autocast" else torch.bfloat16
    with use_onednn(case != "switched off"), torch.autocast("cpu", dtype=dtype):
        assert not ran_onednn(lambda: layer(x))
        got = layer(x)
        want = F.linear(x, layer.weight, layer.bias)
    assert torch.equal(got, want) and "_bf16" not in layer.__dict__
