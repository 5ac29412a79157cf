"""The rotary lesson on a random Llama-layout model: the re-rotated vectors give the model's own scores,
an independent rotation (2x2 blocks in numpy, float64) gives the same, and a shift changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnviz.checkpoints import load_checkpoint
from attnviz.errors import InputError
from attnviz.hooks import Recorder, act_name
from attnviz.lessons import rotary

pytest.importorskip("transformers")

from lm_models import build  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rope") / "llama"
    build("llama", folder)
    return load_checkpoint(folder, "cpu")


def numpy_rotation(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """x (H, T, D) turned by each position's angles, dimension i paired with i + D/2 (float64, no torch)."""
    D = x.shape[-1]
    half = D // 2
    inv = theta ** (-np.arange(half) * 2.0 / D)
    angle = positions[:, None] * inv[None, :]  # (T, D/2)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * np.cos(angle) - b * np.sin(angle), b * np.cos(angle) + a * np.sin(angle)], axis=-1)


def test_the_re_rotated_vectors_give_the_models_own_scores_and_an_independent_rotation_agrees(llama):
    ids = torch.tensor([llama.tokenizer.encode_source("the cat sat on the mat one two three").ids])
    with torch.no_grad(), Recorder({act_name("decoder", 1, "self_attn", "scores")}) as rec:
        llama.model(None, ids, return_logits=False)
    model_scores = rec.tensors[act_name("decoder", 1, "self_attn", "scores")][0]
    q, k = rotary.unrotated(llama, ids, 1)
    T = ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    ours = rotary.scores_at(llama, q, k, 0)
    torch.testing.assert_close(ours[:, causal], model_scores[:, causal], atol=1e-5, rtol=0)
    pos = np.arange(T, dtype=np.float64)
    qn = numpy_rotation(q.double().numpy(), pos, llama.config.rope_theta)
    kn = numpy_rotation(k.double().numpy(), pos, llama.config.rope_theta)
    plain = qn @ kn.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    np.testing.assert_allclose(ours[:, causal].numpy(), plain[:, causal.numpy()], atol=1e-5)


def test_a_shift_of_both_positions_changes_the_scores_by_rounding_only(llama):
    ids = torch.tensor([llama.tokenizer.encode_source("one two three four five six seven").ids])
    table = rotary.shift_check(llama, ids, 0)
    assert set(table["shift"]) == set(rotary.SHIFTS) and len(table) == len(rotary.SHIFTS) * llama.config.n_heads
    assert table["relative"].max() < 1e-5, table
    assert table["largest_change"].max() > 0, "float32 rounding shows: the check compares numbers, not one tensor"


def test_the_score_by_offset_is_the_score_of_a_pair_that_far_apart(llama):
    ids = torch.tensor([llama.tokenizer.encode_source("the cat sat on the mat").ids])
    q, k = rotary.unrotated(llama, ids, 0)
    table = rotary.score_by_offset(llama, ids, 0, query=5, key=1, max_offset=20)
    for head, offset in [(1, 0), (3, 7), (8, 20)]:
        qn = numpy_rotation(q[head - 1 : head, 5:6].double().numpy(), np.array([offset + 3.0]), llama.config.rope_theta)
        kn = numpy_rotation(k[head - 1 : head, 1:2].double().numpy(), np.array([3.0]), llama.config.rope_theta)
        expected = float((qn * kn).sum()) / np.sqrt(q.shape[-1])  # the pair moved to positions 3 and 3 + offset
        got = table[(table["head"] == head) & (table["offset"] == offset)]["score"].item()
        assert got == pytest.approx(expected, abs=1e-5)


def test_a_model_without_rotary_positions_is_refused_with_a_reason():
    import attnviz

    with pytest.raises(ValueError, match="rotary positions"):
        rotary.shift_check(attnviz.load("induction", device="cpu"), torch.tensor([[1, 5, 6]]), 0)


def test_queries_and_keys_before_the_rotation_turn_into_the_rotated_ones(llama):
    import attnviz

    rotated = attnviz.queries_keys(llama, "the cat sat on the mat")["decoder"]
    before = attnviz.queries_keys(llama, "the cat sat on the mat", rotated=False)["decoder"]
    T = rotated[0].shape[2]
    for side in (0, 1):
        assert before[side].shape == rotated[side].shape, "grouped keys are repeated per query head"
        for layer in range(llama.config.n_dec_layers):
            turned = numpy_rotation(
                before[side][layer].astype(np.float64), np.arange(T, dtype=np.float64), llama.config.rope_theta
            )
            np.testing.assert_allclose(turned, rotated[side][layer], atol=1e-4)
    group = llama.config.n_heads // llama.config.kv_heads
    np.testing.assert_array_equal(before[1][:, 0], before[1][:, group - 1])  # one key/value head serves its group
    with pytest.raises(InputError, match="rotary"):
        attnviz.queries_keys(attnviz.load("induction", device="cpu"), "a b", rotated=False)


