"""The walkthrough's stages show the model's own tensors, and those tensors chain (unit tests).

Chaining is checked against the model's own parameters: each stage's output, pushed through the
next part of the model by hand, gives the next stage's input (to 1e-5). Models: the shipped
"en-de" and "reverse", a tiny Marian-like model (concatenated sinusoids, swish, an output bias)
and a tiny encoder-only pre-LN model with learned positions.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import EAGER_ACTIVATIONS, seeded_model, tiny_config

import attnviz
from attnviz import api
from attnviz.export import ForwardPass
from attnviz.figures.walkthrough import TABLE_ROW_PX, feed_arrow, matrix_figure, matrix_heatmap, table_figure
from attnviz.hooks import Recorder
from attnviz.lessons import walkthrough as wk

ATOL = 1e-5


def tiny_walkthrough(model, S: int = 7, T: int = 5) -> ForwardPass:
    """A ForwardPass of a model built in the test (no tokenizer): made-up pieces, random ids."""
    g = torch.Generator().manual_seed(3)
    cfg = model.cfg
    src = torch.randint(4, cfg.src_vocab_size, (1, S), generator=g)
    tgt = (
        None
        if cfg.encoder_only
        else torch.cat([torch.tensor([[cfg.bos_id]]), torch.randint(4, 50, (1, T - 1), generator=g)], 1)
    )
    with torch.no_grad(), Recorder() as rec:
        model(src, tgt)
    tensors = {k: (v if k.endswith(".pos") else v[0]).float().numpy() for k, v in rec.tensors.items()}
    tgt_ids = None if tgt is None else tuple(tgt[0].tolist())
    return ForwardPass(
        tensors,
        tuple(src[0].tolist()),
        tuple(f"s{i}" for i in range(S)),
        tgt_ids,
        None if tgt is None else tuple(f"t{i}" for i in range(T)),
    )


def marian_like():
    cfg = tiny_config(pos_encoding="sinusoidal_concat", activation="swish", output_bias=True, tie_output=True)
    model = seeded_model(cfg, seed=1)
    with torch.no_grad():
        model.out_bias.normal_()  # zeros at init would hide a missing bias
    return model


def encoder_only():
    return seeded_model(tiny_config(n_dec_layers=0, norm_first=True, pos_encoding="learned", activation="gelu"), 2)


@pytest.fixture(scope="module", params=["en-de", "reverse", "marian-like", "encoder-only"])
def case(request):
    """(model, ForwardPass) for each kind of model the app can load."""
    if request.param == "marian-like":
        model = marian_like()
        return model, tiny_walkthrough(model)
    if request.param == "encoder-only":
        model = encoder_only()
        return model, tiny_walkthrough(model)
    bundle = attnviz.load(request.param, "cpu")
    return bundle.model, api.forward_pass(bundle, bundle.info["examples"][0])


def t(a) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float32))


def close(a, b, what: str) -> None:
    a = a.detach().numpy() if isinstance(a, torch.Tensor) else a
    b = b.detach().numpy() if isinstance(b, torch.Tensor) else b
    np.testing.assert_allclose(a, b, atol=ATOL, rtol=1e-5, err_msg=what)


# ---------------------------------------------------------------------------------------------
# The stages show the ForwardPass's tensors


def all_stages(model, wt, layer, head, step):
    facts = wk.ModelFacts.of(model.cfg)
    E = model.src_embed.weight.detach().numpy()
    W = (model.tgt_embed.weight if model.cfg.tie_output else model.out_proj).detach().numpy()
    return {
        key: wk.build_stage(wt, facts, key, layer, head, step, embedding=E, output_weight=W, token_of=str)
        for key, _ in wk.stage_list(model.cfg.encoder_only)
    }


def test_every_stage_shows_the_walkthrough_tensors(case):
    model, wt = case
    cfg = model.cfg
    layer, head = cfg.n_enc_layers - 1, cfg.n_heads - 1
    step = 0 if wt.tgt_ids is None else len(wt.tgt_ids) - 2
    stages = all_stages(model, wt, layer, head, step)
    assert list(stages) == [k for k, _ in wk.stage_list(cfg.encoder_only)]
    n_shown = 0
    for key, stage in stages.items():
        assert stage.text.count(". ") >= 1 and stage.text.endswith("."), (key, "two sentences")
        for m in stage.matrices:
            assert m.values.ndim == 2 and len(m.row_labels) == m.values.shape[0], (key, m.title)
            assert len(m.full_axes) == m.full.ndim
            if m.source in wt.tensors:
                assert m.full is wt.tensors[m.source], (key, m.title, "the core's own array")
                r, c = m.values.shape
                selected = m.full[head] if m.full.ndim == 3 else m.full
                np.testing.assert_array_equal(m.values, selected[:r, :c], err_msg=f"{key}: {m.title}")
                n_shown += 1
    assert n_shown >= 20
    E = model.src_embed.weight.detach().numpy()
    np.testing.assert_array_equal(stages["embedding"].matrices[0].values, E[list(wt.src_ids)])
    if not cfg.encoder_only:
        out = stages["output"]
        logits = wt.tensors["logits"][step]
        probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        best = int(np.argmax(logits))
        assert out.candidates[0][0] == str(best)
        assert out.candidates[0][1] == pytest.approx(float(probs[best]), abs=1e-6)
        assert out.chosen == str(wt.tgt_ids[step + 1]), "the next decoder input"
        W = (model.tgt_embed.weight if cfg.tie_output else model.out_proj).detach().numpy()
        rows = [int(c) for c, _ in out.candidates]
        np.testing.assert_array_equal(out.matrices[-1].values, W[rows])


def test_masks_are_the_models_own(case):
    model, wt = case
    stages = all_stages(model, wt, 0, 0, 0 if wt.tgt_ids is None else len(wt.tgt_ids) - 1)
    enc = [m for m in stages["enc_scores"].matrices if m.style == "weights"][0]
    assert enc.mask.all(), "one sentence has no padding"
    if wt.tgt_ids is not None:
        dec = [m for m in stages["dec_self"].matrices if m.style == "scores"][0]
        T = len(wt.tgt_ids)
        np.testing.assert_array_equal(dec.mask, np.tril(np.ones((T, T), dtype=bool)), err_msg="subsequent mask")
        weights = [m for m in stages["dec_self"].matrices if m.style == "weights"][0].values
        assert (weights[~dec.mask] == 0).all()


def test_decoder_stages_show_the_prefix_of_the_chosen_step(case):
    model, wt = case
    if wt.tgt_ids is None:
        assert [k for k, _ in wk.stage_list(True)][-1] == "enc_ffn", "encoder-only models stop after the encoder"
        return
    stage = all_stages(model, wt, 0, 0, 2)["dec_cross"]
    assert stage.arrow is not None and "memory" in stage.arrow[0]
    q, k = stage.matrices[1], stage.matrices[2]
    assert q.values.shape[0] == 3 and k.values.shape[0] == len(wt.src_ids)


# ---------------------------------------------------------------------------------------------
# The stages chain, recomputed from the model's own parameters


def check_attention(mha, x_q, x_kv, tensors, p, H):
    q = mha.q_proj(x_q).view(len(x_q), H, -1).transpose(0, 1)
    k = mha.k_proj(x_kv).view(len(x_kv), H, -1).transpose(0, 1)
    close(tensors[f"{p}.q"], q, f"{p}.q")
    close(tensors[f"{p}.k"], k, f"{p}.k")
    heads = t(tensors[f"{p}.heads"])
    close(tensors[f"{p}.concat"], heads.transpose(0, 1).reshape(heads.shape[1], -1), f"{p}.concat")
    close(tensors[f"{p}.out"], mha.out_proj(t(tensors[f"{p}.concat"])), f"{p}.out")
    w = t(tensors[f"{p}.weights"])
    close(heads, w @ t(tensors[f"{p}.v"]), f"{p}.heads")


def ffn_hidden(ffn, x, activation):
    """The feed-forward hidden layer from the module's weights with torch's own ops."""
    return EAGER_ACTIVATIONS[activation](F.linear(x, ffn.up.weight, ffn.up.bias))


def check_block(block, tensors, p, sub_out):
    residual = t(tensors[f"{p}.input"]) + t(tensors[sub_out])
    close(tensors[f"{p}.residual"], residual, f"{p}.residual")
    expected = residual if block.norm_first else block.norm(t(tensors[f"{p}.residual"]))
    close(tensors[f"{p}.output"], expected, f"{p}.output")


@torch.no_grad()
def assert_chains(model, wt) -> None:
    """Each traced tensor equals the model's own parameters applied to the previous one."""
    cfg = model.cfg
    T = wt.tensors
    H = cfg.n_heads

    def pre(block, v):  # pre-LN normalises the sub-layer's input; post-LN (the paper) does not
        return block.norm(v) if cfg.norm_first else v

    def check_ffn(layer, p):
        hf = pre(layer.ffn_block, t(T[f"{p}.ffn_block.input"]))
        close(T[f"{p}.ffn.hidden"], ffn_hidden(layer.ffn, hf, cfg.activation), f"{p}.ffn.hidden")
        close(T[f"{p}.ffn.out"], layer.ffn.down(t(T[f"{p}.ffn.hidden"])), f"{p}.ffn.out")
        check_block(layer.ffn_block, T, f"{p}.ffn_block", f"{p}.ffn.out")

    scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
    close(T["src.embed"], model.src_embed.weight[list(wt.src_ids)] * scale, "src.embed = E[ids] * sqrt(d_model)")
    if not cfg.embed_norm and not cfg.type_vocab_size:
        close(T["src.input"], t(T["src.embed"]) + t(T["src.pos"]), "src.input = embed + pos")
    x = t(T["src.input"])
    for i, layer in enumerate(model.encoder_layers):
        p = f"encoder.{i}"
        close(T[f"{p}.attn_block.input"], x, f"{p} input = previous output")
        h = pre(layer.attn_block, x)
        check_attention(layer.self_attn, h, h, T, f"{p}.attn", H)
        check_block(layer.attn_block, T, f"{p}.attn_block", f"{p}.attn.out")
        close(T[f"{p}.ffn_block.input"], T[f"{p}.attn_block.output"], f"{p}.ffn_block.input")
        check_ffn(layer, p)
        x = t(T[f"{p}.ffn_block.output"])
    close(T["memory"], model.encoder_norm(x), "memory = last encoder layer output (+ final LN when pre-LN)")
    if cfg.encoder_only:
        assert not any(k.startswith(("tgt", "decoder", "logits")) for k in T)
        return
    memory = t(T["memory"])
    close(T["tgt.embed"], model.tgt_embed.weight[list(wt.tgt_ids)] * scale, "tgt.embed")
    close(T["tgt.input"], t(T["tgt.embed"]) + t(T["tgt.pos"]), "tgt.input = embed + pos")
    x = t(T["tgt.input"])
    for i, layer in enumerate(model.decoder_layers):
        p = f"decoder.{i}"
        close(T[f"{p}.self_block.input"], x, f"{p} input = previous output")
        h = pre(layer.self_block, x)
        check_attention(layer.self_attn, h, h, T, f"{p}.self_attn", H)
        check_block(layer.self_block, T, f"{p}.self_block", f"{p}.self_attn.out")
        y = t(T[f"{p}.self_block.output"])
        close(T[f"{p}.cross_block.input"], y, f"{p}.cross_block.input")
        q_in = pre(layer.cross_block, y)  # queries from the decoder; keys and values from memory
        check_attention(layer.cross_attn, q_in, memory, T, f"{p}.cross_attn", H)
        check_block(layer.cross_block, T, f"{p}.cross_block", f"{p}.cross_attn.out")
        close(T[f"{p}.ffn_block.input"], T[f"{p}.cross_block.output"], f"{p}.ffn_block.input")
        check_ffn(layer, p)
        x = t(T[f"{p}.ffn_block.output"])
    close(T["decoder_out"], x, "decoder_out = last decoder layer output")
    W = model.tgt_embed.weight if cfg.tie_output else model.out_proj
    logits = t(T["decoder_out"]) @ W.T + (model.out_bias if cfg.output_bias else 0)
    close(T["logits"], logits, "logits = decoder_out E^T (+ bias)")


