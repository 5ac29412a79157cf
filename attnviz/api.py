"""The public Python API; the CLI is a thin layer over it.

>>> import attnviz
>>> bundle = attnviz.load("en-de")                       # a name under pretrained/, or a directory
>>> attnviz.translate(bundle, "twenty-one")
'einundzwanzig'
>>> maps = attnviz.attention(bundle, "twenty-one")       # the same data as `attnviz attention`
>>> maps.cross.shape                                     # (layers, heads, target, source)
>>> attnviz.attribute(bundle, "twenty-one", method="value-zeroing").cross.shape   # (layers, target, source)
>>> attnviz.translate(bundle, "twenty-one", ablate="cross:3.2")   # that head switched off
>>> atlas = attnviz.api.compute_atlas(bundle, ["twenty-one", "seven"])  # every head over many sentences
>>> atlas.heads[["kind", "layer", "head", "entropy"]]      # build_atlas writes a corpus's to a folder
"""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import sentencepiece
import torch

from attnviz.atlas import Atlas, build_atlas, compute_atlas, load_atlas
from attnviz.checkpoints import Bundle, load_checkpoint
from attnviz.checkpoints.catalog import DEFAULT_MODEL, MINILM, list_models, resolve_model
from attnviz.decoding import Decoding, greedy_decode
from attnviz.decoding import step_through as _step_through
from attnviz.devices import device_name
from attnviz.errors import InputError, NonFiniteError
from attnviz.export import AXES, FORMAT_VERSION, AttentionExport, ForwardPass, load_export, package_version
from attnviz.hooks import Recorder, act_name, attention_site
from attnviz.kinds import KINDS, axis_names
from attnviz.linear import onednn_enabled
from attnviz.methods import METHODS
from attnviz.methods.ablation import MODES, Ablation, ablation_scope, step_comparison
from attnviz.methods.importance import HeadImportance
from attnviz.methods.importance import head_importance as _head_importance
from attnviz.tokenizer import pad_batch

MAX_OUTPUT_TOKENS = 256

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MODEL",
    "METHODS",
    "MINILM",
    "Ablation",
    "AblationComparison",
    "Atlas",
    "AttentionExport",
    "ForwardPass",
    "HeadImportance",
    "attention",
    "attention_scores",
    "attribute",
    "compare_ablation",
    "head_importance",
    "build_atlas",
    "compute_atlas",
    "load_atlas",
    "list_models",
    "load",
    "load_export",
    "resolve_model",
    "run_record",
    "step_through",
    "forward_pass",
    "translate",
]


def load(name_or_dir: str | Path = DEFAULT_MODEL, device: str = "auto") -> Bundle:
    """Load a shipped model by name, or any checkpoint directory, onto ``device``."""
    return load_checkpoint(resolve_model(name_or_dir), device)


def _source_tensor(bundle: Bundle, text: str) -> tuple[torch.Tensor, tuple[str, ...]]:
    enc = bundle.tokenizer.encode_source(text)
    return torch.tensor([enc.ids], device=bundle.device), enc.tokens


def _max_output(bundle: Bundle, src_len: int) -> int:
    """How many tokens decoding may produce: generous, but within the model's positions."""
    return min(MAX_OUTPUT_TOKENS, 2 * src_len + 16, bundle.config.max_len - 1)


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
    """
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
    layer and head from 1; their outputs zeroed) or an :class:`~attnviz.methods.ablation.Ablation`
    (which may replace them by their means instead). The model itself is not modified. An output
    cut at the length limit (:data:`MAX_OUTPUT_TOKENS`, or the model's positions) is logged as a
    warning; :func:`step_through` and :func:`attention` also record it.
    """
    src, _ = _source_tensor(bundle, text)
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


def step_through(
    bundle: Bundle,
    text: str,
    beam: int = 1,
    top_k: int = 5,
    target: str | None = None,
    ablate: str | Ablation | None = None,
) -> Decoding:
    """Decode ``text`` step by step (greedy, beam search, or teacher-forced on ``target``).

    Every :class:`~attnviz.decoding.DecodeStep` holds the chosen token, the top-k candidates, and
    that step's decoder self-attention and cross-attention rows for every layer and head.
    ``ablate``: heads switched off, as in :func:`translate`.
    """
    src, _ = _source_tensor(bundle, text)
    ablation = _ablation(bundle, ablate)
    forced = None
    if target is not None:
        forced = list(bundle.tokenizer.encode_target(target)[1].ids)
    with _ablated(bundle, ablation, src, target):
        decoding = _step_through(
            bundle.model, src, beam_size=beam, top_k=top_k, max_len=_max_output(bundle, src.shape[1]), forced=forced
        )
    for step in decoding.steps:
        _check_finite(
            "decoding step's attention", {"decoder": step.self_attn.numpy(), "cross": step.cross_attn.numpy()}
        )
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


