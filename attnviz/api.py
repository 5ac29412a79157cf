"""The public Python API; the CLI is a thin layer over it.

```python
import attnviz

bundle = attnviz.load("en-de")  # a name under pretrained/, or a directory
attnviz.translate(bundle, "twenty-one")  # 'einundzwanzig'

# the same data as `attnviz attention`
maps = attnviz.attention(bundle, "twenty-one")
maps.cross.shape  # (layers, heads, target, source)

# value zeroing: (layers, target, source)
attnviz.attribute(bundle, "twenty-one", method="value-zeroing").cross.shape

# the output with that head switched off
attnviz.translate(bundle, "twenty-one", ablate="cross:3.2")

# every head over many sentences (build_atlas writes a corpus's to a folder)
atlas = attnviz.api.compute_atlas(bundle, ["twenty-one", "seven"])
atlas.heads[["kind", "layer", "head", "entropy"]]

# words, not pieces
attnviz.attention(bundle, "Thursday, July 2, 1998", words=True).src_tokens

# a language model: GPT-2, Llama, Qwen2
lm = attnviz.load("openai-community/gpt2")
attnviz.generate(lm, "The capital of France is", max_new=5)
attnviz.attention(lm, "The capital of France is", generate=5).decoder.shape
# (layers, heads, T, T)
```
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import sentencepiece
import torch

from attnviz import analysis
from attnviz.atlas import Atlas, build_atlas, compute_atlas, load_atlas  # noqa: F401 - public (attnviz.public)
from attnviz.atlas.build import check_texts
from attnviz.checkpoints import Bundle, load_checkpoint
from attnviz.checkpoints.catalog import DEFAULT_MODEL, MINILM, list_models, resolve_model  # noqa: F401 - public (attnviz.public)
from attnviz.decoding import MAX_OUTPUT_TOKENS, Decoding, greedy_decode, output_limit
from attnviz.decoding import step_through as _step_through
from attnviz.devices import device_name
from attnviz.errors import InputError, NonFiniteError
from attnviz.export import AXES, FORMAT_VERSION, AttentionExport, ForwardPass, load_export, maps_bytes, package_version  # noqa: F401 - public (attnviz.public)
from attnviz.hooks import Recorder, act_name, attention_site
from attnviz.kinds import KINDS, held_axes
from attnviz.linear import onednn_enabled
from attnviz.methods import METHODS
from attnviz.methods.ablation import MODES, Ablation, ablation_scope, step_comparison
from attnviz.methods.importance import HeadImportance
from attnviz.methods.importance import head_importance as _head_importance
from attnviz.public import PUBLIC
from attnviz.tiles import TiledAttention
from attnviz.tokenizer import Encoded, Word, pad_batch
from attnviz.words import merge_export

log = logging.getLogger(__name__)

__all__ = list(PUBLIC["attnviz.api"])  # the API's part of the one list of public names


def load(name_or_dir: str | Path = DEFAULT_MODEL, device: str = "auto") -> Bundle:
    """Load a shipped model by name, or any checkpoint directory, onto ``device``."""
    if not isinstance(name_or_dir, (str, os.PathLike)):  # None or ["en-de"] had been looked for as a model of that name
        raise InputError(
            f"the model to load is a name or a folder (text or a Path), got {type(name_or_dir).__name__}: "
            f"attnviz.load({DEFAULT_MODEL!r}), or attnviz.list_models() for the names"
        )
    if not isinstance(device, str):
        raise InputError(f"device must be one of 'auto', 'cpu', 'cuda' or 'mps' (text), got {type(device).__name__}")
    return load_checkpoint(resolve_model(name_or_dir), device)


def _source_tensor(bundle: Bundle, text: str) -> torch.Tensor:
    """The encoder input for ``text``: ids (1, S); a language model's prompt, for one."""
    return torch.tensor([bundle.tokenizer.encode_source(text).ids], device=bundle.device)


