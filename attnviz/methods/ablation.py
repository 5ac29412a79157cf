"""Switching heads off: the model's output with some attention heads ablated, the shared model untouched.

A head is ablated at its ``heads`` point (`attnviz.hooks`), its weighted sum of values before
the concatenation and W_O, in one of two modes:

- ``zero``: the head's output is 0 at every query position (so W_O adds only its bias for it), as
  in Michel et al. (2019, "Are Sixteen Heads Really Better than One?", NeurIPS, arXiv:1905.10650).
- ``mean``: the head's output is replaced, at every query position, by its mean over the query
  positions of the intact model on the same sentence pair (the source for encoder heads, the
  decoder input for decoder and cross-attention heads): the head keeps its average message and
  loses what depends on the token. The means come from the intact model, so that decoding step by
  step (where one position is computed at a time) uses the same vectors as a teacher-forced pass.

An [`Ablation`][attnviz.methods.ablation.Ablation] is a set of heads and a mode; `ablation_scope` turns it into an
`Edit` active inside a ``with`` block, for this thread only: decoding,
forward passes and the maps inside the block see the ablated model.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from attnviz.config import TransformerConfig
from attnviz.decoding import Decoding
from attnviz.errors import InputError
from attnviz.hooks import Edit, Recorder, act_name, attention_site
from attnviz.kinds import KINDS
from attnviz.model import Transformer

MODES = {
    "zero": "the head's output is set to zero before W_O",
    "mean": "the head's output is replaced by its mean over the sentence's query positions (intact model)",
}
_HEAD = re.compile(r"(encoder|decoder|cross):(\d+)\.(\d+)")
SYNTAX = "KIND:LAYER.HEAD[,KIND:LAYER.HEAD...] with KIND encoder, decoder or cross and LAYER, HEAD from 1"


@dataclass(frozen=True)
class Ablation:
    """Heads to switch off, as (kind, layer, head) with layer and head from 0, and how (``zero`` or ``mean``).

    Text form ([`parse`][attnviz.methods.ablation.Ablation.parse], ``str``): ``cross:1.2,encoder:3.1``,
    layers and heads from 1 as the app shows them. An empty ablation changes nothing.
    """

    heads: frozenset[tuple[str, int, int]] = frozenset()
    mode: str = "zero"

    def __post_init__(self):
        object.__setattr__(self, "heads", frozenset(self.heads))
        if not isinstance(self.mode, str) or self.mode not in MODES:  # a list is no key of MODES: TypeError
            raise InputError(f"the ablation mode must be {' or '.join(MODES)}, got {self.mode!r}")
        for head in self.heads:
            if (
                not isinstance(head, tuple)
                or len(head) != 3
                or head[0] not in KINDS
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in head[1:])
            ):
                raise InputError(f"a head is (kind, layer from 0, head from 0) with kind one of {KINDS}; got {head!r}")

    @classmethod
    def parse(cls, text: str, mode: str = "zero") -> Ablation:
        """The heads of ``text`` (``KIND:LAYER.HEAD`` separated by commas, 1-based); InputError on bad syntax."""
        if not isinstance(text, str):  # None or a number had failed on text.split
            raise InputError(f"text must be the heads as text, {SYNTAX}, e.g. 'cross:1.2'; got {type(text).__name__}")
        heads = set()
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            match = _HEAD.fullmatch(part)
            if match is None or int(match[2]) < 1 or int(match[3]) < 1:
                raise InputError(f"cannot read the head {part!r}: write {SYNTAX}, e.g. cross:1.2")
            heads.add((match[1], int(match[2]) - 1, int(match[3]) - 1))
        return cls(frozenset(heads), mode)

    @classmethod
    def of(cls, ablate: str | Ablation | Iterable[tuple[str, int, int]] | None, mode: str = "zero") -> Ablation:
        """An Ablation from None, text ([`parse`][attnviz.methods.ablation.Ablation.parse]), an Ablation, or
        (kind, layer, head) tuples from 0."""
        if ablate is None:
            return cls(frozenset(), mode)
        if isinstance(ablate, Ablation):
            return ablate
        if isinstance(ablate, str):
            return cls.parse(ablate, mode)
        try:
            heads = frozenset(ablate)
        except TypeError:
            raise InputError(
                f"ablate takes text such as 'cross:1.2', an Ablation, or (kind, layer, head) tuples; got "
                f"{type(ablate).__name__}"
            ) from None
        return cls(heads, mode)

    def __bool__(self) -> bool:
        return bool(self.heads)

    def sorted_heads(self) -> list[tuple[str, int, int]]:
        return sorted(self.heads, key=lambda h: (KINDS.index(h[0]), h[1], h[2]))

    def __str__(self) -> str:
        return ",".join(f"{kind}:{layer + 1}.{head + 1}" for kind, layer, head in self.sorted_heads())

    def check(self, cfg: TransformerConfig) -> Ablation:
        """Itself, or an InputError naming the model's sizes when a layer, head or kind does not exist."""
        for kind, layer, head in self.sorted_heads():
            layers = cfg.n_layers_of(kind)
            label = f"{kind}:{layer + 1}.{head + 1}"
            if layers == 0:
                raise InputError(f"cannot ablate {label}: this model is {cfg.architecture}, it has no {kind} attention")
            if layer >= layers or head >= cfg.n_heads:
                raise InputError(
                    f"cannot ablate {label}: this model has {cfg.n_enc_layers} encoder and {cfg.n_dec_layers} "
                    f"decoder layers (cross-attention: one per decoder layer) and {cfg.n_heads} heads per layer"
                )
        return self

    def by_site(self) -> dict[str, list[int]]:
        """Head indices to ablate per attention site (``decoder.0.cross_attn``...)."""
        sites: dict[str, list[int]] = {}
        for kind, layer, head in self.sorted_heads():
            sites.setdefault(attention_site(kind, layer), []).append(head)
        return sites

    def needs_target(self) -> bool:
        """Whether its means are taken over a decoder input (mean mode with decoder or cross-attention heads)."""
        return self.mode == "mean" and any(kind != "encoder" for kind, _, _ in self.heads)