def _decoder_input(
    bundle: Bundle, src_ids: torch.Tensor, tgt: str | None
) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
    """The decoder input ids and labels: ``<s>`` and ``tgt``'s pieces, or the greedy output; and
    whether that output was cut at the length limit."""
    tok = bundle.tokenizer
    if tgt is None:
        out, truncated = _greedy(bundle, src_ids)
        return (tok.bos_id, *out), tuple(tok.target_token(i) for i in (tok.bos_id, *out)), truncated
    enc, _ = tok.encode_target(tgt)
    return enc.ids, enc.tokens, False


def _inputs(bundle: Bundle, src: str, tgt: str | None):
    """(src ids (1, S), src tokens, tgt ids, tgt tokens, tgt ids (1, T), truncated); the target parts
    None when encoder-only."""
    src_ids, src_tokens = _source_tensor(bundle, src)
    if bundle.config.encoder_only:
        if tgt is not None:
            raise InputError("this model is encoder-only: it takes no target sentence")
        return src_ids, src_tokens, None, None, None, False
    tgt_ids, tgt_tokens, truncated = _decoder_input(bundle, src_ids, tgt)
    return src_ids, src_tokens, tgt_ids, tgt_tokens, torch.tensor([tgt_ids], device=bundle.device), truncated


@torch.no_grad()
def attention_scores(bundle: Bundle, src: str, tgt: str | None = None) -> dict[str, np.ndarray]:
    """The scaled scores Q K^T / sqrt(d_k) before the softmax, per kind, (L, H, Q, K) float32.

    The same inputs as :func:`attention`; masked entries are ``-inf``.
    """
    src_ids, _, _, _, tgt_tensor, _ = _inputs(bundle, src, tgt)
    layers = {"encoder": bundle.config.n_enc_layers, "decoder": bundle.config.n_dec_layers}
    layers["cross"] = layers["decoder"]
    names = {kind: [act_name(attention_site(kind, i), "scores") for i in range(layers[kind])] for kind in KINDS}
    with Recorder({n for kind_names in names.values() for n in kind_names}) as rec:
        bundle.model(src_ids, tgt_tensor, return_logits=False)
    scores = {
        kind: torch.stack([rec.tensors[n] for n in kind_names])[:, 0].float().cpu().numpy()
        for kind, kind_names in names.items()
        if kind_names and kind_names[0] in rec.tensors
    }
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
    differ (README, "Snapshot testing", measures by how much).
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


def _manifest(bundle: Bundle, src: str, tgt: str | None, inputs: tuple) -> dict:
    """What every export records: the model, its inputs (as :func:`_inputs` gives them), the axes
    and the library versions."""
    src_ids, _, tgt_ids, _, _, truncated = inputs
    return {
        "model": bundle.name,
        "checkpoint_sha256": bundle.sha256,
        "config": bundle.config.to_dict(),
        "src": src,
        "tgt": tgt,
        "tgt_from": (
            "none: encoder-only model"
            if tgt_ids is None
            else "given"
            if tgt is not None
            else "greedy output of the model"
        ),
        "tgt_truncated": truncated,  # the greedy output stopped at the length limit, unfinished
        "max_output_tokens": None if tgt_ids is None else _max_output(bundle, src_ids.shape[1]),
        "axes": AXES,
        "note": "rows are queries, columns are keys; weights are post-softmax, per head",
        "versions": versions(),
        "run": run_record(bundle),
        "format_version": FORMAT_VERSION,
    }


@torch.no_grad()
def attention(
    bundle: Bundle, src: str, tgt: str | None = None, ablate: str | Ablation | None = None
) -> AttentionExport:
    """Every attention map for ``src``, with ``tgt`` (or, without it, the model's greedy output)
    as the decoder input.

    ``ablate``: heads switched off, as in :func:`translate`; without ``tgt`` the decoder input is
    then the ablated model's own greedy output, and the manifest names the ablation.
    """
    ablation = _ablation(bundle, ablate)
    with _ablated(bundle, ablation, _source_tensor(bundle, src)[0], tgt):
        inputs = _inputs(bundle, src, tgt)
        return _maps(bundle, src, tgt, inputs, ablation)


