"""GPT-2, Llama and Qwen2 in the core: checked against transformers on random models of their shapes.

The references are ``AutoModelForCausalLM``-family models built here from small configs with every
parameter perturbed (tests/lm_models.py), run with eager attention: logits and every map to 1e-5,
greedy generation token for token, the key/value cache against recomputation. The decoder-only path
with the paper's parts (post-LN, ReLU, sinusoids) is checked against torch's own layers.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
import torch

import attnviz
import attnviz.api
from attnviz.checkpoints import load_checkpoint
from attnviz.cli import main
from attnviz.decoding import greedy_decode, step_through
from attnviz.errors import CheckpointError, InputError
from attnviz.export import load_export
from attnviz.methods.ablation import Ablation
from attnviz.model import Transformer, TransformerConfig, sinusoidal_table

transformers = pytest.importorskip("transformers")

from lm_models import build  # noqa: E402

pytest_plugins = ["pytester"]
from test_hub import build_cache  # noqa: E402

FAMILIES = ["gpt2", "llama", "qwen2"]
PROMPT = "When Mary and John went to the store, John gave a drink to"
ATOL = 1e-5


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request, tmp_path_factory):
    """(family, the transformers model, its folder, attnviz's bundle of that folder)."""
    folder = tmp_path_factory.mktemp(request.param) / request.param
    reference = build(request.param, folder)
    return request.param, reference, folder, load_checkpoint(folder, "cpu")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    """A model folder of each family, for the tests that read files rather than compare numbers."""
    root = tmp_path_factory.mktemp("families")
    for family in FAMILIES:
        build(family, root / family)
    return {family: root / family for family in FAMILIES}


def _prompt(bundle, text: str = PROMPT) -> torch.Tensor:
    return torch.tensor([bundle.tokenizer.encode_source(text).ids])


# ---------------------------------------------------------------------------------------------
# Numbers


def test_logits_and_every_map_equal_transformers(lm):
    _, reference, _, bundle = lm
    ids = _prompt(bundle)
    with torch.no_grad():
        theirs = reference(ids, output_attentions=True)
        ours = bundle.model(None, ids, return_attention=True)
    assert theirs.logits.abs().max() > 0.1, "the reference computes something"
    torch.testing.assert_close(ours.logits, theirs.logits, atol=ATOL, rtol=0)
    assert len(ours.attention.decoder) == len(theirs.attentions)
    for layer, (a, b) in enumerate(zip(ours.attention.decoder, theirs.attentions, strict=True)):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=f"layer {layer + 1}'s maps")
    assert ours.attention.encoder == () and ours.attention.cross == ()


def test_the_fused_kernel_runs_when_no_map_is_asked_for_and_gives_the_same_logits(lm):
    _, _, _, bundle = lm
    ids = _prompt(bundle)
    with torch.no_grad():
        fused = bundle.model(None, ids).logits
        explicit = bundle.model(None, ids, return_attention=True).logits
    torch.testing.assert_close(fused, explicit, atol=ATOL, rtol=0)


def test_greedy_generation_equals_transformers_token_for_token(lm):
    _, reference, _, bundle = lm
    ids = _prompt(bundle)
    theirs = reference.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    ours = greedy_decode(bundle.model, ids, max_len=12)[0]
    n = len(ours)  # ours stops at the end token, which the reference was told not to
    assert n > 0 and ours == theirs[0, ids.shape[1] : ids.shape[1] + n].tolist()


def test_the_key_value_cache_equals_recomputation(lm):
    """Each step's row of every head, and its probabilities, as one forward pass over the prompt and
    the output computes them."""
    _, _, _, bundle = lm
    ids = _prompt(bundle)
    decoding = step_through(bundle.model, ids, max_len=6)
    full = torch.cat([ids, torch.tensor([[s.token_id for s in decoding.steps]])], dim=1)
    with torch.no_grad():
        out = bundle.model(None, full, return_attention=True)
    maps = out.attention.stacked("decoder")[:, 0]  # (L, H, T, T)
    P = ids.shape[1]
    for t, step in enumerate(decoding.steps):
        row = P - 1 + t  # the position that predicts step t
        torch.testing.assert_close(step.self_attn, maps[:, :, row, : row + 1], atol=ATOL, rtol=0)
        prob = torch.softmax(out.logits[0, row].double(), -1)[step.token_id]
        assert step.prob == pytest.approx(float(prob), abs=1e-5)
        assert step.cross_attn is None