def test_stages_chain(case):
    assert_chains(*case)


def test_chain_check_catches_a_wrong_tensor():
    model = marian_like()
    wt = tiny_walkthrough(model)
    wt.tensors["encoder.1.attn_block.input"] = wt.tensors["encoder.1.attn_block.input"] + 1e-3
    with pytest.raises(AssertionError, match="encoder.1 input"):
        assert_chains(model, wt)


# ---------------------------------------------------------------------------------------------
# Readable views of large tensors


def test_matrix_view_first_k_columns_and_full_csv():
    m = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = wk.matrix_view(m, ["a", "b", "a"], 2)
    np.testing.assert_array_equal(view.shown, m[:, :2])
    assert view.columns == ("dim 0", "dim 1")
    frame = pd.read_csv(io.StringIO(view.csv))
    assert list(frame.columns) == ["row", "token", "column", "value"] and len(frame) == 12
    np.testing.assert_array_equal(frame["value"].to_numpy().reshape(3, 4), m)
    assert list(frame["token"][::4]) == ["a", "b", "a"]
    with pytest.raises(ValueError, match="row labels"):
        wk.matrix_view(m, ["a"], 2)


def test_full_tensor_csv_has_every_entry(case):
    model, wt = case
    stage = all_stages(model, wt, 0, 0, 0)["enc_qkv"]
    q = stage.matrices[1]
    frame = pd.read_csv(io.StringIO(wk.matrix_csv(q, wt)), keep_default_na=False)
    assert list(frame.columns) == ["head", "source_position", "token", "d_k", "value"]
    assert len(frame) == q.full.size
    np.testing.assert_allclose(frame["value"].to_numpy().reshape(q.full.shape), q.full, rtol=1e-6)
    assert list(frame["token"][:: q.full.shape[2]][: len(wt.src_tokens)]) == list(wt.src_tokens)
    assert sorted(set(frame["head"])) == list(range(1, q.full.shape[0] + 1)), "heads from 1, as the app counts"
    assert frame["source_position"].min() == 0, "positions from 0, as the maps' axis labels"
    assert q.source.startswith("encoder.0.") and q.file_name.startswith("encoder-layer1-"), q.file_name