def _maps(bundle: Bundle, src: str, tgt: str | None, inputs: tuple, ablation: Ablation) -> AttentionExport:
    """The export of one forward pass on ``inputs`` (as :func:`_inputs` gives them), run in the caller's scope."""
    src_ids, src_tokens, tgt_ids, tgt_tokens, tgt_tensor, _ = inputs
    result = bundle.model(src_ids, tgt_tensor, return_attention=True, return_logits=False).attention

    def stack(kind: str) -> np.ndarray | None:
        if not getattr(result, kind):  # an encoder-only model has no decoder or cross maps
            return None
        return result.stacked(kind)[:, 0].float().cpu().numpy()  # (L, B=1, H, Q, K) -> (L, H, Q, K)

    manifest = _manifest(bundle, src, tgt, inputs)
    if ablation:
        manifest["ablation"] = {"heads": str(ablation), "mode": ablation.mode, "meaning": MODES[ablation.mode]}
    maps = {kind: stack(kind) for kind in KINDS}
    _check_finite("attention", {kind: m for kind, m in maps.items() if m is not None})
    return AttentionExport(
        encoder=maps["encoder"],
        decoder=maps["decoder"],
        cross=maps["cross"],
        src_ids=np.array(src_ids[0].tolist(), dtype=np.int64),
        tgt_ids=None if tgt_ids is None else np.array(tgt_ids, dtype=np.int64),
        src_tokens=tuple(src_tokens),
        tgt_tokens=None if tgt_tokens is None else tuple(tgt_tokens),
        manifest=manifest,
    )