def test_beam_search_of_one_is_greedy_and_wider_beams_score_at_least_as_well(lm):
    _, _, _, bundle = lm
    ids = _prompt(bundle)
    greedy = step_through(bundle.model, ids, beam_size=1, max_len=8)
    assert greedy.ids == tuple(greedy_decode(bundle.model, ids, max_len=8)[0])
    beam = step_through(bundle.model, ids, beam_size=4, max_len=8)
    assert beam.steps and all(s.self_attn.shape[-1] == ids.shape[1] + s.index for s in beam.steps)


def test_a_decoder_only_model_with_the_papers_parts_is_torchs_causal_transformer():
    """Post-LN, ReLU, sinusoids and scaled embeddings, no encoder: the paper's decoder without
    cross-attention, which is torch's TransformerEncoder under a causal mask."""
    cfg = TransformerConfig(
        src_vocab_size=50, tgt_vocab_size=50, n_enc_layers=0, n_dec_layers=2, d_model=32, n_heads=4, d_ff=64,
        dropout=0.0, max_len=64,
    )  # fmt: skip
    torch.manual_seed(0)
    ours = Transformer(cfg).eval()
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=False)
    ref = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        for mine, theirs in zip(ours.decoder_layers, ref.layers, strict=True):
            a = mine.self_attn
            theirs.self_attn.in_proj_weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            theirs.self_attn.in_proj_bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
            theirs.self_attn.out_proj.weight.copy_(a.out_proj.weight)
            theirs.self_attn.out_proj.bias.copy_(a.out_proj.bias)
            theirs.linear1.weight.copy_(mine.ffn.up.weight)
            theirs.linear1.bias.copy_(mine.ffn.up.bias)
            theirs.linear2.weight.copy_(mine.ffn.down.weight)
            theirs.linear2.bias.copy_(mine.ffn.down.bias)
            for norm, block in ((theirs.norm1, mine.self_block), (theirs.norm2, mine.ffn_block)):
                norm.weight.copy_(block.norm.weight.detach() + 0.1)  # away from 1: a missing norm shows
                block.norm.weight.copy_(norm.weight)
    ids = torch.randint(0, 50, (2, 11), generator=torch.Generator().manual_seed(1))
    x = ours.tgt_embed.weight[ids] * 32**0.5 + torch.from_numpy(sinusoidal_table(11, 32))
    with torch.no_grad():
        hidden = ref(x, mask=torch.nn.Transformer.generate_square_subsequent_mask(11), is_causal=True)
        expected = hidden @ ours.tgt_embed.weight.T
        got = ours(None, ids, return_attention=True)
    torch.testing.assert_close(got.logits, expected, atol=1e-4, rtol=1e-4)
    causal = torch.triu(torch.ones(11, 11, dtype=torch.bool), 1)
    assert all(float(w[..., causal].abs().max()) == 0.0 for w in got.attention.decoder), "rows never see the future"


def test_llama3_rope_scaling_equals_transformers(tmp_path):
    rope = {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 512,
    }  # fmt: skip
    reference = build("llama", tmp_path / "l3", rope_parameters=rope, max_position_embeddings=1024)
    bundle = load_checkpoint(tmp_path / "l3", "cpu")
    assert bundle.config.rope_scaling == "llama3" and bundle.config.rope_original_max_len == 512
    ids = torch.randint(2, 300, (1, 200), generator=torch.Generator().manual_seed(0))  # each of the three bands
    with torch.no_grad():
        torch.testing.assert_close(bundle.model(None, ids).logits, reference(ids).logits, atol=1e-4, rtol=0)


LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def _without_lengths(config: dict) -> None:
    config.pop("max_position_embeddings")
    config["rope_parameters"].pop("original_max_position_embeddings", None)