def test_figures_label_axes_and_hover_values(case):
    model, wt = case
    for stage in all_stages(model, wt, 0, 0, 0).values():
        for m in stage.matrices:
            fig = matrix_figure(m, 4)
            assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
            if m.style == "matrix":
                assert np.asarray(fig.data[0].z).shape == (m.values.shape[0], min(4, m.values.shape[1]))
                assert "value" in fig.data[0].hovertemplate
    fig = matrix_heatmap(np.zeros((2, 3)), ["x", "x"], "rows", "cols", "t")
    assert list(fig.data[0].y) == ["0 x", "1 x"], "repeated tokens stay apart"
    with pytest.raises(ValueError):
        matrix_heatmap(np.zeros((2, 3)), ["x"], "rows", "cols", "t")
    assert len(feed_arrow("memory", "K, V").layout.annotations) == 3


def test_the_tokens_table_for_a_room_shows_every_cell_as_it_is():
    """Presenter mode's tokens table: plotly reads tags in text, so pieces such as </s> are escaped, and come back
    exactly; every row is there, and the height holds them all (presenter mode caps it, and the rest scrolls)."""
    import html

    table = pd.DataFrame({"side": ["source"] * 3, "position": [0, 1, 2], "piece": ["<s>", "a & b", "</s>"]})
    fig = table_figure(table, "1. Tokens")
    (trace,) = fig.data
    assert [html.unescape(v) for v in trace.header.values] == ["side", "position", "piece"]
    shown = [[html.unescape(v) for v in column] for column in trace.cells.values]
    assert shown == [["source"] * 3, ["0", "1", "2"], ["<s>", "a & b", "</s>"]]
    assert "&lt;/s&gt;" in trace.cells.values[2], "escaped for plotly: a bare </s> would be read as a tag"
    assert fig.layout.height >= TABLE_ROW_PX * (len(table) + 1)
    assert fig.layout.title.text == "1. Tokens"


