"""The public Python API; the CLI is a thin layer over it.

>>> import attnviz
>>> bundle = attnviz.load("en-de")                       # a name under pretrained/, or a directory
>>> attnviz.translate(bundle, "twenty-one")
'einundzwanzig'
>>> maps = attnviz.attention(bundle, "twenty-one")       # the same data as `attnviz attention`
>>> maps.cross.shape                                     # (layers, heads, target, source)
"""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import numpy as np
import sentencepiece
import torch

from attnviz.checkpoints import Bundle, load_checkpoint
from attnviz.checkpoints.catalog import DEFAULT_MODEL, MINILM, list_models, resolve_model
from attnviz.decoding import Decoding, greedy_decode
from attnviz.decoding import step_through as _step_through
from attnviz.devices import device_name
from attnviz.errors import InputError, NonFiniteError
from attnviz.export import AXES, FORMAT_VERSION, AttentionExport, ForwardPass, load_export, package_version
from attnviz.hooks import Recorder, act_name, attention_site
from attnviz.kinds import KINDS
from attnviz.linear import onednn_enabled

MAX_OUTPUT_TOKENS = 256

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MODEL",
    "MINILM",
    "AttentionExport",
    "ForwardPass",
    "attention",
    "attention_scores",
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


def translate(bundle: Bundle, text: str, beam: int = 1) -> str:
    """The model's output for ``text``: greedy with ``beam`` 1, else beam search.

    An output cut at the length limit (:data:`MAX_OUTPUT_TOKENS`, or the model's positions) is
    logged as a warning; :func:`step_through` and :func:`attention` also record it.
    """
    src, _ = _source_tensor(bundle, text)
    if beam == 1:
        ids, _ = _greedy(bundle, src)
    else:
        decoding = _step_through(bundle.model, src, beam_size=beam, max_len=_max_output(bundle, src.shape[1]))
        if decoding.truncated:
            _say_truncated(_max_output(bundle, src.shape[1]))
        ids = decoding.ids
    return bundle.tokenizer.decode(ids)


def step_through(bundle: Bundle, text: str, beam: int = 1, top_k: int = 5, target: str | None = None) -> Decoding:
    """Decode ``text`` step by step (greedy, beam search, or teacher-forced on ``target``).

    Every :class:`~attnviz.decoding.DecodeStep` holds the chosen token, the top-k candidates, and
    that step's decoder self-attention and cross-attention rows for every layer and head.
    """
    src, _ = _source_tensor(bundle, text)
    forced = None
    if target is not None:
        forced = list(bundle.tokenizer.encode_target(target)[1].ids)
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


@torch.no_grad()
def attention(bundle: Bundle, src: str, tgt: str | None = None) -> AttentionExport:
    """Every attention map for ``src``, with ``tgt`` (or, without it, the model's greedy output)
    as the decoder input."""
    src_ids, src_tokens, tgt_ids, tgt_tokens, tgt_tensor, truncated = _inputs(bundle, src, tgt)
    result = bundle.model(src_ids, tgt_tensor, return_attention=True, return_logits=False).attention

    def stack(kind: str) -> np.ndarray | None:
        if not getattr(result, kind):  # an encoder-only model has no decoder or cross maps
            return None
        return result.stacked(kind)[:, 0].float().cpu().numpy()  # (L, B=1, H, Q, K) -> (L, H, Q, K)

    manifest = {
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