def _check_flag(name: str, value) -> None:
    """InputError unless ``value`` is True or False: any other value would be read by its truth, "no" as yes."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name} must be True or False, got {value!r}")


def _check_beam(beam) -> None:
    if not isinstance(beam, int) or isinstance(beam, bool) or not 1 <= beam <= 64:
        raise InputError(f"the beam size must be a whole number from 1 to 64, got {beam!r}")


LM_TRANSLATES = "this model is a language model: it continues a prompt rather than translating it; use generate"


def _max_output(bundle: Bundle, src_len: int) -> int:
    """How many tokens decoding may write after ``src_len`` input tokens. A language model's output
    follows its prompt in the same positions: it may fill those the prompt leaves, at most
    `MAX_OUTPUT_TOKENS`; a prompt that leaves none is refused."""
    cfg = bundle.config
    if not cfg.decoder_only:
        return output_limit(src_len, cfg.max_len)
    room = cfg.max_len - src_len
    if room < 1:
        raise InputError(
            f"the prompt is {src_len} tokens and this model reads at most {cfg.max_len}: it leaves no position "
            "for a next token; shorten the prompt"
        )
    return min(MAX_OUTPUT_TOKENS, room)


MAX_TOP_K = 64  # candidates kept at each step of a decoding


def _check_top_k(bundle: Bundle, top_k) -> None:
    most = min(MAX_TOP_K, bundle.config.tgt_vocab_size)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= most:
        raise InputError(
            f"top_k, the candidates kept at each step, must be a whole number from 1 to {most}, got {top_k!r}"
        )


def _say_truncated(limit: int) -> None:
    log.warning("the output stopped at the length limit of %d tokens: it may be unfinished", limit)


def _greedy(bundle: Bundle, src_ids: torch.Tensor) -> tuple[list[int], bool]:
    """The greedy output for one sentence (no start or end token), and whether the length limit cut it."""
    limit = _max_output(bundle, src_ids.shape[1])
    out = greedy_decode(bundle.model, src_ids, max_len=limit)[0]
    truncated = len(out) == limit  # greedy_decode stops at the end token and drops it
    if truncated:
        _say_truncated(limit)
    return out, truncated


def _ablated(bundle: Bundle, ablation: Ablation, src_ids: torch.Tensor, tgt: str | None):
    """A ``with`` block running ``bundle``'s model with ``ablation`` (nothing, when it is empty).

    Mean ablation of decoder-side heads averages over the decoder input: ``tgt``, or without it the
    intact model's greedy output (taken before the block starts, so the means are the intact model's).
    A language model's means are taken over its prompt, ``src_ids``.
    """
    if bundle.config.decoder_only:
        return ablation_scope(bundle.model, ablation, None, src_ids)
    tgt_tensor = None
    if ablation.needs_target():
        if tgt is not None:
            ids = bundle.tokenizer.encode_target(tgt)[0].ids
        else:
            out = greedy_decode(bundle.model, src_ids, max_len=_max_output(bundle, src_ids.shape[1]))[0]
            ids = (bundle.tokenizer.bos_id, *out)
        tgt_tensor = torch.tensor([ids], device=bundle.device)
    return ablation_scope(bundle.model, ablation, src_ids, tgt_tensor)


def _ablation(bundle: Bundle, ablate: str | Ablation | None) -> Ablation:
    """What ``ablate`` names (text like ``cross:1.2,encoder:3.1``, or an Ablation), checked against the model."""
    return Ablation.of(ablate).check(bundle.config)


def translate(bundle: Bundle, text: str, beam: int = 1, ablate: str | Ablation | None = None) -> str:
    """The model's output for ``text``: greedy with ``beam`` 1, else beam search.

    ``ablate`` switches heads off while decoding: text such as ``"cross:1.2,encoder:3.1"`` (kind,
    layer and head from 1; their outputs zeroed) or an [`Ablation`][attnviz.methods.ablation.Ablation]
    (which may replace them by their means instead). The model itself is not modified. An output
    cut at the length limit (`attnviz.decoding.MAX_OUTPUT_TOKENS`, or the model's positions) is logged as a
    warning; [`step_through`][attnviz.api.step_through] and [`attention`][attnviz.api.attention] also record it.
    """
    if bundle.config.decoder_only:
        raise InputError(LM_TRANSLATES)
    _check_beam(beam)
    src = _source_tensor(bundle, text)
    ablation = _ablation(bundle, ablate)
    with _ablated(bundle, ablation, src, None):
        if beam == 1:
            ids, _ = _greedy(bundle, src)
        else:
            decoding = _step_through(bundle.model, src, beam_size=beam, max_len=_max_output(bundle, src.shape[1]))
            if decoding.truncated:
                _say_truncated(_max_output(bundle, src.shape[1]))
            ids = decoding.ids
    return bundle.tokenizer.decode(ids)


MAX_NEW_TOKENS = 256  # the most tokens generate appends to a prompt
GENERATE_IS_AN_LM_S = "generate applies to language models; this model's decoder input is its translation"
WRITES_NOTHING_S = "this model is encoder-only: it writes no text"
GENERATE_NO_DECODER_S = f"generate applies to language models; {WRITES_NOTHING_S}"


def _generate_is_an_lm(cfg) -> str:
    """The message for ``generate`` asked of a model that is no language model (an encoder-only one has no decoder
    input: the translator's message had been given to MiniLM)."""
    return GENERATE_NO_DECODER_S if cfg.encoder_only else GENERATE_IS_AN_LM_S


def _new_tokens(bundle: Bundle, prompt_len: int, max_new: int) -> int:
    """How many tokens a language model may append: ``max_new``, within its positions; InputError otherwise."""
    if isinstance(max_new, bool) or not isinstance(max_new, int) or not 0 <= max_new <= MAX_NEW_TOKENS:
        raise InputError(f"the number of new tokens must be a whole number from 0 to {MAX_NEW_TOKENS}, got {max_new!r}")
    room = bundle.config.max_len - prompt_len
    if max_new > room:
        raise InputError(
            f"the prompt is {prompt_len} tokens and this model reads at most {bundle.config.max_len}: "
            f"it can append {max(room, 0)} tokens, not {max_new}"
        )
    return max_new


def _continuation(bundle: Bundle, prompt: torch.Tensor, max_new: int, beam: int = 1) -> tuple[int, ...]:
    """A language model's continuation of ``prompt`` (1, P): greedy, or beam search; without the end token."""
    n = _new_tokens(bundle, prompt.shape[1], max_new)
    if n == 0:
        return ()
    if beam == 1:
        return tuple(greedy_decode(bundle.model, prompt, max_len=n)[0])
    return _step_through(bundle.model, prompt, beam_size=beam, max_len=n).ids


def generate(
    bundle: Bundle, prompt: str, max_new: int = 20, beam: int = 1, ablate: str | Ablation | None = None
) -> str:
    """A language model's continuation of ``prompt``: ``max_new`` tokens at most, greedy (``beam`` 1) or
    by beam search, stopping at the end token. ``ablate``: heads switched off, as in
    [`translate`][attnviz.api.translate]. The text returned is the continuation alone, without the prompt."""
    if not bundle.config.decoder_only:
        why = WRITES_NOTHING_S if bundle.config.encoder_only else "this model translates: use translate"
        raise InputError(f"generate continues a language model's prompt; {why}")
    _check_beam(beam)
    prompt_ids = _source_tensor(bundle, prompt)
    ablation = _ablation(bundle, ablate)
    with _ablated(bundle, ablation, prompt_ids, None):
        ids = _continuation(bundle, prompt_ids, max_new, beam)
    return bundle.tokenizer.decode(ids)


def step_through(
    bundle: Bundle,
    text: str,
    beam: int = 1,
    top_k: int = 5,
    target: str | None = None,
    ablate: str | Ablation | None = None,
) -> Decoding:
    """Decode ``text`` step by step (greedy, beam search, or teacher-forced on ``target``).

    Every `DecodeStep` holds the chosen token, the top-k candidates, and
    that step's decoder self-attention and cross-attention rows for every layer and head.
    ``ablate``: heads switched off, as in [`translate`][attnviz.api.translate].
    """
    _check_beam(beam)
    _check_top_k(bundle, top_k)
    src = _source_tensor(bundle, text)
    ablation = _ablation(bundle, ablate)
    forced = None
    if target is not None:
        forced = list(bundle.tokenizer.encode_target(target)[1].ids)
    with _ablated(bundle, ablation, src, target):
        decoding = _step_through(
            bundle.model, src, beam_size=beam, top_k=top_k, max_len=_max_output(bundle, src.shape[1]), forced=forced
        )
    for step in decoding.steps:
        rows = {"decoder": step.self_attn, "cross": step.cross_attn}
        _check_finite("decoding step's attention", {k: v.numpy() for k, v in rows.items() if v is not None})
    return decoding


def _check_finite(what: str, arrays: dict[str, np.ndarray], allow_masked: bool = False) -> None:
    """Raise NonFiniteError when an array to be drawn or exported holds NaN or infinity.

    With ``allow_masked``, -inf is allowed: scores before the softmax are -inf where masked.
    """
    for kind, array in arrays.items():
        bad = np.isnan(array) | (np.isposinf(array) if allow_masked else np.isinf(array))
        if bad.any():
            where = np.argwhere(bad)[0]
            place = f" (first at index {tuple(int(i) for i in where)} of an array shaped {array.shape})"
            raise NonFiniteError(
                f"the {kind} {what} holds NaN or infinite values{place}: the model's numbers overflow for this "
                "input, so nothing is drawn rather than a wrong picture"
            )


@dataclass(frozen=True)
class _Inputs:
    """What the model reads for one sentence pair: the encoder input, and the decoder input unless
    the model is encoder-only (then every target field is None). A language model has no encoder
    input (``src`` and ``src_enc`` None): its decoder input is the prompt, and any generated tokens."""

    src: torch.Tensor | None  # (1, S) ids
    src_enc: Encoded | None
    tgt: torch.Tensor | None  # (1, T) ids, from the start token on
    tgt_ids: tuple[int, ...] | None
    tgt_tokens: tuple[str, ...] | None
    tgt_words: tuple[Word, ...] | None
    truncated: bool  # the decoder input is the greedy output, cut at the length limit
    generated: int = 0  # a language model: how many of the decoder input's tokens it wrote after the prompt


def _check_no_target(bundle: Bundle, tgt: str | None) -> None:
    """InputError when ``tgt`` is given to a model that reads no target: a language model or an encoder-only one.
    Every function taking a ``tgt`` refuses it so, rather than leave it out of what it counts or reads."""
    if tgt is None:
        return
    if bundle.config.decoder_only:
        raise InputError("a language model reads one text, its prompt: there is no target sentence")
    if bundle.config.encoder_only:
        raise InputError("this model is encoder-only: it takes no target sentence")


def _lm_inputs(bundle: Bundle, prompt: Encoded, tgt: str | None, generate: int) -> _Inputs:
    """A language model's input: the prompt's ids, then ``generate`` greedy tokens (fewer if it ends)."""
    _check_no_target(bundle, tgt)
    tok = bundle.tokenizer
    prompt_ids = torch.tensor([prompt.ids], device=bundle.device)
    ids = (*prompt.ids, *_continuation(bundle, prompt_ids, generate))
    # The prompt's labels as its tokenizer read them ("<unk:☃>" says what an unknown piece stood for); the
    # tokens the model wrote by their ids.
    tokens = (*prompt.tokens, *(tok.target_token(i) for i in ids[len(prompt.ids) :]))
    written = tok.target_words(ids[len(prompt.ids) :])  # the model's own words, after the prompt's
    words = (
        *prompt.words,
        *(dataclasses.replace(w, start=w.start + len(prompt.ids), stop=w.stop + len(prompt.ids)) for w in written),
    )
    tensor = torch.tensor([ids], device=bundle.device)
    return _Inputs(None, None, tensor, ids, tokens, words, False, len(ids) - len(prompt.ids))


def _inputs(bundle: Bundle, src: str, tgt: str | None, src_enc: Encoded | None = None, generate: int = 0) -> _Inputs:
    """The encoder input, and the decoder input: ``<s>`` and ``tgt``'s pieces, or the greedy output.

    ``src_enc``: ``src`` already encoded, when the caller needed its ids first. For a language model
    ``src`` is the prompt and ``generate`` how many greedy tokens to append to it.
    """
    tok = bundle.tokenizer
    src_enc = tok.encode_source(src) if src_enc is None else src_enc
    if bundle.config.decoder_only:
        return _lm_inputs(bundle, src_enc, tgt, generate)
    if generate:
        raise InputError(_generate_is_an_lm(bundle.config))
    src_ids = torch.tensor([src_enc.ids], device=bundle.device)
    if bundle.config.encoder_only:
        _check_no_target(bundle, tgt)
        return _Inputs(src_ids, src_enc, None, None, None, None, False)
    if tgt is None:
        out, truncated = _greedy(bundle, src_ids)
        ids = (tok.bos_id, *out)
        tokens, words = tuple(tok.target_token(i) for i in ids), tok.target_words(ids)
    else:
        enc, _ = tok.encode_target(tgt)
        ids, tokens, words, truncated = enc.ids, enc.tokens, enc.words, False
    tgt_ids = torch.tensor([ids], device=bundle.device)
    return _Inputs(src_ids, src_enc, tgt_ids, ids, tokens, words, truncated)


def _per_layer(bundle: Bundle, part: str) -> dict[str, list[str]]:
    """The names of point ``part`` (``scores``, ``q``...) of each layer's attention, per kind the model has."""
    layers = {kind: bundle.config.n_layers_of(kind) for kind in KINDS}
    return {kind: [act_name(attention_site(kind, i), part) for i in range(n)] for kind, n in layers.items() if n}


def _all(*per_kind: dict[str, list[str]]) -> set[str]:
    return {name for names in per_kind for kind_names in names.values() for name in kind_names}


def _recorded(bundle: Bundle, inputs: _Inputs, names, logits: bool = False) -> dict[str, np.ndarray]:
    """One forward pass on ``inputs``, recording the points ``names`` (a set, or a filter on names):
    each as float32 numpy without the batch axis (position tables have none). The recipe every
    reading of the model's insides shares."""
    with Recorder(names) as rec:
        bundle.model(inputs.src, inputs.tgt, return_logits=logits)
    return {k: (v if k.endswith(".pos") else v[0]).float().cpu().numpy() for k, v in rec.tensors.items()}


def _stacked(recorded: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    """The recorded arrays of ``names`` (one per layer), stacked on a first axis: (L, ...)."""
    return np.stack([recorded[name] for name in names])


@torch.no_grad()
def attention_scores(bundle: Bundle, src: str, tgt: str | None = None) -> dict[str, np.ndarray]:
    """The scaled scores Q K^T / sqrt(d_k) before the softmax, per kind, (L, H, Q, K) float32.

    The same inputs as [`attention`][attnviz.api.attention]; masked entries are ``-inf``.
    """
    names = _per_layer(bundle, "scores")
    recorded = _recorded(bundle, _inputs(bundle, src, tgt), _all(names))
    scores = {kind: _stacked(recorded, kind_names) for kind, kind_names in names.items()}
    _check_finite("scores", scores, allow_masked=True)
    return scores


def versions() -> dict[str, str | None]:
    """The versions of what computes the maps: Python, attnviz, torch (and its CUDA), numpy, sentencepiece."""
    return {
        "python": platform.python_version(),
        "attnviz": package_version("attnviz"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,  # None for a CPU build of torch
        "numpy": np.__version__,
        "sentencepiece": sentencepiece.__version__,
    }


def run_record(bundle: Bundle) -> dict:
    """Where and how ``bundle`` computes its maps: what is needed to judge a difference between two exports.

    Two exports of the same model and input can differ in the last float32 bits when any of these
    differ (docs/tolerances.md measures by how much).
    """
    device = bundle.device
    return {
        "device": str(device),
        "device_name": device_name(device),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the vector unit ATen's CPU kernels use
        "dtype": str(next(bundle.model.parameters()).dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "attention_kernel": "explicit",  # maps come from equation 1 written out; the fused kernel returns none
        # attnviz.linear's switch: oneDNN for large float32 CPU products; False means F.linear everywhere
        "onednn": device.type == "cpu" and onednn_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),  # "high" allows TF32 on GPUs
    }


def _manifest(bundle: Bundle, src: str, tgt: str | None, inputs: _Inputs) -> dict:
    """What every export records: the model, its inputs, the axes and the library versions."""
    encoder_only, lm = inputs.tgt_ids is None, bundle.config.decoder_only
    if lm:
        tgt_from = f"the prompt, then {inputs.generated} greedy tokens" if inputs.generated else "the prompt"
    else:
        tgt_from = "none: encoder-only model" if encoder_only else "given" if tgt is not None else "greedy output"
    return {
        "model": bundle.name,
        "family": bundle.info.get("family", "attnviz"),
        "architecture": bundle.config.architecture,
        "checkpoint_sha256": bundle.sha256,
        "config": bundle.config.to_dict(),
        "src": src,
        "tgt": tgt,
        "tgt_from": tgt_from + ("" if lm or encoder_only or tgt is not None else " of the model"),
        "tgt_truncated": inputs.truncated,  # the greedy output stopped at the length limit, unfinished
        "generated": inputs.generated,  # a language model: tokens it appended to the prompt
        "max_output_tokens": None if encoder_only or lm else _max_output(bundle, inputs.src.shape[1]),
        "units": "pieces",
        "axes": held_axes(("decoder",) if lm else ("encoder",) if encoder_only else KINDS),
        "note": "rows are queries, columns are keys; weights are post-softmax, per head",
        "versions": versions(),
        "run": run_record(bundle),
        "format_version": FORMAT_VERSION,
    }


@torch.no_grad()
def attention(
    bundle: Bundle,
    src: str,
    tgt: str | None = None,
    ablate: str | Ablation | None = None,
    *,
    words: bool = False,
    generate: int = 0,
) -> AttentionExport:
    """Every attention map for ``src``, with ``tgt`` (or, without it, the model's greedy output)
    as the decoder input.

    For a language model (GPT-2, Llama, Qwen2) ``src`` is the prompt, there is no ``tgt``, and
    ``generate`` appends that many of the model's greedy tokens: the export holds ``decoder``
    (L, H, T, T), causal, over the prompt and those tokens, in ``tgt_ids`` and ``tgt_tokens``, and
    no ``encoder``, ``cross`` or ``src_*``.

    ``ablate``: heads switched off, as in [`translate`][attnviz.api.translate]; without ``tgt`` the decoder input is
    then the ablated model's own greedy output, and the manifest names the ablation.

    With ``words``, the maps are over words instead of sub-word pieces (`attnviz.words`:
    attention to a word summed over its pieces, from a word averaged), the tokens are the words
    as typed, and the manifest says so (``units``, ``words``).
    """
    _check_flag("words", words)
    ablation = _ablation(bundle, ablate)
    src_enc = bundle.tokenizer.encode_source(src)  # once: the ablation's scope needs the ids first
    with _ablated(bundle, ablation, torch.tensor([src_enc.ids], device=bundle.device), tgt):
        inputs = _inputs(bundle, src, tgt, src_enc, generate)
        export = _maps(bundle, src, tgt, inputs, ablation)
    return merge_export(export, _src_words(inputs), inputs.tgt_words) if words else export


def _src_words(inputs: _Inputs) -> tuple[Word, ...] | None:
    """The source's words, or None for a language model (its words are the decoder input's)."""
    return None if inputs.src_enc is None else inputs.src_enc.words


# A sentence looks out of a model's domain when this much more of its word pieces than of any of the
# model's examples' are single letters: a sentencepiece model spells unknown words letter by letter.
LETTER_SHARE_MARGIN = 0.3
MIN_SPELLED = 3  # ... and at least this many pieces are single letters


def _spelled(tokens: tuple[str, ...]) -> tuple[int, float]:
    """(how many, what share) of the word pieces with letters in ``tokens`` are a single letter."""
    words = [t.lstrip("▁Ġ").removeprefix("##") for t in tokens if not (t[:1] in "<[" and t[-1:] in ">]")]
    words = [w for w in words if any(c.isalpha() for c in w)]
    single = sum(len(w) == 1 for w in words)
    return single, single / len(words) if words else 0.0


def unknown_pieces(bundle: Bundle, src: str, tgt: str | None = None) -> tuple[str, ...]:
    """The pieces of ``src`` (and of a translation model's ``tgt``) that the tokenizer could not read,
    in order: the text each stood for where its label keeps it (``<unk:☃>`` gives ``"☃"``), else its
    label. Empty when every character is known, and always for a tokenizer that has no unknown token
    (byte-level BPE, sentencepiece with byte fallback). A ``tgt`` for a model that reads none (a language
    model, an encoder-only model) is an InputError, as in [`attention`][attnviz.api.attention]."""
    _check_no_target(bundle, tgt)
    tok = bundle.tokenizer
    unread = _unread(tok, tok.encode_source(src))
    if tgt is not None:
        unread += _unread(tok, tok.encode_target(tgt)[0])  # the decoder's input: every piece of tgt after <s>
    return unread


def _unread(tok, enc) -> tuple[str, ...]:
    """The unknown pieces of one encoding, as `unknown_pieces` gives them."""
    return tuple(
        label[len("<unk:") : -1] if label.startswith("<unk:") and label.endswith(">") else label
        for i, label in zip(enc.ids, enc.tokens, strict=True)
        if i == tok.unk_id
    )


def out_of_domain(bundle: Bundle, src: str) -> str | None:
    """One sentence saying why ``src`` looks outside what ``bundle`` was trained on, or None.

    Two signs, each measured on the source's pieces: characters the tokenizer does not know, and
    words spelled out letter by letter (a share of single-letter pieces more than
    `LETTER_SHARE_MARGIN` above the model's own examples, so that a model of letters, such as
    ``reverse``, is not flagged for reading letters). The domain named is the card's description.
    """
    tok = bundle.tokenizer
    enc = tok.encode_source(src)
    unknown = len(_unread(tok, enc))
    spelled, share = _spelled(enc.tokens)
    usual = 0.0
    for example in bundle.info.get("examples") or []:
        try:
            usual = max(usual, _spelled(tok.encode_source(example).tokens)[1])
        except InputError:
            continue
    reasons = []
    if unknown:
        reasons.append(f"{unknown} piece{'s' if unknown > 1 else ''} it cannot read (characters it never saw)")
    if spelled >= MIN_SPELLED and share > usual + LETTER_SHARE_MARGIN:
        reasons.append(
            f"{share:.0%} of its word pieces are single letters: words it spells out, never having seen them"
        )
    if not reasons:
        return None
    domain = bundle.info.get("description") or "the kind of sentence in its examples"
    return (
        f"This model was trained on {domain}; this sentence looks outside that: {' and '.join(reasons)}. "
        "Its maps and its output may mean little; the examples show what it knows."
    )


CLEAREST_SENTENCES = 8  # the model's first examples that choose the head a page opens on


class HeadChoice(tuple):
    """(kind, layer, head), layer and head from 1, as a plain tuple; ``named`` is the role under which the
    model's card names that head ("induction"), or None when the head was chosen by the clearest-head rule."""

    named: str | None

    def __new__(cls, kind: str, layer: int, head: int, named: str | None = None):
        choice = super().__new__(cls, (kind, layer, head))
        choice.named = named
        return choice

    def __getnewargs__(self):
        return (*self, self.named)


def named_heads(bundle: Bundle) -> dict[str, tuple[int, int]]:
    """The heads the model's card names, by role, as (layer, head) from 1, in the card's order.

    A checkpoint trained by ``attnviz train`` on the induction task stores them in its config as
    ``"heads": {"previous-token": "layer 1 head 1", "induction": "layer 2 head 2"}``
    (`attnviz.training.lm`); entries that do not read so, or name a head the model lacks, are left out.
    """
    cfg, named = bundle.config, {}
    for role, text in (bundle.info.get("heads") or {}).items():
        words = str(text).split()
        if len(words) == 4 and words[0] == "layer" and words[2] == "head" and words[1].isdigit() and words[3].isdigit():
            layer, head = int(words[1]), int(words[3])
            if 1 <= layer <= cfg.n_dec_layers and 1 <= head <= cfg.n_heads:
                named[str(role)] = (layer, head)
    return named


def _main_kind(cfg) -> str:
    """The attention a page opens on: cross-attention, where the decoder looks; a language model's
    self-attention; an encoder-only model's."""
    return "encoder" if cfg.encoder_only else "decoder" if cfg.decoder_only else "cross"


def clearest_head(bundle: Bundle, kind: str | None = None) -> HeadChoice:
    """(kind, layer, head), layer and head from 1: the head the app opens on for ``bundle``.

    ``kind`` defaults to cross-attention (where the decoder looks), or the encoder's self-attention
    for an encoder-only model. The head is `attnviz.analysis.clearest_head` over the model's
    example sentences (its card's), so that it depends on the model only, and a link that leaves
    the layer and head out always opens the same head. A model without examples opens on layer 1,
    head 1. A language model whose card names heads (`named_heads`) opens on the last one named
    instead: the card lists a circuit's heads in the order they act (the previous-token head, then
    the induction head that reads its output), and says what to look for in that head's map.
    """
    kind = kind or _main_kind(bundle.config)
    if kind not in KINDS or not bundle.config.n_layers_of(kind):
        raise InputError(f"this model has no {kind!r} attention; kind is one of {', '.join(KINDS)} that it has")
    named = named_heads(bundle) if bundle.config.decoder_only and kind == "decoder" else {}
    if named:
        role, (layer, head) = list(named.items())[-1]
        return HeadChoice(kind, layer, head, named=role)
    tables = []
    for sentence in (bundle.info.get("examples") or [])[:CLEAREST_SENTENCES]:
        try:
            export = attention(bundle, sentence)
        except InputError:  # an example this tokenizer cannot read: the others decide
            continue
        tables.append(analysis.head_statistics(getattr(export, kind), *export.tokens(kind), kind))
    return HeadChoice(kind, *analysis.clearest_head(tables)) if tables else HeadChoice(kind, 1, 1)


def _maps(bundle: Bundle, src: str, tgt: str | None, inputs: _Inputs, ablation: Ablation) -> AttentionExport:
    """The export of one forward pass on ``inputs``, run in the caller's scope (an ablation's)."""
    result = bundle.model(inputs.src, inputs.tgt, return_attention=True, return_logits=False).attention

    def stack(kind: str) -> np.ndarray | None:
        if not getattr(result, kind):  # an encoder-only model has no decoder or cross maps
            return None
        return result.stacked(kind)[:, 0].float().cpu().numpy()  # (L, B=1, H, Q, K) -> (L, H, Q, K)

    manifest = _manifest(bundle, src, tgt, inputs)
    if ablation:
        manifest["ablation"] = {"heads": str(ablation), "mode": ablation.mode, "meaning": MODES[ablation.mode]}
    maps = {kind: stack(kind) for kind in KINDS}
    _check_finite("attention", {kind: m for kind, m in maps.items() if m is not None})
    return AttentionExport(**maps, **_export_inputs(inputs), manifest=manifest)


def _export_inputs(inputs: _Inputs) -> dict:
    """An export's ids and tokens for ``inputs``: the exact pieces the model read."""
    encoder_only, lm = inputs.tgt_ids is None, inputs.src_enc is None
    return {
        "src_ids": None if lm else np.array(inputs.src_enc.ids, dtype=np.int64),
        "tgt_ids": None if encoder_only else np.array(inputs.tgt_ids, dtype=np.int64),
        "src_tokens": None if lm else tuple(inputs.src_enc.tokens),
        "tgt_tokens": None if encoder_only else tuple(inputs.tgt_tokens),
    }


@dataclass(frozen=True)
class AblationComparison:
    """The intact and the ablated model on one sentence, side by side.

    ``intact`` and ``ablated`` hold the maps for the same decoder input (``tgt``, or the intact
    model's output; a language model's prompt), so that their rows line up; ``steps`` reads that same input step by step
    (`step_comparison`: each token's probability under both models and
    each model's top candidates). ``intact_output`` and ``ablated_output`` are the greedy translations.
    For an encoder-only model only the maps are there (the outputs and steps are None).
    """

    ablation: Ablation
    intact: AttentionExport
    ablated: AttentionExport
    intact_output: str | None
    ablated_output: str | None
    steps: pd.DataFrame | None


@torch.no_grad()
def compare_ablation(
    bundle: Bundle,
    src: str,
    ablate: str | Ablation,
    tgt: str | None = None,
    top_k: int = 3,
    *,
    words: bool = False,
) -> AblationComparison:
    """What switching heads off changes for ``src``: translations, step probabilities and maps, side by side.

    With ``words`` the two exports' maps are over words, as [`attention`][attnviz.api.attention] gives them; the steps
    stay pieces, as the decoder writes them. ``ablate`` must name at least one head: the model compared with
    itself would show every step unchanged, which says nothing.
    """
    _check_flag("words", words)
    _check_top_k(bundle, top_k)
    ablation = _ablation(bundle, ablate)
    if not ablation:
        example = f"{_main_kind(bundle.config)}:1.{min(2, bundle.config.n_heads)}"
        raise InputError(
            f"compare_ablation compares the model with heads switched off: name at least one head to switch off, "
            f"e.g. {example}"
        )
    inputs = _inputs(bundle, src, tgt)
    src_ids = inputs.src

    def maps(scope: Ablation) -> AttentionExport:
        export = _maps(bundle, src, tgt, inputs, scope)
        return merge_export(export, _src_words(inputs), inputs.tgt_words) if words else export

    intact = maps(Ablation())
    if bundle.config.encoder_only:
        with _ablated(bundle, ablation, src_ids, None):
            return AblationComparison(ablation, intact, maps(ablation), None, None, None)
    if bundle.config.decoder_only:
        return _compare_lm_ablation(bundle, ablation, inputs, intact, maps, top_k)
    tok, max_len = bundle.tokenizer, _max_output(bundle, src_ids.shape[1])
    forced = [*inputs.tgt_ids[1:], tok.eos_id]  # the decoder input, shifted: the token each step reads next
    intact_steps = _step_through(bundle.model, src_ids, top_k=top_k, forced=forced)
    if tgt is None:  # the decoder input is the intact model's greedy output already: not decoded twice
        intact_output = tok.decode(list(inputs.tgt_ids[1:]))
    else:
        intact_output = tok.decode(greedy_decode(bundle.model, src_ids, max_len=max_len)[0])
    with _ablated(bundle, ablation, src_ids, tgt):
        ablated = maps(ablation)
        ablated_steps = _step_through(bundle.model, src_ids, top_k=top_k, forced=forced)
        ablated_output = tok.decode(greedy_decode(bundle.model, src_ids, max_len=max_len)[0])
    steps = step_comparison(intact_steps, ablated_steps, tok.target_token)
    return AblationComparison(ablation, intact, ablated, intact_output, ablated_output, steps)


LM_COMPARED_TOKENS = 20  # how far compare_ablation continues a language model's prompt, with and without the heads


def _compare_lm_ablation(bundle: Bundle, ablation: Ablation, inputs: _Inputs, intact, maps, top_k: int):
    """compare_ablation for a language model: the prompt read token by token (each next token's
    probability under both models) and each model's greedy continuation."""
    prompt, tok = inputs.tgt, bundle.tokenizer
    if prompt.shape[1] < 2:
        raise InputError("the prompt has one token: there is no next token in it to compare the models on")
    first, forced = prompt[:, :1], list(inputs.tgt_ids[1:])  # each step reads the prompt's next token
    n = min(LM_COMPARED_TOKENS, bundle.config.max_len - prompt.shape[1])
    intact_steps = _step_through(bundle.model, first, top_k=top_k, forced=forced)
    intact_output = tok.decode(_continuation(bundle, prompt, n))
    with _ablated(bundle, ablation, prompt, None):
        ablated = maps(ablation)
        ablated_steps = _step_through(bundle.model, first, top_k=top_k, forced=forced)
        ablated_output = tok.decode(_continuation(bundle, prompt, n))
    steps = step_comparison(intact_steps, ablated_steps, tok.target_token)
    return AblationComparison(ablation, intact, ablated, intact_output, ablated_output, steps)


def attribute(
    bundle: Bundle,
    src: str,
    tgt: str | None = None,
    method: str = "norm",
    position: int | None = None,
    *,
    words: bool = False,
    generate: int = 0,
) -> AttentionExport:
    """A contribution method's numbers for ``src`` and ``tgt`` (or the greedy output), as an export.

    ``method`` is a key of `attnviz.methods.METHODS`: ``norm`` (per head, (L, H, Q, K)),
    ``value-zeroing``, ``rollout`` or ``grad-attention`` (per layer, (L, Q, K)), under ``encoder``,
    ``decoder`` and ``cross`` as the maps are. ``position`` (grad-attention only) is the decoder
    position, from 0, whose predicted token is explained (default: the last); the propagated
    relevance is in ``extras`` (``source_relevance`` (S,), ``target_relevance`` (T,)). The manifest
    names the method, its paper and its normalisation.

    ``words``: the maps merged into words as [`attention`][attnviz.api.attention] merges the weights (to a word summed,
    from a word averaged) and each word's relevance the sum of its pieces'; ``position`` still
    counts the decoder's pieces, as the model predicts them. ``generate``: a language model's greedy
    tokens appended to the prompt, as in [`attention`][attnviz.api.attention].
    """
    _check_flag("words", words)
    spec = METHODS.get(method) if isinstance(method, str) else None
    if spec is None:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if position is not None and not spec.uses_position:
        raise InputError(f"a position applies to {', '.join(m for m in METHODS if METHODS[m].uses_position)} only")
    inputs = _inputs(bundle, src, tgt, generate=generate)
    if spec.needs_decoder and inputs.tgt is None:
        raise InputError(f"{spec.title} explains a prediction of the decoder: this model is encoder-only")
    result = spec.function(bundle.model, inputs.src, inputs.tgt, position=position)
    _check_finite(spec.title, {kind: m for kind, m in result.maps.items() if m is not None})
    manifest = _manifest(bundle, src, tgt, inputs)
    lead = ("layer", "head") if spec.per_head else ("layer",)
    manifest.update(
        method=spec.name,
        method_title=spec.title,
        paper=spec.paper,
        normalisation=spec.normalisation,
        axes=held_axes([kind for kind, maps in result.maps.items() if maps is not None], lead),
        note="rows are queries, columns are keys; " + ("per head" if spec.per_head else "per layer"),
        extras=dict(spec.extras),
    )
    if "predicted_token_id" in result.notes:
        manifest["position"] = result.notes["position"]
        manifest["predicted_token_id"] = result.notes["predicted_token_id"]
        manifest["predicted_token"] = bundle.tokenizer.target_token(result.notes["predicted_token_id"])
    export = AttentionExport(
        encoder=result.maps.get("encoder"),
        decoder=result.maps.get("decoder"),
        cross=result.maps.get("cross"),
        **_export_inputs(inputs),
        manifest=manifest,
        extras=result.extras,
    )
    if not words:
        return export
    return merge_export(export, _src_words(inputs), inputs.tgt_words, dict(spec.token_extras))


@torch.no_grad()
def head_importance(
    bundle: Bundle, sentences: list[str] | None = None, references: list[str] | None = None
) -> HeadImportance:
    """How much each head matters: the drop in log-probability per target token when it alone is zeroed.

    Over ``sentences`` (default: the model's example sentences), with ``references`` (one per
    sentence) as the outputs whose log-probability is measured, or without them the intact model's
    own greedy outputs. See `attnviz.methods.importance`.
    """
    tok = bundle.tokenizer
    references = None if references is None else check_texts("references", references)
    sentences = list(bundle.info.get("examples") or []) if sentences is None else check_texts("sentences", sentences)
    if not sentences:
        raise InputError("no sentences: this model has no examples, so give the sentences to measure over")
    if references is not None and len(references) != len(sentences):
        raise InputError(f"got {len(references)} references for {len(sentences)} sentences: give one per sentence")
    sources = [tok.encode_source(s).ids for s in sentences]
    if bundle.config.decoder_only:  # a language model: each text's own tokens, every one after the first
        if references is not None:
            raise InputError("a language model is measured on its texts' own tokens: give no references")
        if any(len(ids) < 2 for ids in sources):
            raise InputError("every text must have at least two tokens: the first predicts the next")
        return _head_importance(bundle.model, [(ids[:1], ids[1:]) for ids in sources])
    if references is not None:
        outputs = [tok.encode_target(r)[1].ids for r in references]
    else:
        src, src_valid = pad_batch(sources, tok.pad_id, bundle.device)
        greedy = greedy_decode(bundle.model, src, src_valid, max_len=_max_output(bundle, src.shape[1]))
        outputs = [(*ids, tok.eos_id) for ids in greedy]
    return _head_importance(bundle.model, list(zip(sources, outputs, strict=True)))


@torch.no_grad()
def queries_keys(
    bundle: Bundle, src: str, tgt: str | None = None, rotated: bool = True
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every head's query and key vectors, per kind: (queries (L, H, Q, d_k), keys (L, H, K, d_k)) float32.

    The same inputs as [`attention`][attnviz.api.attention]; the vectors are the projections W^Q x and W^K x split into
    heads (section 3.2.2), before the scaling by 1/sqrt(d_k). An encoder-only model has only
    "encoder"; cross-attention's keys are the source's. For a model with rotary positions they are
    the rotated vectors, whose products are the scores; with ``rotated=False`` the vectors before the
    rotation (their content alone, without their positions), grouped keys repeated per query head.
    """
    _check_flag("rotated", rotated)
    rope = bundle.config.pos_encoding == "rotary"
    if not rotated and not rope:
        raise InputError("vectors before the rotation exist only for a model with rotary positions")
    q_part, k_part = ("q", "k") if rotated else ("q_unrotated", "k_unrotated")
    queries, keys = _per_layer(bundle, q_part), _per_layer(bundle, k_part)
    recorded = _recorded(bundle, _inputs(bundle, src, tgt), _all(queries, keys))
    if not rotated:  # keys before the rotation are recorded per key/value head
        group = bundle.config.n_heads // bundle.config.kv_heads
        recorded = {n: np.repeat(v, group, axis=0) if n.endswith("k_unrotated") else v for n, v in recorded.items()}
    vectors = {kind: (_stacked(recorded, queries[kind]), _stacked(recorded, keys[kind])) for kind in queries}
    _check_finite("query and key vectors", {f"{kind} {i}": v[i] for kind, v in vectors.items() for i in (0, 1)})
    return vectors


def maps_size(bundle: Bundle, src: str, tgt: str | None = None, generate: int = 0) -> tuple[int, int]:
    """(tokens, bytes): the text's length in tokens, and about how many bytes every attention map of it
    takes in float32, before any is made. A model that writes its own output is taken to write as
    many tokens as it reads; a language model's ``generate`` tokens are counted. A ``tgt`` for a model that
    reads none is an InputError, as in [`attention`][attnviz.api.attention]."""
    cfg, tok = bundle.config, bundle.tokenizer
    if generate and not cfg.decoder_only:
        raise InputError(_generate_is_an_lm(cfg))
    _check_no_target(bundle, tgt)
    S = len(tok.encode_source(src).ids)
    T = len(tok.encode_target(tgt)[0].ids) if tgt is not None else None
    if cfg.decoder_only:
        return S, maps_bytes(cfg, S + _new_tokens(bundle, S, generate), T)
    return S, maps_bytes(cfg, S, T)


@torch.no_grad()
def tiled_attention(bundle: Bundle, src: str, tgt: str | None = None, *, generate: int = 0) -> TiledAttention:
    """Every head's queries and keys for ``src``, from which any map is computed tile by tile.

    For texts whose maps do not fit in memory (one head of a language model at 8192 tokens is
    256 MB; all of SmolLM2-135M's, 69 GB): the model runs once with the fused kernel, no map is
    made, and [`attnviz.tiles.TiledAttention`][] gives any head's whole map, a tile of it, a
    max-pooled picture of any region, or every head's statistics, one block of rows at a time
    ([`attnviz.tiles`][]). The same inputs as [`attention`][attnviz.api.attention]; the weights agree with its maps
    to about 1e-7.

    ```python
    from attnviz import tiles

    tiled = attnviz.tiled_attention(lm, long_text)
    head = tiled.head("decoder", 3, 2)  # layer 3, head 2: its queries and keys

    # 128 x 128 exact weights
    tiles.tile(head, tiles.scan(head, "decoder"), (4000, 4128), (3900, 4028))

    tiled.statistics("decoder")  # analysis.head_statistics, every head
    ```
    """
    inputs = _inputs(bundle, src, tgt, generate=generate)
    queries, keys = _per_layer(bundle, "q"), _per_layer(bundle, "k")
    recorded = _recorded(bundle, inputs, _all(queries, keys))
    group = bundle.config.n_heads // bundle.config.kv_heads  # keys are recorded repeated per query head
    q = {kind: _stacked(recorded, names) for kind, names in queries.items()}
    k = {kind: _stacked(recorded, names)[:, ::group] for kind, names in keys.items()}
    _check_finite("query and key vectors", {**{f"{n} queries": v for n, v in q.items()}, **k})
    ids = _export_inputs(inputs)
    manifest = _manifest(bundle, src, tgt, inputs)
    manifest["note"] = "rows are queries, columns are keys; weights computed tile by tile from queries and keys"
    return TiledAttention(q, k, ids["src_tokens"], ids["tgt_tokens"], manifest)


@torch.no_grad()
def forward_pass(bundle: Bundle, src: str, tgt: str | None = None) -> ForwardPass:
    """The model's real intermediate tensors for ``src`` (and ``tgt``, or the greedy output)."""
    inputs = _inputs(bundle, src, tgt)
    tensors = _recorded(bundle, inputs, lambda name: not name.endswith(".mask"), logits=True)
    _check_finite("tensor", {k: v for k, v in tensors.items() if not k.endswith(".scores")})
    _check_finite("scores", {k: v for k, v in tensors.items() if k.endswith(".scores")}, allow_masked=True)
    src_enc = inputs.src_enc
    src_ids, src_tokens = (None, None) if src_enc is None else (src_enc.ids, src_enc.tokens)
    return ForwardPass(tensors, src_ids, src_tokens, inputs.tgt_ids, inputs.tgt_tokens, bool(inputs.truncated))


def _takes_a_model(function):
    """``function``, refusing a first argument that is not a loaded model: `attnviz.attention("en-de", ...)` had
    failed deep inside it ("'str' object has no attribute 'config'"). Anything with a config passes: a Bundle, or
    a stand-in a test or a caller makes of the parts a function reads."""

    @functools.wraps(function)
    def checked(bundle, *args, **kwargs):
        if not hasattr(bundle, "config"):
            shown = repr(bundle)[:60] if isinstance(bundle, (str, Path)) else f"a {type(bundle).__name__}"
            raise InputError(
                f"{function.__name__} takes a loaded model first, not {shown}: model = attnviz.load(...), then "
                f"attnviz.{function.__name__}(model, ...)"
            )
        return function(bundle, *args, **kwargs)

    return checked


for _name in __all__:  # every public function whose first argument is the model
    _function = globals().get(_name)
    if inspect.isfunction(_function) and next(iter(inspect.signature(_function).parameters), None) == "bundle":
        globals()[_name] = _takes_a_model(_function)
