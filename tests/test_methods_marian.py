"""Each method against an independent implementation written plainly on transformers' MarianMTModel.

Random Marian folders of several shapes (``make_marian``, no download) are loaded by our importer;
the reference reads transformers' own eager attention (``output_attentions=True``), its value
vectors and layer outputs through forward hooks on its modules, and its gradients through autograd
with ``retain_grad()`` on the attention maps it returns. Heads are switched off there by a hook on
the input of ``out_proj`` (transformers 5 has no ``head_mask``). Everything else is numpy written
from the papers' formulas. Tolerances: 1e-5, and 1e-4 for gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_marian import INPUTS, make_marian  # noqa: E402

import attnviz  # noqa: E402
from attnviz.methods.ablation import Ablation  # noqa: E402

CONFIGS = {
    "shared-swish-3heads": dict(shared=True, activation="swish", d_model=48, heads=3, enc=2, dec=3),
    "separate-relu-4heads": dict(shared=False, activation="relu", d_model=32, heads=4, enc=3, dec=2),
    "shared-relu-2heads-deep": dict(shared=True, activation="relu", d_model=16, heads=2, enc=4, dec=4, seed=3),
}
KIND_MODULES = {
    "encoder": ("encoder", "self_attn"),
    "decoder": ("decoder", "self_attn"),
    "cross": ("decoder", "encoder_attn"),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("marian") / request.param
    hf = make_marian(folder, **CONFIGS[request.param])
    hf.requires_grad_(True)
    return hf, attnviz.load(folder, device="cpu")


def _ids(bundle, src_text: str, tgt_text: str):
    tok = bundle.tokenizer
    return torch.tensor([tok.encode_source(src_text).ids]), torch.tensor([tok.encode_target(tgt_text)[0].ids])


def _attention_module(hf, kind: str, layer: int):
    stack, name = KIND_MODULES[kind]
    return getattr(getattr(hf.model, stack).layers[layer], name)


def _n_layers(hf, kind: str) -> int:
    return hf.config.encoder_layers if kind == "encoder" else hf.config.decoder_layers


def _forward(hf, src, tgt, **kwargs):
    return hf(input_ids=src, decoder_input_ids=tgt, use_cache=False, **kwargs)


def _maps(out, kind: str):
    return {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions, "cross": out.cross_attentions}[kind]


@pytest.mark.parametrize("text", INPUTS, ids=["short", "long"])
def test_norm_based_matches_transformers(pair, text):
    hf, bundle = pair
    src, tgt = _ids(bundle, *text)
    values, hooks = {}, []
    for kind in KIND_MODULES:
        for layer in range(_n_layers(hf, kind)):
            attn = _attention_module(hf, kind, layer)
            record = lambda mod, args, out, key=(kind, layer): values.__setitem__(key, out.detach())  # noqa: E731
            hooks.append(attn.v_proj.register_forward_hook(record))
    try:
        with torch.no_grad():
            out = _forward(hf, src, tgt, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    got = attnviz.attribute(bundle, *text, method="norm")
    H = hf.config.encoder_attention_heads
    for kind in KIND_MODULES:
        for layer in range(_n_layers(hf, kind)):
            weights = _maps(out, kind)[layer][0].double().numpy()  # (H, Q, K)
            v = values[kind, layer][0].double().numpy()  # (K, D): x_j W_V + b_V, every head side by side
            w_o = _attention_module(hf, kind, layer).out_proj.weight.detach().double().numpy()  # (D, D)
            Dh = v.shape[1] // H
            want = np.empty_like(weights)
            for h in range(H):
                f = v[:, h * Dh : (h + 1) * Dh] @ w_o[:, h * Dh : (h + 1) * Dh].T  # (K, D): f_h(x_j)
                want[h] = np.linalg.norm(weights[h][:, :, None] * f[None], axis=-1)  # ||a_ij f_h(x_j)||
            np.testing.assert_allclose(getattr(got, kind)[layer], want, atol=1e-5, rtol=1e-5, err_msg=f"{kind} {layer}")


def _value_zeroing_reference(hf, src, tgt, kind: str) -> np.ndarray:
    """Token j's values zeroed in one layer by a hook on v_proj; that layer's output from output_hidden_states."""
    with torch.no_grad():
        clean = _forward(hf, src, tgt, output_hidden_states=True)
    states = "encoder_hidden_states" if kind == "encoder" else "decoder_hidden_states"
    n_keys = (tgt if kind == "decoder" else src).shape[1]
    result = []
    for layer in range(_n_layers(hf, kind)):
        y = getattr(clean, states)[layer + 1][0].double().numpy()  # (Q, D): the layer's output
        scores = np.zeros((y.shape[0], n_keys))
        for j in range(n_keys):

            def zero_token(mod, args, out, j=j):
                out = out.clone()
                out[:, j] = 0.0
                return out

            hook = _attention_module(hf, kind, layer).v_proj.register_forward_hook(zero_token)
            try:
                with torch.no_grad():
                    zeroed = getattr(_forward(hf, src, tgt, output_hidden_states=True), states)[layer + 1][0]
            finally:
                hook.remove()
            zeroed = zeroed.double().numpy()
            for i in range(y.shape[0]):
                if kind == "decoder" and j > i:
                    continue  # a later token's values cannot reach query i
                cos = y[i] @ zeroed[i] / (np.linalg.norm(y[i]) * np.linalg.norm(zeroed[i]))
                scores[i, j] = max(0.0, 1.0 - cos)
        result.append(scores / scores.sum(-1, keepdims=True))
    return np.stack(result)


@pytest.mark.parametrize("kind", list(KIND_MODULES))
def test_value_zeroing_matches_transformers(pair, kind):
    hf, bundle = pair
    text = INPUTS[1]
    got = getattr(attnviz.attribute(bundle, *text, method="value-zeroing"), kind)
    want = _value_zeroing_reference(hf, *_ids(bundle, *text), kind)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_rollout_matches_transformers_maps(pair):
    hf, bundle = pair
    text = INPUTS[1]
    src, tgt = _ids(bundle, *text)
    with torch.no_grad():
        out = _forward(hf, src, tgt, output_attentions=True)
    mean = lambda maps: [m[0].double().mean(0).numpy() for m in maps]  # noqa: E731 - per layer (Q, K)
    S, T = src.shape[1], tgt.shape[1]
    flow = np.eye(S)
    for w in mean(out.encoder_attentions):
        flow = (0.5 * w + 0.5 * np.eye(S)) @ flow
    # Each target position as a mixture of the S source and T target tokens, one row at a time.
    state = [np.concatenate([np.zeros(S), np.eye(T)[t]]) for t in range(T)]
    want_src, want_tgt = [], []
    for w_self, w_cross in zip(mean(out.decoder_attentions), mean(out.cross_attentions), strict=True):
        state = [0.5 * sum(w_self[t, k] * state[k] for k in range(T)) + 0.5 * state[t] for t in range(T)]
        state = [0.5 * s + 0.5 * np.concatenate([w_cross[t] @ flow, np.zeros(T)]) for t, s in enumerate(state)]
        want_src.append(np.stack([s[:S] for s in state]))
        want_tgt.append(np.stack([s[S:] for s in state]))
    got = attnviz.attribute(bundle, *text, method="rollout")
    np.testing.assert_allclose(got.encoder[-1], flow, atol=1e-5)
    np.testing.assert_allclose(got.cross, np.stack(want_src), atol=1e-5)
    np.testing.assert_allclose(got.decoder, np.stack(want_tgt), atol=1e-5)


def _relevance_reference(enc, dec, cross, position):
    """The paper's rules 6, 7 and 10 with the normalisation of eqs. 8-9, written out for this test."""

    def normalised(r):
        n = r.shape[0]
        out = np.eye(n)
        for row in range(n):
            rest = r[row] - np.eye(n)[row]
            if rest.sum() != 0:
                out[row] += rest / rest.sum()
        return out

    S, T = enc[0].shape[0], dec[0].shape[0]
    r_ss, r_tt, r_ts = np.eye(S), np.eye(T), np.zeros((T, S))
    for a in enc:
        r_ss = r_ss + a @ r_ss
    for a_self, a_cross in zip(dec, cross, strict=True):
        r_tt, r_ts = r_tt + a_self @ r_tt, r_ts + a_self @ r_ts
        r_ts = r_ts + normalised(r_tt).T @ a_cross @ normalised(r_ss)
    return r_ts[position], r_tt[position]