def all_heads(cfg: TransformerConfig, kinds: Iterable[str] = KINDS) -> list[str]:
    """Every head of the model in text form (``encoder:1.1`` ...), in kind, layer, head order."""
    out = []
    for kind in kinds:
        layers = cfg.n_layers_of(kind)
        out += [f"{kind}:{layer}.{head}" for layer in range(1, layers + 1) for head in range(1, cfg.n_heads + 1)]
    return out


def whole_layers(cfg: TransformerConfig, kinds: Iterable[str] = KINDS) -> list[str]:
    """Every layer of the model in text form (``encoder:1`` ...): all of that layer's heads at once."""
    out = []
    for kind in kinds:
        layers = cfg.n_layers_of(kind)
        out += [f"{kind}:{layer}" for layer in range(1, layers + 1)]
    return out


def expand_layers(chosen: Iterable[str], n_heads: int) -> list[str]:
    """``chosen`` heads (``cross:1.2``) and whole layers (``cross:3``) as heads alone, each once, in order."""
    out = []
    for item in chosen:
        heads = [f"{item}.{h}" for h in range(1, n_heads + 1)] if "." not in item else [item]
        out += [h for h in heads if h not in out]
    return out


@torch.no_grad()
def head_means(model: Transformer, src: Tensor, tgt: Tensor | None, sites: Iterable[str]) -> dict[str, Tensor]:
    """Each site's head outputs averaged over the query positions of the intact model: site -> (1, H, 1, Dh)."""
    names = {act_name(site, "heads"): site for site in sites}
    with Recorder(names) as rec:
        model(src, tgt, return_logits=False)
    return {site: rec.tensors[name].mean(dim=2, keepdim=True) for name, site in names.items()}


def _zero(heads: list[int]):
    def edit(h: Tensor) -> Tensor:  # (B, H, Q, Dh)
        return h.index_fill(1, torch.tensor(heads, device=h.device), 0.0)

    return edit


def _replace_by(mean: Tensor, heads: list[int]):
    def edit(h: Tensor) -> Tensor:  # (B, H, Q, Dh); mean (1, H, 1, Dh)
        chosen = torch.zeros(1, h.shape[1], 1, 1, dtype=torch.bool, device=h.device)
        chosen[0, heads] = True
        return torch.where(chosen, mean.to(h.dtype), h)

    return edit


def ablation_scope(
    model: Transformer, ablation: Ablation, src: Tensor | None = None, tgt: Tensor | None = None
) -> contextlib.AbstractContextManager:
    """A ``with`` block in which ``model`` runs with ``ablation``'s heads switched off (for this thread only).

    The mean mode needs the sentence pair its means are taken over: ``src`` (1, S) and, for
    decoder-side heads, ``tgt`` (1, T). An empty ablation gives a block that changes nothing.
    """
    ablation.check(model.cfg)
    if not ablation:
        return contextlib.nullcontext()
    sites = ablation.by_site()
    if ablation.mode == "zero":
        return Edit({act_name(site, "heads"): _zero(heads) for site, heads in sites.items()})
    if (src is None and not model.cfg.decoder_only) or (ablation.needs_target() and tgt is None):
        raise ValueError("mean ablation needs the sentences its means are taken over (src, and tgt for decoder heads)")
    means = head_means(model, src, tgt if ablation.needs_target() else None, sites)
    return Edit({act_name(site, "heads"): _replace_by(means[site], heads) for site, heads in sites.items()})


def step_comparison(intact: Decoding, ablated: Decoding, label, top: int = 3) -> pd.DataFrame:
    """One row per step of two teacher-forced decodings of the same tokens: the token's probability in each.

    ``label`` maps a token id to its text. Columns: ``step`` (from 1), ``token``, ``p intact``,
    ``p ablated``, ``change`` (ablated - intact), and each model's ``top`` most likely tokens.
    """
    if [s.token_id for s in intact.steps] != [s.token_id for s in ablated.steps]:
        raise ValueError("the two decodings must read the same tokens (teacher-forced on one target)")

    def best(step) -> str:
        return ", ".join(f"{label(c.token_id)} {c.prob:.3f}" for c in step.top[:top])

    return pd.DataFrame(
        [
            {
                "step": a.index + 1,
                "token": label(a.token_id),
                "p intact": a.prob,
                "p ablated": b.prob,
                "change": b.prob - a.prob,
                "intact top": best(a),
                "ablated top": best(b),
            }
            for a, b in zip(intact.steps, ablated.steps, strict=True)
        ]
    )
