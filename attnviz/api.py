"""The public Python API; the CLI is a thin layer over it.

>>> import attnviz
>>> bundle = attnviz.load("en-de")                       # a name under pretrained/, or a directory
>>> attnviz.translate(bundle, "twenty-one")
'einundzwanzig'
>>> maps = attnviz.attention(bundle, "twenty-one")       # the same data as `attnviz attention`
>>> maps.cross.shape                                     # (layers, heads, target, source)
>>> atlas = attnviz.api.compute_atlas(bundle, ["twenty-one", "seven"])  # every head over many sentences
>>> atlas.heads[["kind", "layer", "head", "entropy"]]      # build_atlas writes a corpus's to a folder
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import sentencepiece
import torch

from attnviz.atlas import Atlas, build_atlas, compute_atlas, load_atlas
from attnviz.checkpoints import Bundle, load_checkpoint
from attnviz.checkpoints.catalog import DEFAULT_MODEL, MINILM, list_models, resolve_model
from attnviz.decoding import Decoding, greedy_decode
from attnviz.decoding import step_through as _step_through
from attnviz.errors import InputError
from attnviz.export import AXES, AttentionExport, ForwardPass, load_export, package_version
from attnviz.hooks import Recorder, act_name, attention_site
from attnviz.kinds import KINDS

MAX_OUTPUT_TOKENS = 256

__all__ = [
    "DEFAULT_MODEL",
    "MINILM",
    "Atlas",
    "AttentionExport",
    "ForwardPass",
    "attention",
    "attention_scores",
    "build_atlas",
    "compute_atlas",
    "load_atlas",
    "list_models",
    "load",
    "load_export",
    "resolve_model",
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


def translate(bundle: Bundle, text: str, beam: int = 1) -> str:
    """The model's output for ``text``: greedy with ``beam`` 1, else beam search."""
    src, _ = _source_tensor(bundle, text)
    if beam == 1:
        ids = greedy_decode(bundle.model, src, max_len=_max_output(bundle, src.shape[1]))[0]
    else:
        ids = _step_through(bundle.model, src, beam_size=beam, max_len=_max_output(bundle, src.shape[1])).ids
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
    return _step_through(
        bundle.model, src, beam_size=beam, top_k=top_k, max_len=_max_output(bundle, src.shape[1]), forced=forced
    )


def _decoder_input(bundle: Bundle, src_ids: torch.Tensor, tgt: str | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The decoder input ids and labels: ``<s>`` and ``tgt``'s pieces, or the greedy output."""
    tok = bundle.tokenizer
    if tgt is None:
        out = greedy_decode(bundle.model, src_ids, max_len=_max_output(bundle, src_ids.shape[1]))[0]
        return (tok.bos_id, *out), tuple(tok.target_token(i) for i in (tok.bos_id, *out))
    enc, _ = tok.encode_target(tgt)
    return enc.ids, enc.tokens


def _inputs(bundle: Bundle, src: str, tgt: str | None):
    """(src ids (1, S), src tokens, tgt ids, tgt tokens, tgt ids (1, T)); the target parts None when encoder-only."""
    src_ids, src_tokens = _source_tensor(bundle, src)
    if bundle.config.encoder_only:
        if tgt is not None:
            raise InputError("this model is encoder-only: it takes no target sentence")
        return src_ids, src_tokens, None, None, None
    tgt_ids, tgt_tokens = _decoder_input(bundle, src_ids, tgt)
    return src_ids, src_tokens, tgt_ids, tgt_tokens, torch.tensor([tgt_ids], device=bundle.device)


@torch.no_grad()
def attention_scores(bundle: Bundle, src: str, tgt: str | None = None) -> dict[str, np.ndarray]:
    """The scaled scores Q K^T / sqrt(d_k) before the softmax, per kind, (L, H, Q, K) float32.

    The same inputs as :func:`attention`; masked entries are ``-inf``.
    """
    src_ids, _, _, _, tgt_tensor = _inputs(bundle, src, tgt)
    layers = {"encoder": bundle.config.n_enc_layers, "decoder": bundle.config.n_dec_layers}
    layers["cross"] = layers["decoder"]
    names = {kind: [act_name(attention_site(kind, i), "scores") for i in range(layers[kind])] for kind in KINDS}
    with Recorder({n for kind_names in names.values() for n in kind_names}) as rec:
        bundle.model(src_ids, tgt_tensor, return_logits=False)
    return {
        kind: torch.stack([rec.tensors[n] for n in kind_names])[:, 0].float().cpu().numpy()
        for kind, kind_names in names.items()
        if kind_names and kind_names[0] in rec.tensors
    }


@torch.no_grad()
def attention(bundle: Bundle, src: str, tgt: str | None = None) -> AttentionExport:
    """Every attention map for ``src``, with ``tgt`` (or, without it, the model's greedy output)
    as the decoder input."""
    src_ids, src_tokens, tgt_ids, tgt_tokens, tgt_tensor = _inputs(bundle, src, tgt)
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
        "axes": AXES,
        "note": "rows are queries, columns are keys; weights are post-softmax, per head",
        "versions": {
            "attnviz": package_version("attnviz"),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "sentencepiece": sentencepiece.__version__,
        },
    }
    return AttentionExport(
        encoder=stack("encoder"),
        decoder=stack("decoder"),
        cross=stack("cross"),
        src_ids=np.array(src_ids[0].tolist(), dtype=np.int64),
        tgt_ids=None if tgt_ids is None else np.array(tgt_ids, dtype=np.int64),
        src_tokens=tuple(src_tokens),
        tgt_tokens=None if tgt_tokens is None else tuple(tgt_tokens),
        manifest=manifest,
    )


@torch.no_grad()
def forward_pass(bundle: Bundle, src: str, tgt: str | None = None) -> ForwardPass:
    """The model's real intermediate tensors for ``src`` (and ``tgt``, or the greedy output)."""
    src_ids, src_tokens, tgt_ids, tgt_tokens, tgt_tensor = _inputs(bundle, src, tgt)
    with Recorder(lambda name: not name.endswith(".mask")) as rec:
        bundle.model(src_ids, tgt_tensor)
    # Batch of one: drop the batch axis; position tables have none.
    tensors = {k: (v if k.endswith(".pos") else v[0]).float().cpu().numpy() for k, v in rec.tensors.items()}
    return ForwardPass(tensors, tuple(src_ids[0].tolist()), tuple(src_tokens), tgt_ids, tgt_tokens)