@pytest.mark.parametrize("position", [None, 1])
def test_gradient_weighted_attention_matches_transformers_autograd(pair, position):
    hf, bundle = pair
    text = INPUTS[1]
    src, tgt = _ids(bundle, *text)
    t = tgt.shape[1] - 1 if position is None else position
    hf.zero_grad()
    out = _forward(hf, src, tgt, output_attentions=True)
    maps = {kind: _maps(out, kind) for kind in KIND_MODULES}
    for per_layer in maps.values():
        for a in per_layer:
            a.retain_grad()
    predicted = int(out.logits[0, t].argmax())
    out.logits[0, t, predicted].backward()
    want = {
        kind: np.stack([(a.grad[0] * a[0]).clamp(min=0).mean(0).detach().double().numpy() for a in per_layer])
        for kind, per_layer in maps.items()
    }
    got = attnviz.attribute(bundle, *text, method="grad-attention", position=position)
    assert got.manifest["position"] == t and got.manifest["predicted_token_id"] == predicted
    for kind in KIND_MODULES:
        np.testing.assert_allclose(getattr(got, kind), want[kind], atol=1e-4, rtol=1e-4, err_msg=kind)
    source, target = _relevance_reference(want["encoder"], want["decoder"], want["cross"], t)
    np.testing.assert_allclose(got.extras["source_relevance"], source, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(got.extras["target_relevance"], target, atol=1e-4, rtol=1e-4)


def _heads_off(hf, heads, replacement=None):
    """Pre-hooks on out_proj that zero (or replace) the chosen heads' slices of its input; returns the handles."""
    Dh = hf.config.d_model // hf.config.encoder_attention_heads
    handles = []
    for kind, layer, head in heads:
        cols = slice(head * Dh, (head + 1) * Dh)

        def edit(mod, args, kind=kind, layer=layer, cols=cols):
            x = args[0].clone()
            x[..., cols] = 0.0 if replacement is None else replacement[kind, layer][..., cols]
            return (x, *args[1:])

        handles.append(_attention_module(hf, kind, layer).out_proj.register_forward_pre_hook(edit))
    return handles


def _out_proj_inputs(hf, src, tgt):
    """Every attention's concatenated head outputs (the input of out_proj) in an intact pass, averaged over queries."""
    means, handles = {}, []
    for kind in KIND_MODULES:
        for layer in range(_n_layers(hf, kind)):
            record = lambda mod, args, key=(kind, layer): means.__setitem__(key, args[0].mean(dim=1, keepdim=True))  # noqa: E731
            handles.append(_attention_module(hf, kind, layer).out_proj.register_forward_pre_hook(record))
    try:
        with torch.no_grad():
            _forward(hf, src, tgt)
    finally:
        for h in handles:
            h.remove()
    return means


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablated_logits_and_maps_match_transformers(pair, mode):
    hf, bundle = pair
    text = INPUTS[0]
    src, tgt = _ids(bundle, *text)
    heads = [("encoder", 0, 1), ("decoder", _n_layers(hf, "decoder") - 1, 0), ("cross", 0, 0), ("cross", 0, 1)]
    replacement = _out_proj_inputs(hf, src, tgt) if mode == "mean" else None
    handles = _heads_off(hf, heads, replacement)
    try:
        with torch.no_grad():
            want = _forward(hf, src, tgt, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    ablation = Ablation(frozenset(heads), mode)
    got = attnviz.attention(bundle, *text, ablate=ablation)
    for kind in KIND_MODULES:
        np.testing.assert_allclose(getattr(got, kind), torch.stack(_maps(want, kind))[:, 0].numpy(), atol=1e-5)
    with torch.no_grad():
        from attnviz.methods.ablation import ablation_scope

        with ablation_scope(bundle.model, ablation, src, tgt):
            logits = bundle.model(src, tgt).logits
        intact = bundle.model(src, tgt).logits
    torch.testing.assert_close(logits, want.logits, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits, intact, atol=1e-3), "the ablation must change something"


def test_head_importance_matches_one_head_at_a_time_in_transformers(pair):
    hf, bundle = pair
    tok = bundle.tokenizer
    sentences, references = [s for s, _ in INPUTS], [r for _, r in INPUTS]

    def logprob(src_text, ref_text):
        src = torch.tensor([tok.encode_source(src_text).ids])
        tgt = torch.tensor([tok.encode_target(ref_text)[0].ids])
        labels = torch.tensor(tok.encode_target(ref_text)[1].ids)
        with torch.no_grad():
            logp = torch.log_softmax(_forward(hf, src, tgt).logits[0], -1)
        return float(logp[torch.arange(len(labels)), labels].sum()), len(labels)

    intact = [logprob(*p) for p in INPUTS]
    n_tokens = sum(n for _, n in intact)
    got = attnviz.head_importance(bundle, sentences, references)
    assert got.n_tokens == n_tokens
    assert got.intact_logprob == pytest.approx(sum(lp for lp, _ in intact) / n_tokens, abs=1e-5)
    for kind in KIND_MODULES:
        want = np.empty((_n_layers(hf, kind), hf.config.encoder_attention_heads))
        for layer in range(want.shape[0]):
            for head in range(want.shape[1]):
                handles = _heads_off(hf, [(kind, layer, head)])
                try:
                    ablated = [logprob(*p)[0] for p in INPUTS]
                finally:
                    for h in handles:
                        h.remove()
                want[layer, head] = sum(a - b for (a, _), b in zip(intact, ablated, strict=True)) / n_tokens
        np.testing.assert_allclose(got.scores[kind], want, atol=1e-5, err_msg=kind)


def test_inseq_value_zeroing_agrees_where_it_runs(pair, monkeypatch):
    """Inseq 0.7.1's value zeroing (docs/beyond.md: what the comparison found).

    Inseq is not a dependency (its metadata pulls CUDA wheels): the test skips without it, and with
    transformers 5, where Inseq 0.7.1's layer hook fails (it expects the tuple outputs of
    transformers 4). With transformers 4.57 it runs. Its encoder scores equal ours. Its decoder and
    cross-attention scores equal ours for the decoder input Inseq really feeds Marian: it embeds the
    target ids with the model's input (source) embedding table, already scaled by sqrt(d_model),
    and Marian's decoder scales them again; so they are ours under an Edit that does the same.
    Inseq also sets scores under 1e-5 to 0 before normalising, which moves rows whose total change
    is tiny by up to 0.02: the comparison applies the same rule to ours. It takes the cosine in
    float32 where we take it in float64 (ours equals the float64 reference above to 1e-5): an error
    of about 1e-7 in a cosine, in a layer whose row changes total 7e-4, is 2e-4 after normalising,
    and a score that close to the cut-off falls on either side of it; in the 16-wide model that
    moved one row by 6e-4 (the other shapes agree to 4e-5). Hence 1e-3.
    """
    inseq = pytest.importorskip("inseq")
    import math

    from attnviz.hooks import Edit
    from attnviz.methods import value_zeroing as vz

    hf, bundle = pair
    exact = vz._distances
    monkeypatch.setattr(vz, "_distances", lambda *a: exact(*a).masked_fill(exact(*a) < 1e-5, 0.0))
    tokenizer = transformers.MarianTokenizer.from_pretrained(
        str(bundle.path), separate_vocabs=not hf.config.share_encoder_decoder_embeddings
    )
    text = INPUTS[1]
    model = inseq.load_model(hf, "value_zeroing", tokenizer=tokenizer)
    try:
        out = model.attribute(text[0], text[1], attribute_target=True, show_progress=False)
    except TypeError as e:
        pytest.skip(f"inseq 0.7.1 does not run with transformers {transformers.__version__}: {e}")
    found = out.sequence_attributions[0]
    # Inseq's arrays are (key, query, layer); queries are our decoder input rows, plus one for the end token.
    encoder = found.sequence_scores["encoder_self_scores"].numpy().transpose(2, 1, 0)
    cross = found.source_attributions.numpy().transpose(2, 1, 0)
    decoder = np.nan_to_num(found.target_attributions.numpy().transpose(2, 1, 0))  # NaN above the diagonal
    src, tgt = _ids(bundle, *text)
    T = tgt.shape[1]
    np.testing.assert_allclose(encoder, vz.value_zeroing(bundle.model, src, tgt).maps["encoder"], atol=1e-3)
    scale = math.sqrt(hf.config.d_model)
    as_inseq_embeds = lambda x: torch.nn.functional.embedding(tgt, bundle.model.src_embed.weight) * scale**2  # noqa: E731
    with Edit({"tgt.embed": as_inseq_embeds}):
        fed = vz.value_zeroing(bundle.model, src, tgt).maps
    np.testing.assert_allclose(cross[:, :T], fed["cross"], atol=1e-3)
    np.testing.assert_allclose(decoder[:, :T, :T], fed["decoder"], atol=1e-3)