def _as_mistral(config: dict) -> None:
    config.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None, attention_bias=True)


@pytest.mark.parametrize(
    ("family", "edit"),
    [
        ("llama", lambda c: c.update(rope_parameters={"rope_type": "default"}, rope_theta=50.0)),  # theta at the top
        ("qwen2", lambda c: c.update(mlp_bias=True)),  # Qwen2 reads no mlp_bias
        ("llama", _as_mistral),  # Mistral reads no attention_bias
    ],
    ids=["theta at the top level", "qwen2 mlp_bias", "mistral attention_bias"],
)
def test_config_fields_are_read_as_transformers_reads_them(tmp_path, family, edit):
    """Fields a family's transformers class ignores, or takes from another place, gave other maps (an audit found
    up to 0.09 apart) or a refusal that blamed the weights file."""
    import transformers

    build(family, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    edit(config)
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m", attn_implementation="eager").eval()
    bundle = load_checkpoint(tmp_path / "m", "cpu")
    ids = _prompt(bundle)
    with torch.no_grad():
        torch.testing.assert_close(bundle.model(None, ids).logits, reference(ids).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("family", "overrides", "edit", "read"),
    [
        ("qwen2", {"rope_parameters": LLAMA3}, _without_lengths, ("rope_original_max_len", 32768)),
        (
            "llama",
            {"rope_parameters": LLAMA3},
            lambda c: (_as_mistral(c), _without_lengths(c)),
            ("rope_original_max_len", 131072),
        ),
        (
            "llama",
            {"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 4},
            lambda c: (_as_mistral(c), c.pop("num_key_value_heads")),
            ("kv_heads", 8),
        ),
        (
            "qwen2",
            {"hidden_size": 128, "num_attention_heads": 64, "num_key_value_heads": 32},
            lambda c: c.pop("num_key_value_heads"),
            ("kv_heads", 32),
        ),
    ],
    ids=["qwen2 llama3 length", "mistral llama3 length", "mistral key/value heads", "qwen2 key/value heads"],
)
def test_a_key_config_json_leaves_out_is_the_familys_own_default_as_in_transformers(
    tmp_path, family, overrides, edit, read
):
    """transformers fills a missing key from the family's config class (MistralConfig: 8 key/value heads and 131072
    positions, Qwen2Config: 32 and 32768), where attnviz took Llama's for every family: llama3's original length was
    2048 (logits 0.05 apart over 200 tokens, an audit found), and the key/value heads num_attention_heads (a refusal
    that blamed the weights file)."""
    import transformers

    build(family, tmp_path / "m", **overrides)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    edit(config)
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m", attn_implementation="eager").eval()
    bundle = load_checkpoint(tmp_path / "m", "cpu")
    field, value = read
    assert getattr(bundle.config, field) == value
    ids = torch.randint(2, 300, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(bundle.model(None, ids).logits, reference(ids).logits, atol=1e-4, rtol=0)


def test_an_old_style_rope_scaling_wins_over_rope_parameters_as_in_transformers(tmp_path):
    """transformers applies a rope_scaling it finds beside rope_parameters: linear here, which attnviz refuses
    rather than import as plain RoPE."""
    build("llama", tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["rope_scaling"] = {"type": "linear", "factor": 4.0}
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="'linear' is not implemented"):
        load_checkpoint(tmp_path / "m", "cpu")


def test_a_partial_rotary_factor_is_ignored_as_transformers_ignores_it_for_llama(tmp_path, caplog):
    """transformers' Llama and Qwen2 rotate every dimension whatever partial_rotary_factor says."""
    reference = build("llama", tmp_path / "partial", partial_rotary_factor=0.5)
    with caplog.at_level("WARNING", logger="attnviz"):
        bundle = load_checkpoint(tmp_path / "partial", "cpu")
    assert "partial_rotary_factor" in caplog.text
    ids = _prompt(bundle)
    with torch.no_grad():
        torch.testing.assert_close(bundle.model(None, ids).logits, reference(ids).logits, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------
# Tokens


def test_ids_are_exactly_the_tokenizers_with_the_bos_a_post_processor_adds(lm):
    from tokenizers import Tokenizer

    family, _, folder, bundle = lm
    expected = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(PROMPT).ids
    encoded = bundle.tokenizer.encode_source(PROMPT)
    assert list(encoded.ids) == expected
    assert (encoded.tokens[0] == "<s>") == (family == "llama")
    # The special tokens' text typed in a prompt is read as text: the only special ids are those the input adds.
    specials = bundle.tokenizer.special
    typed = " ".join(bundle.tokenizer.label(i) for i in sorted(specials))
    added = [i for i in encoded.ids if i in specials]
    assert [i for i in bundle.tokenizer.encode_source(f"{typed} {PROMPT}").ids if i in specials] == added, typed
    with pytest.raises(InputError, match=r"prompt text holds U\+DCFF at character 3"):  # tokenizers' own: a TypeError
        bundle.tokenizer.encode_source("ab\udcffc")


def test_byte_level_pieces_read_as_text_and_merge_into_words(lm):
    family, _, _, bundle = lm
    tok = bundle.tokenizer
    encoded = tok.encode_source("the cat sat on the mat")
    pieces = [t for t in encoded.tokens if t != "<s>"]
    assert "".join(pieces) == "the▁cat▁sat▁on▁the▁mat", "Ġ is shown as the app's word mark"
    words = [w.text for w in encoded.words if not w.special]
    assert words == ["the", "cat", "sat", "on", "the", "mat"]
    odd = tok.encode_source("café ☕\nx")
    assert "↵" in "".join(odd.tokens), "a new line is visible"
    assert all(t.isprintable() for t in odd.tokens), odd.tokens
    assert tok.decode(odd.ids) == "café ☕\nx"


# ---------------------------------------------------------------------------------------------
# Files: sharded weights, hub ids, refusals


def test_sharded_safetensors_load_as_one_file(tmp_path):
    reference = build("llama", tmp_path / "sharded", max_shard_size="60KB")
    files = sorted(p.name for p in (tmp_path / "sharded").iterdir())
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 1, files
    bundle = load_checkpoint(tmp_path / "sharded", "cpu")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    digests = "".join(hashlib.sha256((tmp_path / "sharded" / s).read_bytes()).hexdigest() for s in shards)
    assert bundle.sha256 == hashlib.sha256(digests.encode()).hexdigest(), "every shard is in the model's digest"
    ids = _prompt(bundle)
    with torch.no_grad():
        torch.testing.assert_close(bundle.model(None, ids).logits, reference(ids).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize(("repo", "family"), [("openai-community/gpt2", "gpt2"), ("Qwen/Qwen2.5-0.5B", "qwen2")])
def test_hub_ids_load_offline_from_the_cache(repo, family, tmp_path, monkeypatch):
    build(family, tmp_path / "files")
    cache = tmp_path / "hub-cache"
    build_cache(cache, repo, tmp_path / "files")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bundle = attnviz.load(repo, device="cpu")
    assert bundle.name == repo and bundle.info["family"] == family and bundle.config.decoder_only
    assert attnviz.attention(bundle, "the cat", generate=2).decoder.shape[-1] == len(_prompt(bundle, "the cat")[0]) + 2


def _edited(lm_folder, tmp_path, edit):
    """A copy of a model folder whose config.json ``edit`` changed, and whose weights are garbage:
    a refusal must come from the config, before any weight is read."""
    folder = tmp_path / "edited"
    shutil.copytree(lm_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    for weights in folder.glob("*.safetensors"):
        weights.write_bytes(b"not weights")
    return folder


REFUSALS = {
    "yarn rope": ("llama", lambda c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "yarn"),
    "old rope_scaling": (  # config.json before transformers 5: rope_theta and rope_scaling at the top level
        "llama",
        lambda c: c.update(rope_parameters=None, rope_theta=1e4, rope_scaling={"type": "linear", "factor": 2.0}),
        "linear",
    ),
    "mistral window": ("llama", lambda c: c.update(model_type="mistral", sliding_window=4096), "sliding_window"),
    # transformers' MistralConfig reads an absent sliding_window as 4096; only null is no window
    "mistral window absent": ("llama", lambda c: c.update(model_type="mistral"), "sliding_window"),
    # transformers applies it to llama3's frequencies, then fails on the shapes
    "llama3 partial rotary": (
        "llama",
        lambda c: c.update(rope_parameters=dict(LLAMA3), partial_rotary_factor=0.5),
        "partial_rotary_factor",
    ),
    "llama3 partial rotary in rope_parameters": (
        "qwen2",
        lambda c: c.update(rope_parameters={**LLAMA3, "partial_rotary_factor": 0.5}),
        "rope_parameters.partial_rotary_factor",
    ),
    # transformers finds no RoPE for a null type: KeyError
    "null rope_type": (
        "llama",
        lambda c: c.update(rope_scaling={"type": "linear", "rope_type": None, "factor": 4.0}),
        "rope_scaling.rope_type",
    ),
    "null type": (
        "qwen2",
        lambda c: c.update(rope_parameters={"type": None, "rope_theta": 1e4}),
        "rope_parameters.type",
    ),
    # quantized values read without their scales: every projection wrong
    "fp8": (
        "llama",
        lambda c: c.update(quantization_config={"quant_method": "fp8", "weight_block_size": [16, 16]}),
        "'fp8'",
    ),
    "gpt2 8-bit": (
        "gpt2",
        lambda c: c.update(quantization_config={"quant_method": "bitsandbytes", "load_in_8bit": True}),
        "'bitsandbytes'",
    ),
    "compression_config": (
        "qwen2",
        lambda c: c.update(compression_config={"quant_method": "compressed-tensors"}),
        "compression_config",
    ),
    "moe": ("llama", lambda c: c.update(num_local_experts=8), "mixture of experts"),
    "soft-capping": ("llama", lambda c: c.update(attn_logit_softcapping=50.0), "soft-capped"),
    "qk-norm": ("llama", lambda c: c.update(use_qk_norm=True), "QK-norm"),
    "head_dim": ("llama", lambda c: c.update(head_dim=16), "head_dim"),
    "qwen2 window": ("qwen2", lambda c: c.update(use_sliding_window=True, sliding_window=64), "use_sliding_window"),
    "gpt2 layer scaling": ("gpt2", lambda c: c.update(scale_attn_by_inverse_layer_idx=True), "inverse layer"),
    "another family": ("gpt2", lambda c: c.update(model_type="gemma2"), "gemma2"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_an_unsupported_feature_is_exit_2_with_one_line_naming_it_before_any_weight_is_read(
    case, folders, tmp_path, capsys
):
    family, edit, words = REFUSALS[case]
    edited = _edited(folders[family], tmp_path, edit)
    assert main(["generate", "--model", str(edited), "--device", "cpu", "hello"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err and "weights" not in err.lower(), err


def test_a_model_over_the_limits_is_refused_before_its_weights(lm, tmp_path, monkeypatch):
    _, _, folder, _ = lm
    edited = _edited(folder, tmp_path, lambda c: None)
    monkeypatch.setenv("ATTNVIZ_MAX_LAYERS", "1")
    with pytest.raises(CheckpointError, match="ATTNVIZ_MAX_LAYERS"):
        load_checkpoint(edited, "cpu")


# ---------------------------------------------------------------------------------------------
# The CLI and the API: one contract for every family


def test_attention_with_generate_exports_the_decoder_over_prompt_and_output(lm, tmp_path, capsys):
    family, reference, folder, bundle = lm
    out = tmp_path / "lm.npz"
    assert main(["attention", "--model", str(folder), "--src", PROMPT, "--generate", "3", "--out", str(out)]) == 0
    assert "prompt with 3 generated" in capsys.readouterr().out
    with np.load(out) as z:
        assert sorted(z.files) == ["decoder", "manifest", "tgt_ids", "tgt_tokens"]
    export = load_export(out)
    prompt = _prompt(bundle)
    expected = reference.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert export.tgt_ids.tolist() == expected[0].tolist()
    L, H, T, T2 = export.decoder.shape
    assert (L, H, T, T2) == (2, bundle.config.n_heads, prompt.shape[1] + 3, prompt.shape[1] + 3)
    assert np.all(np.triu(export.decoder, 1) == 0), "causal rows never see the future"
    np.testing.assert_allclose(export.decoder.sum(-1), 1.0, atol=1e-5)
    assert export.manifest["family"] == family and export.manifest["architecture"] == "decoder-only"
    assert export.manifest["generated"] == 3 and export.manifest["src"] == PROMPT
    assert list(export.manifest["axes"]) == ["decoder"], "the manifest names the axes of the maps the file holds"


def test_generate_prints_the_continuation_and_translate_points_to_it(lm, capsys):
    _, reference, folder, bundle = lm
    assert main(["generate", "--model", str(folder), "--max-new", "5", PROMPT]) == 0
    prompt = _prompt(bundle)
    ids = reference.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=0)[0, prompt.shape[1] :]
    assert capsys.readouterr().out == bundle.tokenizer.decode(ids.tolist()) + "\n"
    assert main(["generate", "--model", str(folder), "--max-new", "3", "--beam", "3", PROMPT]) == 0
    capsys.readouterr()
    assert main(["translate", "--model", str(folder), PROMPT]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use generate" in err


@pytest.mark.parametrize("method", ["norm", "value-zeroing", "rollout", "grad-attention"])
def test_every_contribution_method_runs_on_a_language_model(lm, method, tmp_path):
    _, _, folder, bundle = lm
    out = tmp_path / f"{method}.npz"
    args = ["attribute", "--model", str(folder), "--src", "the cat sat on", "--generate", "2"]
    assert main([*args, "--method", method, "--out", str(out)]) == 0
    export = load_export(out)
    assert export.encoder is None and export.cross is None and export.src_tokens is None
    T = len(export.tgt_tokens)
    assert export.decoder.shape[-2:] == (T, T) and np.all(np.triu(export.decoder, 1) == 0)


def test_norm_based_attention_indexes_grouped_values_by_their_key_value_group(lm):
    """||a_ij v_j^g W_O^h|| with g the head's key/value group, computed from transformers' own modules."""
    family, reference, _, bundle = lm
    if family == "gpt2":
        pytest.skip("GPT-2 has one key/value head per query head")
    ids = _prompt(bundle, "the cat sat on the mat")
    export = attnviz.attribute(bundle, "the cat sat on the mat", method="norm")
    cfg = reference.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    Dh = cfg.hidden_size // H
    with torch.no_grad():
        out = reference(ids, output_attentions=True, output_hidden_states=True)
        for layer, block in enumerate(reference.model.layers):
            x = block.input_layernorm(out.hidden_states[layer])[0]  # (T, D)
            v = block.self_attn.v_proj(x).view(-1, Hkv, Dh)  # (T, Hkv, Dh)
            w_o = block.self_attn.o_proj.weight  # (D, H * Dh)
            for h in range(H):
                f = v[:, h // (H // Hkv)] @ w_o[:, h * Dh : (h + 1) * Dh].T  # (T, D)
                expected = out.attentions[layer][0, h] * f.norm(dim=-1)[None, :]
                np.testing.assert_allclose(export.decoder[layer, h], expected.numpy(), atol=1e-5)


def test_ablation_atlas_and_diff_work_on_a_language_model(lm, tmp_path, capsys):
    _, _, folder, bundle = lm
    intact = attnviz.attention(bundle, PROMPT)
    ablated = attnviz.attention(bundle, PROMPT, ablate="decoder:1.1")
    assert not np.allclose(intact.decoder[1], ablated.decoder[1]), "a head switched off changes the next layer"
    np.testing.assert_allclose(intact.decoder[0], ablated.decoder[0], atol=1e-6)  # and not its own layer's maps
    assert isinstance(attnviz.generate(bundle, PROMPT, max_new=3, ablate=Ablation.parse("decoder:1.1", "mean")), str)
    with pytest.raises(InputError, match="no cross attention"):
        attnviz.attention(bundle, PROMPT, ablate="cross:1.1")
    atlas = attnviz.api.compute_atlas(bundle, ["the cat sat on the mat", "one two three four"])
    assert set(atlas.heads["kind"]) == {"decoder"} and len(atlas.heads) == 2 * bundle.config.n_heads
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    intact.save(a)
    attnviz.attention(bundle, PROMPT).save(b)
    assert main(["diff", str(a), str(b)]) == 0
    ablated.save(b)
    assert main(["diff", str(a), str(b)]) == 1
    assert "decoder" in capsys.readouterr().out


def test_words_merge_a_language_models_maps(lm):
    _, _, _, bundle = lm
    export = attnviz.attention(bundle, "the cat sat on the mat", words=True)
    words = [w for w in export.tgt_tokens if w != "<s>"]
    assert words == ["the", "cat", "sat", "on", "the", "mat"]
    word_axes = ["layer", "head", "query: decoder input word", "key: decoder input word"]
    assert export.manifest["axes"] == {"decoder": word_axes}  # no axes of maps the export does not hold
    np.testing.assert_allclose(export.decoder.sum(-1), 1.0, atol=1e-5)


LM_USER_TEST = """
import os

import attnviz
import attnviz.api


def test_lm_maps(attention_snapshot):
    bundle = attnviz.load(os.environ["LM_FOLDER"], device="cpu")
    attention_snapshot(attnviz.attention(bundle, "the cat sat on", ablate=os.environ.get("LM_ABLATE"), generate=2))
"""


def test_the_snapshot_plugin_checks_a_language_models_export(folders, pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("LM_FOLDER", str(folders["llama"]))
    pytester.makepyfile(test_user_lm=LM_USER_TEST)
    pytester.runpytest("--attnviz-update").assert_outcomes(passed=1)
    pytester.runpytest().assert_outcomes(passed=1)
    monkeypatch.setenv("LM_ABLATE", "decoder:1.2")
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    assert "decoder" in result.stdout.str()


def test_head_importance_of_a_language_model_is_the_drop_in_its_texts_own_log_probability(lm):
    """Each head zeroed by hand, the texts scored token by token: the same drop as head_importance's."""
    from attnviz.hooks import Edit, act_name

    _, _, _, bundle = lm
    texts = ["the cat sat on the mat", "one two three four five"]
    importance = attnviz.head_importance(bundle, texts)
    assert set(importance.scores) == {"decoder"}
    ids = [torch.tensor([bundle.tokenizer.encode_source(t).ids]) for t in texts]

    def logprob(edit: dict) -> float:
        total = 0.0
        with torch.no_grad(), Edit(edit):
            for x in ids:
                logp = torch.log_softmax(bundle.model(None, x).logits[0, :-1].double(), -1)
                total += float(logp.gather(-1, x[0, 1:, None]).sum())
        return total / sum(x.shape[1] - 1 for x in ids)

    def zero(head: int):
        return lambda h: h * (torch.arange(h.shape[1]) != head).to(h.dtype)[None, :, None, None]

    assert importance.intact_logprob == pytest.approx(logprob({}), abs=1e-5)
    for layer, head in [(0, 1), (1, 0)]:
        site = act_name("decoder", layer, "self_attn", "heads")
        drop = importance.intact_logprob - logprob({site: zero(head)})
        assert importance.scores["decoder"][layer, head] == pytest.approx(drop, abs=1e-5)
    with pytest.raises(InputError, match="no references"):
        attnviz.head_importance(bundle, texts, references=texts)


def test_compare_ablation_reads_a_language_models_prompt_under_both_models(lm):
    _, _, _, bundle = lm
    comparison = attnviz.api.compare_ablation(bundle, "the cat sat on the mat", "decoder:1.1,decoder:2.2")
    n = len(comparison.intact.tgt_tokens)
    assert len(comparison.steps) == n - 1, "one row per next token of the prompt"
    assert comparison.intact.decoder.shape == comparison.ablated.decoder.shape
    assert isinstance(comparison.intact_output, str) and isinstance(comparison.ablated_output, str)
    assert (comparison.steps["p intact"] != comparison.steps["p ablated"]).any()