@dataclass(frozen=True)
class AblationComparison:
    """The intact and the ablated model on one sentence, side by side.

    ``intact`` and ``ablated`` hold the maps for the same decoder input (``tgt``, or the intact
    model's output), so that their rows line up; ``steps`` reads that same input step by step
    (:func:`~attnviz.methods.ablation.step_comparison`: each token's probability under both models and
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
    bundle: Bundle, src: str, ablate: str | Ablation, tgt: str | None = None, top_k: int = 3
) -> AblationComparison:
    """What switching heads off changes for ``src``: translations, step probabilities and maps, side by side."""
    ablation = _ablation(bundle, ablate)
    src_ids, _ = _source_tensor(bundle, src)
    inputs = _inputs(bundle, src, tgt)
    intact = _maps(bundle, src, tgt, inputs, Ablation())
    if bundle.config.encoder_only:
        with _ablated(bundle, ablation, src_ids, None):
            return AblationComparison(ablation, intact, _maps(bundle, src, None, inputs, ablation), None, None, None)
    tok, max_len = bundle.tokenizer, _max_output(bundle, src_ids.shape[1])
    forced = [*inputs[2][1:], tok.eos_id]  # the decoder input, shifted: the token each step reads next
    intact_steps = _step_through(bundle.model, src_ids, top_k=top_k, forced=forced)
    intact_output = tok.decode(greedy_decode(bundle.model, src_ids, max_len=max_len)[0])
    with _ablated(bundle, ablation, src_ids, tgt):
        ablated = _maps(bundle, src, tgt, inputs, ablation)
        ablated_steps = _step_through(bundle.model, src_ids, top_k=top_k, forced=forced)
        ablated_output = tok.decode(greedy_decode(bundle.model, src_ids, max_len=max_len)[0])
    steps = step_comparison(intact_steps, ablated_steps, tok.target_token)
    return AblationComparison(ablation, intact, ablated, intact_output, ablated_output, steps)


def attribute(
    bundle: Bundle, src: str, tgt: str | None = None, method: str = "norm", position: int | None = None
) -> AttentionExport:
    """A contribution method's numbers for ``src`` and ``tgt`` (or the greedy output), as an export.

    ``method`` is a key of :data:`attnviz.methods.METHODS`: ``norm`` (per head, (L, H, Q, K)),
    ``value-zeroing``, ``rollout`` or ``grad-attention`` (per layer, (L, Q, K)), under ``encoder``,
    ``decoder`` and ``cross`` as the maps are. ``position`` (grad-attention only) is the decoder
    position, from 0, whose predicted token is explained (default: the last); the propagated
    relevance is in ``extras`` (``source_relevance`` (S,), ``target_relevance`` (T,)). The manifest
    names the method, its paper and its normalisation.
    """
    spec = METHODS.get(method)
    if spec is None:
        raise InputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if position is not None and not spec.uses_position:
        raise InputError(f"a position applies to {', '.join(m for m in METHODS if METHODS[m].uses_position)} only")
    inputs = _inputs(bundle, src, tgt)
    src_ids, src_tokens, tgt_ids, tgt_tokens, tgt_tensor, _ = inputs
    if spec.needs_decoder and tgt_tensor is None:
        raise InputError(f"{spec.title} explains a prediction of the decoder: this model is encoder-only")
    result = spec.function(bundle.model, src_ids, tgt_tensor, position=position)
    _check_finite(spec.title, {kind: m for kind, m in result.maps.items() if m is not None})
    manifest = _manifest(bundle, src, tgt, inputs)
    lead = ["layer", "head"] if spec.per_head else ["layer"]
    manifest.update(
        method=spec.name,
        method_title=spec.title,
        paper=spec.paper,
        normalisation=spec.normalisation,
        axes={kind: [*lead, *axis_names(kind)] for kind in result.maps},
        note="rows are queries, columns are keys; " + ("per head" if spec.per_head else "per layer"),
        extras=dict(spec.extras),
    )
    if "predicted_token_id" in result.notes:
        manifest["position"] = result.notes["position"]
        manifest["predicted_token_id"] = result.notes["predicted_token_id"]
        manifest["predicted_token"] = bundle.tokenizer.target_token(result.notes["predicted_token_id"])
    return AttentionExport(
        encoder=result.maps["encoder"],
        decoder=result.maps.get("decoder"),
        cross=result.maps.get("cross"),
        src_ids=np.array(src_ids[0].tolist(), dtype=np.int64),
        tgt_ids=None if tgt_ids is None else np.array(tgt_ids, dtype=np.int64),
        src_tokens=tuple(src_tokens),
        tgt_tokens=None if tgt_tokens is None else tuple(tgt_tokens),
        manifest=manifest,
        extras=result.extras,
    )


@torch.no_grad()
def head_importance(
    bundle: Bundle, sentences: list[str] | None = None, references: list[str] | None = None
) -> HeadImportance:
    """How much each head matters: the drop in log-probability per target token when it alone is zeroed.

    Over ``sentences`` (default: the model's example sentences), with ``references`` (one per
    sentence) as the outputs whose log-probability is measured, or without them the intact model's
    own greedy outputs. See :mod:`attnviz.methods.importance`.
    """
    tok = bundle.tokenizer
    sentences = list(bundle.info.get("examples") or []) if sentences is None else list(sentences)
    if not sentences:
        raise InputError("no sentences: this model has no examples, so give the sentences to measure over")
    if references is not None and len(references) != len(sentences):
        raise InputError(f"got {len(references)} references for {len(sentences)} sentences: give one per sentence")
    sources = [tok.encode_source(s).ids for s in sentences]
    if references is not None:
        outputs = [tok.encode_target(r)[1].ids for r in references]
    else:
        src, src_valid = pad_batch(sources, tok.pad_id, bundle.device)
        greedy = greedy_decode(bundle.model, src, src_valid, max_len=_max_output(bundle, src.shape[1]))
        outputs = [(*ids, tok.eos_id) for ids in greedy]
    return _head_importance(bundle.model, list(zip(sources, outputs, strict=True)))


@torch.no_grad()
def forward_pass(bundle: Bundle, src: str, tgt: str | None = None) -> ForwardPass:
    """The model's real intermediate tensors for ``src`` (and ``tgt``, or the greedy output)."""
    src_ids, src_tokens, tgt_ids, tgt_tokens, tgt_tensor, _ = _inputs(bundle, src, tgt)
    with Recorder(lambda name: not name.endswith(".mask")) as rec:
        bundle.model(src_ids, tgt_tensor)
    # Batch of one: drop the batch axis; position tables have none.
    tensors = {k: (v if k.endswith(".pos") else v[0]).float().cpu().numpy() for k, v in rec.tensors.items()}
    _check_finite("tensor", {k: v for k, v in tensors.items() if not k.endswith(".scores")})
    _check_finite("scores", {k: v for k, v in tensors.items() if k.endswith(".scores")}, allow_masked=True)
    return ForwardPass(tensors, tuple(src_ids[0].tolist()), tuple(src_tokens), tgt_ids, tgt_tokens)
