"""Small training histories for the tests of "How attention forms", written with attnviz's own history writer.

`write_history` copies a shipped model into a folder and writes beside it a history of a few records
whose maps are the model's real maps on its examples, blended from uniform attention at the first
record to the model's own at the last (rows still sum to 1, the future still 0), and whose heads table
holds a made-up statistic per head: enough for the page to open, step and pick, fast, without training.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from attnviz import api
from attnviz.checkpoints.catalog import pretrained_dir
from attnviz.kinds import causal_mask
from attnviz.training.history import ENCODER_DECODER, LANGUAGE_MODEL, HistoryWriter

STEPS = (0, 100, 200, 300, 400, 500, 600)
# The made-up losses: the language model's drops between steps 200 and 400, as the induction model's does.
TRAIN_LOSS = (3.4, 3.3, 3.2, 2.4, 1.9, 1.85, 1.8)
HELDOUT_LOSS = (3.5, 3.35, 3.25, 2.5, 2.0, 1.9, 1.85)


def _uniform(kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform attention over what each row may see: what a head does before it has learned anything."""
    *lead, Q, K = shape
    seen = causal_mask(Q, K) if kind == "decoder" else np.ones((Q, K), dtype=bool)
    return np.broadcast_to(seen / seen.sum(-1, keepdims=True), shape).astype(np.float32)


def _score(i: int, rise_at: int, fast: bool) -> float:
    """A statistic that rises from 0.05 to 0.9: at once at record ``rise_at`` (``fast``), or slowly."""
    if fast:
        return 0.9 if i >= rise_at else 0.05
    return 0.05 + 0.85 * i / (len(STEPS) - 1)


def write_history(model: str, into: Path, n_probes: int = 2, name: str | None = None) -> Path:
    """A copy of shipped model ``model`` in ``into/name`` (default: ``into/model``) with a history of `STEPS`;
    the copy's folder."""
    folder = into / (name or model)
    shutil.copytree(pretrained_dir() / model, folder, ignore=shutil.ignore_patterns("history"))  # its own, shipped
    bundle = api.load(folder, "cpu")
    lm = bundle.config.decoder_only
    kind = LANGUAGE_MODEL if lm else ENCODER_DECODER
    sites = ("decoder",) if lm else ("encoder", "decoder", "cross")
    texts = bundle.info["examples"][:n_probes]
    exports = [api.attention(bundle, text) for text in texts]
    tokens = [(None if lm else list(e.src_tokens), list(e.tgt_tokens)) for e in exports]
    probes = [(text, None if lm else " ".join(e.tgt_tokens[1:])) for text, e in zip(texts, exports, strict=True)]
    writer = HistoryWriter(folder, kind, bundle.info.get("task", model), probes, {"model": model}, tokens=tokens)
    L, H = bundle.config.n_dec_layers, bundle.config.n_heads
    for i, step in enumerate(STEPS):
        share = i / (len(STEPS) - 1)
        maps = []
        for export in exports:
            final = {site: getattr(export, site) for site in sites}
            maps.append({s: (1 - share) * _uniform(s, m.shape) + share * m for s, m in final.items()})
        rows = []
        for s, site in enumerate(sites):
            for layer in range(1, L + 1):
                for head in range(1, H + 1):
                    k = (s * L + layer - 1) * H + head - 1  # the head's place among every head
                    own = 0.8 * k / (len(sites) * L * H)  # every head's line apart from the others
                    rows.append(
                        {
                            "kind": site,
                            "layer": layer,
                            "head": head,
                            # the previous-token head (layer 1, head 1) forms at record 2, the induction head
                            # (layer 2, head 2) at record 3; every other head stays near 0.05
                            "previous": _score(i, 2, True) if (layer, head) == (1, 1) else 0.05 + own / 2,
                            "induction": _score(i, 3, True) if (layer, head) == (2, 2) else 0.04 + own / 2,
                            "diagonal": own + 0.1 * _score(i, 0, False),
                            "mean_distance": np.nan if site == "cross" else 1.0 + head,
                        }
                    )
        writer.record(step, TRAIN_LOSS[i], HELDOUT_LOSS[i], 1e-3, maps, pd.DataFrame(rows))
    return folder
