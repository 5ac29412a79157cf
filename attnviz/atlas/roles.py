"""Head roles of a language model, measured on Olsson et al.'s probe: repeated random tokens.

A corpus says how heads behave on text; an induction head shows itself on a sequence of random
tokens repeated once (Olsson et al., 2022, "In-context Learning and Induction Heads"): in the
repeated half, it attends to the token right after the current token's earlier occurrence. For a
decoder-only model the atlas adds, per head of its decoder, measured on `PROBES` such
sequences of `PERIOD` tokens drawn from the vocabulary (no special or unknown token), with the BOS the
tokenizer adds before a text:

- ``induction``: the weight on that token (`attnviz.analysis.repeat_scores`);
- ``bos``: the weight on the first position (an attention sink, when a head parks its weight there).

Both are means over the repeated half's queries and the probes; the corpus's ``previous`` stays the
previous-token measure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from attnviz.analysis import repeat_scores
from attnviz.atlas.corpus import special_ids
from attnviz.checkpoints import Bundle

PROBES = 20
PERIOD = 10
SEED = 0
ROLES = ("induction", "bos")


def probe_prefix(bundle: Bundle) -> tuple[int, ...]:
    """What the tokenizer puts before a text: its BOS (Llama, attnviz's own language models) or nothing (GPT-2)."""
    tok = bundle.tokenizer
    first = tok.encode_source("a").ids[0]
    return (first,) if first in special_ids(tok) or first == tok.bos_id else ()


def probe_ids(bundle: Bundle, n: int = PROBES, period: int = PERIOD, seed: int = SEED) -> list[tuple[int, ...]]:
    """``n`` probes: the prefix, ``period`` random ids of the vocabulary (no special one), the same again."""
    tok = bundle.tokenizer
    size = min(tok.tgt_vocab_size, bundle.config.tgt_vocab_size)
    excluded = {*special_ids(tok), tok.unk_id}  # and the unknown token: it stands for no text of its own
    candidates = np.setdiff1d(np.arange(size), np.array(sorted(excluded), dtype=np.int64))
    rng = np.random.default_rng(seed)
    prefix = probe_prefix(bundle)
    probes = []
    for _ in range(n):
        half = tuple(int(i) for i in rng.choice(candidates, size=period, replace=False))
        probes.append((*prefix, *half, *half))
    return probes


@torch.no_grad()
def mean_repeat_scores(model, probes: list[tuple[int, ...]], start: int, period: int) -> dict[str, np.ndarray]:
    """`attnviz.analysis.repeat_scores` of a language model, averaged over ``probes`` (token ids, each
    its first ``start`` ids then ``period`` ids repeated once): {induction, previous, bos: (L, H)}."""
    totals = None
    for ids in probes:
        tensor = torch.tensor([ids], device=model.device)
        maps = model(None, tensor, return_attention=True, return_logits=False).attention.stacked("decoder")
        scores = repeat_scores(maps[:, 0].float().cpu().numpy(), start=start, period=period)
        totals = scores if totals is None else {k: totals[k] + v for k, v in scores.items()}
    return {k: v / len(probes) for k, v in totals.items()}


def role_table(bundle: Bundle, n: int = PROBES, period: int = PERIOD, seed: int = SEED) -> pd.DataFrame:
    """One row per decoder head of a language model: kind, layer, head (from 1), induction, bos."""
    if not bundle.config.decoder_only:
        raise ValueError("head roles are measured on a language model's decoder")
    totals = mean_repeat_scores(bundle.model, probe_ids(bundle, n, period, seed), len(probe_prefix(bundle)), period)
    L, H = totals["induction"].shape
    layer, head = np.meshgrid(np.arange(1, L + 1), np.arange(1, H + 1), indexing="ij")
    return pd.DataFrame(
        {
            "kind": "decoder",
            "layer": layer.ravel(),
            "head": head.ravel(),
            **{role: totals[role].ravel() for role in ROLES},
        }
    )