def test_the_rotary_stage_says_which_pair_turns_fastest_as_its_matrices_show():
    """Pair i of a head's dimensions (i, i + d_k/2) turns by position x theta^(-2i/d_k): pair 0 fastest, one
    radian per position. The stage's text had said the first pair barely turns; and a language model's input
    stage numbered its position from 1 in a sentence counting from 0."""
    bundle = attnviz.load("induction-long", "cpu")
    wt = api.forward_pass(bundle, bundle.info["examples"][0])
    facts = wk.ModelFacts.of(bundle.model.cfg)
    step = len(wt.tgt_ids) - 1
    stage = wk.build_stage(wt, facts, "rope", 0, 0, step)
    before, after = (
        next(m.values for m in stage.matrices if m.title.startswith(t))
        for t in ("Q, head 1, before", "Q, head 1, turned")
    )
    half = before.shape[1] // 2
    turned = np.angle((after[:, :half] + 1j * after[:, half:]) / (before[:, :half] + 1j * before[:, half:]))
    per_position = np.abs(turned[1])  # position 1: each pair turned once, by its own rate
    assert per_position[0] == pytest.approx(1.0, abs=1e-3), "pair 0 turns one radian per position"
    assert per_position[0] == per_position.max() and per_position[-1] < 1e-3
    assert "The first pair (i = 0) turns fastest" in stage.text
    text = wk.build_stage(wt, facts, "dec_input", step=2).text
    assert "at position 2 it sees positions 0..2" in text, text