def test_three_kinds_of_positions_on_the_same_two_measurements(llama):
    """The fits of the paper's sinusoids and RoPE's angles leave rounding; a shift moves RoPE's scores by
    rounding and an additive code's scores by far more, computed here by hand for the induction model."""
    import attnviz

    table = rotary.kinds_table(llama, torch.tensor([llama.tokenizer.encode_source("the cat sat on the mat").ids]))
    rows = table.set_index("kind")
    assert rows.loc["sinusoidal", "fit_residual"] < 1e-10 and rows.loc["rotary", "fit_residual"] < 1e-10
    assert np.isnan(rows.loc["learned", "fit_residual"]), "no learned table in a Llama model"
    assert rows.loc["rotary", "shift_change"] < 1e-5
    # an exact map exists for RoPE's angles: each (cos, sin) pair turned by k * frequency
    angles = rotary.rotary_table(40, 8, 500.0)
    inv = 500.0 ** (-np.arange(0, 8, 2) / 8)
    k = rotary.FIT_OFFSET
    c, s = angles[:, :4], angles[:, 4:]
    turned = np.concatenate([c * np.cos(k * inv) - s * np.sin(k * inv), s * np.cos(k * inv) + c * np.sin(k * inv)], 1)
    np.testing.assert_allclose(turned[:-k], angles[k:], atol=1e-12)

    induction = attnviz.load("induction", device="cpu")
    ids = torch.tensor([induction.tokenizer.encode_source("q w e r t y q w e r t y").ids])
    got = rotary.additive_shift_check(induction, ids, 0, [10])
    model = induction.model
    attn, T, Dh = model.decoder_layers[0].self_attn, ids.shape[1], induction.config.d_head

    def scores(c: int) -> torch.Tensor:  # post-LN, first layer: q = (E x sqrt(d) + PE(pos)) W_Q + b
        x = model.tgt_embed.weight[ids[0]] * induction.config.d_model**0.5 + model.pos.table[c : c + T]
        q = (x @ attn.q_proj.weight.T + attn.q_proj.bias).view(T, -1, Dh).transpose(0, 1)
        kk = (x @ attn.k_proj.weight.T + attn.k_proj.bias).view(T, -1, Dh).transpose(0, 1)
        return q @ kk.transpose(1, 2) / Dh**0.5

    with torch.no_grad():
        base, moved = scores(0), scores(10)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expected = float((moved - base)[:, causal].abs().max() / base[:, causal].abs().max())
    assert got == pytest.approx(expected, rel=1e-4) and got > 0.1, "an additive code's scores move with the positions"


@pytest.mark.parametrize(("width", "positions", "fitted"), [(768, 1024, 1024), (48, 96, 96), (64, 70, None)])
def test_a_learned_table_is_fitted_over_more_positions_than_its_width(width, positions, fitted):
    """GPT-2's learned table (768 wide, 1024 positions) had been cut to 256 positions, no more than its width, and
    the fit refused: the page's table of kinds failed for GPT-2. The residual equals numpy's least squares over
    the positions fitted; a table with no more positions than its width and the offset is not measured."""
    from types import SimpleNamespace

    from attnviz.config import TransformerConfig
    from attnviz.model import Transformer

    cfg = TransformerConfig(
        src_vocab_size=50, tgt_vocab_size=50, n_enc_layers=0, n_dec_layers=1, d_model=width, n_heads=4, d_ff=32,
        dropout=0.0, max_len=positions, pos_encoding="learned", norm_first=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    rows = rotary.kinds_table(SimpleNamespace(config=cfg, model=model)).set_index("kind")
    if fitted is None:
        assert np.isnan(rows.loc["learned", "fit_residual"])
        return
    table = model.pos.table.detach().double().numpy()[:fitted]
    k = rotary.FIT_OFFSET
    x, y = table[:-k], table[k:]
    solution = np.linalg.lstsq(x, y, rcond=None)[0]
    expected = np.linalg.norm(y - x @ solution) / np.linalg.norm(y)
    assert expected > 0.1  # a random table: far from linear, far from rounding
    np.testing.assert_allclose(rows.loc["learned", "fit_residual"], expected, rtol=1e-6)
