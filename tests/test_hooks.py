"""Named points: recording and editing inside a `with` block, for this thread only, the model untouched."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from conftest import seeded_model, tiny_config

from attnviz.hooks import Edit, Recorder, act_name, attention_site
from attnviz.model import MultiHeadAttention


@pytest.fixture
def pair():
    g = torch.Generator().manual_seed(11)
    return torch.randint(4, 50, (1, 6), generator=g), torch.randint(4, 50, (1, 5), generator=g)


def test_names_are_paths_built_one_way():
    assert act_name("encoder", 0, "attn", "q") == "encoder.0.attn.q"
    assert act_name(attention_site("cross", 1), "weights") == "decoder.1.cross_attn.weights"
    assert attention_site("decoder", 0) == "decoder.0.self_attn" and attention_site("encoder", 2) == "encoder.2.attn"
    for bad in [(), ("encoder", -1), ("encoder", ""), ("a b ",), ("encoder", True)]:
        with pytest.raises(ValueError):
            act_name(*bad)
    with pytest.raises(ValueError, match="kind"):
        attention_site("self", 0)


def test_every_documented_point_is_recorded(tiny_model, pair):
    with torch.no_grad(), Recorder() as rec:
        tiny_model(*pair)
    names = set(rec.tensors)
    for top in ("src.embed", "src.pos", "src.input", "memory", "tgt.embed", "tgt.pos", "tgt.input", "decoder_out"):
        assert top in names, top
    assert "logits" in names
    for kind in ("encoder", "decoder", "cross"):
        for layer in range(2):
            for part in ("q", "k", "v", "scores", "weights", "heads", "concat", "out"):
                assert act_name(attention_site(kind, layer), part) in names
    for block in ("attn_block", "ffn_block"):
        for part in ("input", "residual", "output"):
            assert act_name("encoder", 1, block, part) in names
    assert act_name("decoder", 0, "ffn", "hidden") in names


def test_a_recorder_keeps_only_what_it_asks_for_and_changes_nothing(tiny_model, pair):
    wanted = {"memory", act_name("decoder", 1, "cross_attn", "weights")}
    with torch.no_grad():
        plain = tiny_model(*pair, return_attention=True)
        with Recorder(wanted) as rec:
            out = tiny_model(*pair)
    assert set(rec.tensors) == wanted
    # The other layers took the fused kernel here and the explicit path above: equal to rounding.
    torch.testing.assert_close(out.logits, plain.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(rec.tensors["memory"], plain.memory, atol=1e-5, rtol=0)
    cross = rec.tensors[act_name("decoder", 1, "cross_attn", "weights")]
    torch.testing.assert_close(cross, plain.attention.cross[1], atol=1e-6, rtol=0)


def test_nothing_is_recorded_outside_the_block_or_in_another_thread(tiny_model, pair):
    with torch.no_grad():
        with Recorder() as rec:
            worker = threading.Thread(target=lambda: tiny_model(*pair))  # its own context: no block
            worker.start()
            worker.join()
            assert rec.tensors == {}, "another thread's forward pass must not reach this block"
            tiny_model(*pair)
        recorded = len(rec.tensors)
        tiny_model(*pair)
    assert recorded > 0 and len(rec.tensors) == recorded


def _heads_off_reference(mha: MultiHeadAttention, x: torch.Tensor, off: list[int]) -> torch.Tensor:
    """Multi-head attention written plainly from the module's weights, some heads' outputs zeroed before W^O."""
    B, L, D = x.shape
    H, Dh = mha.n_heads, mha.d_head
    outputs = []
    for h in range(H):
        rows = slice(h * Dh, (h + 1) * Dh)
        q = x @ mha.q_proj.weight[rows].T + mha.q_proj.bias[rows]
        k = x @ mha.k_proj.weight[rows].T + mha.k_proj.bias[rows]
        v = x @ mha.v_proj.weight[rows].T + mha.v_proj.bias[rows]
        head = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(Dh), dim=-1) @ v
        outputs.append(torch.zeros_like(head) if h in off else head)
    return torch.cat(outputs, dim=-1) @ mha.out_proj.weight.T + mha.out_proj.bias


def test_an_edit_switches_heads_off_as_written_plainly():
    torch.manual_seed(2)
    mha = MultiHeadAttention(tiny_config(), site="encoder.0.attn").eval()
    x = torch.randn(2, 7, 32)
    off = [1, 3]
    zero = lambda heads: heads.index_fill(1, torch.tensor(off), 0.0)  # noqa: E731 - heads (B, H, Q, Dh)
    with torch.no_grad():
        with Edit({act_name("encoder", 0, "attn", "heads"): zero}):
            fused, _ = mha(x, x, None)
            explicit, weights = mha(x, x, None, return_attention=True)
        intact, _ = mha(x, x, None)
        expected = _heads_off_reference(mha, x, off)
    torch.testing.assert_close(fused, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(explicit, expected, atol=1e-5, rtol=0)
    assert weights is not None and not torch.allclose(intact, expected, atol=1e-3)


def test_an_edit_that_reaches_nothing_is_an_error(tiny_model, pair):
    with pytest.raises(ValueError, match="never reached"):
        with torch.no_grad(), Edit({act_name("encoder", 9, "attn", "v"): torch.zeros_like}):
            tiny_model(*pair)
    with torch.no_grad(), Edit({act_name("encoder", 9, "attn", "v"): torch.zeros_like}, strict=False):
        tiny_model(*pair)


def test_weights_can_be_recorded_but_not_edited(tiny_model, pair):
    with pytest.raises(ValueError, match="recorded but not edited"):
        with torch.no_grad(), Edit({act_name("encoder", 0, "attn", "weights"): torch.zeros_like}):
            tiny_model(*pair)


def test_an_edited_model_is_the_same_model_afterwards(pair):
    model = seeded_model(tiny_config())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    attributes = {name: dict(vars(m)) for name, m in model.named_modules()}
    with torch.no_grad():
        before = model(*pair).logits
        with Edit({act_name("decoder", 0, "cross_attn", "v"): torch.zeros_like}), Recorder():
            edited = model(*pair).logits
        after = model(*pair).logits
    assert not torch.allclose(edited, before) and torch.equal(after, before)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert {name: dict(vars(m)) for name, m in model.named_modules()}.keys() == attributes.keys()


def test_a_recorder_can_keep_the_graph_for_gradients(pair):
    """keep_graph: the recorded weights are the tensors the model used, so their gradient is d(logit)/dA."""
    model = seeded_model(tiny_config()).requires_grad_(False)
    site = attention_site("cross", 1)
    weights_name, values_name = act_name(site, "weights"), act_name(site, "v")
    make_leaf = lambda x: x.detach().requires_grad_(True)  # noqa: E731 - parameters do not require grad
    with torch.enable_grad():
        with Edit({"src.embed": make_leaf, "tgt.embed": make_leaf}), Recorder({weights_name}, keep_graph=True) as kept:
            logits = model(*pair).logits
        weights = kept.tensors[weights_name]
        weights.retain_grad()
        logits[0, -1, 7].backward()
    with torch.no_grad(), Recorder({weights_name, values_name}) as plain:
        model(*pair)
    assert not plain.tensors[weights_name].requires_grad, "without keep_graph tensors are detached"
    assert weights.grad is not None and weights.grad.abs().sum() > 0

    def logit_with(new_weights: torch.Tensor) -> float:
        """The logit when this layer's cross-attention uses ``new_weights`` (heads = weights @ values)."""
        with torch.no_grad(), Edit({act_name(site, "heads"): lambda h: new_weights @ plain.tensors[values_name]}):
            return float(model(*pair).logits[0, -1, 7])

    # The gradient is the true one: a small step along it changes the logit by grad . step.
    step = 1e-3 * torch.randn_like(weights)
    change = logit_with(weights.detach() + step) - logit_with(weights.detach())
    assert change == pytest.approx(float((weights.grad * step).sum()), rel=1e-2, abs=1e-6)