def test_a_greedy_output_cut_at_the_length_limit_writes_no_end_token_in_the_labels(monkeypatch):
    """The last decoder row had said "→ </s>" though the output stopped at the limit unfinished, where the explorer's
    labels (the export's) say "→ …": the same input, labelled two ways."""
    from attnviz.export import row_labels

    bundle = attnviz.load("reverse", "cpu")
    monkeypatch.setattr(api, "output_limit", lambda src_len, max_len: 3)
    wt = api.forward_pass(bundle, "a t t e n t i o n")
    assert wt.tgt_truncated and len(wt.tgt_ids) == 4  # the start token and three written, none of them the end
    facts = wk.ModelFacts.of(bundle.config)
    stage = wk.build_stage(wt, facts, "dec_cross", 0, 0, len(wt.tgt_ids) - 1)
    labels = next(m.row_labels for m in stage.matrices if m.source == "decoder.0.cross_attn.weights")
    assert list(labels) == row_labels(api.attention(bundle, "a t t e n t i o n"), "cross")
    assert labels[-1].endswith("→ …"), labels
    monkeypatch.undo()
    full = api.forward_pass(bundle, "a t t e n")  # not cut: the last input writes the end token
    assert not full.tgt_truncated
    stage = wk.build_stage(full, facts, "dec_cross", 0, 0, len(full.tgt_ids) - 1)
    last = next(m.row_labels for m in stage.matrices if m.source == "decoder.0.cross_attn.weights")[-1]
    assert last.endswith("→ </s>"), last


def test_the_rotary_stage_names_the_key_value_head_every_query_head_of_a_group_reads():
    """Grouped-query attention: query head 1 had no note (its index was compared with its key/value head's, both
    0), and the keys before the rotation were titled with the query head's number, showing the group's head."""
    cfg = tiny_config(n_enc_layers=0, pos_encoding="rotary", n_heads=4, n_kv_heads=2, norm_first=True)
    model = seeded_model(cfg, 4)
    tgt = torch.tensor([[cfg.bos_id, 7, 9, 11, 13]])
    with torch.no_grad(), Recorder() as rec:
        model(None, tgt)
    tensors = {k: (v if k.endswith(".pos") else v[0]).float().numpy() for k, v in rec.tensors.items()}
    wt = ForwardPass(tensors, None, None, tuple(tgt[0].tolist()), tuple(f"t{i}" for i in range(5)))
    facts = wk.ModelFacts.of(cfg)
    unrotated = tensors["decoder.0.self_attn.k_unrotated"]
    assert unrotated.shape[0] == 2  # one per key/value head
    for head, kv in ((0, 0), (1, 0), (2, 1), (3, 1)):
        stage = wk.build_stage(wt, facts, "rope", 0, head, 4)
        assert stage.notes == (
            f"Grouped-query attention: head {head + 1} reads key/value head {kv + 1}, shared by its group.",
        ), (head, stage.notes)
        keys = next(m for m in stage.matrices if m.title.startswith("K, ") and m.title.endswith("before the rotation"))
        assert keys.title == f"K, key/value head {kv + 1}, before the rotation"
        np.testing.assert_array_equal(keys.values, unrotated[kv])
