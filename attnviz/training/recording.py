"""What a training records every N steps (``--history-every N``): losses, every head's statistics, probe maps.

A record measures the model in eval mode under ``torch.no_grad`` and restores its mode after: it
draws no random number from torch's generator (the probe texts come from the task's own seeded
generators), so a training with recording ends with exactly the weights of one without.

- the held-out loss: the training's own loss on a fixed batch of `HELDOUT_BATCH` held-out pairs;
- every head's statistics: the atlas's (`attnviz.atlas.compute_atlas`, the same code as
  `attnviz atlas`) over `STATISTICS_PROBES` fixed held-out pairs, teacher-forced with their reference
  targets (a language model: its texts), a language model's ``induction`` and ``bos`` on the
  atlas's repeated random tokens, and for an encoder-decoder model each cross head's
  ``anti_diagonal`` share (`anti_diagonal_share`);
- the full maps of `MAP_PROBES` fixed probe texts, in float16.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnviz.atlas import compute_atlas
from attnviz.atlas.roles import ROLES
from attnviz.atlas.stats import STATISTICS
from attnviz.checkpoints import Bundle
from attnviz.model import Transformer
from attnviz.tokenizer import Tokenizer, pad_batch
from attnviz.training.data import Task
from attnviz.training.history import ENCODER_DECODER, LANGUAGE_MODEL, HistoryWriter

MAP_PROBES = 3  # probe texts whose full maps are kept
STATISTICS_PROBES = 32  # held-out pairs the heads' statistics are measured on
HELDOUT_BATCH = 64  # held-out pairs of the held-out loss
# The task's own seeded generators draw the probes: fixed whatever the training's seed.
MAP_SEED, STATISTICS_SEED, HELDOUT_SEED = 7, 8, 9
EXTRA = ("anti_diagonal",)  # attnviz's own statistic beside the atlas's (`anti_diagonal_share`)
COLUMNS = (*STATISTICS, *ROLES, *EXTRA)  # the statistic columns of every history's heads table


def probe_pairs(task: Task) -> list[tuple[str, str | None]]:
    """The `MAP_PROBES` texts whose maps a history keeps: a language model's examples; held-out pairs otherwise."""
    if task.decoder_only:
        return [(text, None) for text in task.examples[:MAP_PROBES]]
    return task.pairs(MAP_PROBES, MAP_SEED, "heldout")


def anti_diagonal_share(cross: np.ndarray, n_src: int, n_tgt: int) -> np.ndarray:
    """Each head's mean weight on the mirrored source position: (L, H).

    ``cross`` (L, H, T, S) are one sentence's cross-attention maps, ``n_src`` its source pieces before
    ``</s>`` and ``n_tgt`` its decoder input's length. The decoder row i (``<s>`` and the first i output
    pieces) writes output piece i, which reversing copies from source piece n_src - 1 - i: the mean
    over rows i < min(n_tgt, n_src) of the weight on that key. 1 for a head that reads the reversal off
    the source exactly (the textbook's anti-diagonal), 1 / S for a uniform one.
    """
    rows = np.arange(min(n_tgt, n_src))
    return cross[:, :, rows, n_src - 1 - rows].mean(axis=-1)


class TrainingRecorder:
    """Records a training's history into ``out/history`` every ``every`` steps and at its last step."""

    def __init__(
        self,
        out: Path,
        task: Task,
        tok: Tokenizer,
        every: int,
        last: int,
        heldout_loss: Callable[[Transformer, list[tuple[str, str]]], float],
        manifest: dict,
    ):
        if every < 1:
            raise ValueError(f"--history-every must be 1 or more; got {every}")
        self.task, self.tok, self.every, self.last = task, tok, every, last
        self.kind = LANGUAGE_MODEL if task.decoder_only else ENCODER_DECODER
        self.heldout_loss = heldout_loss
        self.heldout = task.pairs(HELDOUT_BATCH, HELDOUT_SEED, "heldout")
        statistics = task.pairs(STATISTICS_PROBES, STATISTICS_SEED, "heldout")
        self.sources = [src for src, _ in statistics]
        self.targets = None if task.decoder_only else [tgt for _, tgt in statistics]
        self.probes = probe_pairs(task)
        self.inputs = [self._ids(text, target) for text, target in self.probes]
        tokens = [(enc_tokens, dec_tokens) for _, enc_tokens, _, dec_tokens in self.inputs]
        how = {
            "every": every,
            "heldout_loss": f"the training's loss on {HELDOUT_BATCH} held-out pairs (seed {HELDOUT_SEED}), eval mode",
            "statistics_probes": f"{STATISTICS_PROBES} held-out pairs (seed {STATISTICS_SEED}), teacher-forced with "
            "their references (a language model: its texts); a language model's induction and bos on the atlas's "
            "repeated random tokens",
        }
        self.writer = HistoryWriter(out, self.kind, task.name, self.probes, {**manifest, **how}, tokens=tokens)
        self.out = Path(out)

    def _ids(self, text: str, target: str | None):
        """(encoder ids or None, their tokens, decoder ids, their tokens) of one probe."""
        if self.task.decoder_only:
            enc = self.tok.encode_source(text)
            return None, None, list(enc.ids), list(enc.tokens)
        src, (tgt, _) = self.tok.encode_source(text), self.tok.encode_target(target)
        return list(src.ids), list(src.tokens), list(tgt.ids), list(tgt.tokens)

    def due(self, step: int) -> bool:
        """Whether ``step`` is recorded: every ``every`` steps and the last."""
        return step % self.every == 0 or step == self.last

    def record(self, step: int, model: Transformer, train_loss: float, lr: float) -> bool:
        """Measure ``model`` at ``step`` and write the record (False: the history had it already)."""
        if step in self.writer.steps:
            return False
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                heldout = float(self.heldout_loss(model, self.heldout))
                maps = [self._maps(model, ids) for ids in self.inputs]
                heads = self._heads(model)
        finally:
            model.train(was_training)
        if not math.isfinite(heldout):
            raise RuntimeError(f"the held-out loss is {heldout} at step {step}; lower --lr-scale")
        return self.writer.record(step, train_loss, heldout, lr, maps, heads)

    def _maps(self, model: Transformer, ids) -> dict[str, np.ndarray]:
        src_ids, _, tgt_ids, _ = ids
        dev = model.device
        tgt = torch.tensor([tgt_ids], device=dev)
        src = None if src_ids is None else torch.tensor([src_ids], device=dev)
        attn = model(src, tgt, return_attention=True, return_logits=False).attention
        sites = ("decoder",) if src is None else ("encoder", "decoder", "cross")
        return {site: attn.stacked(site)[:, 0].float().cpu().numpy().astype(np.float16) for site in sites}

    def _heads(self, model: Transformer) -> pd.DataFrame:
        """Every head's statistics: the atlas's table, and the anti-diagonal share of each cross head."""
        bundle = Bundle(model, self.tok, self.task.name, self.out, "", {"task": self.task.name})
        heads = compute_atlas(bundle, self.sources, self.targets).heads
        for name in COLUMNS:
            if name not in heads.columns:
                heads[name] = np.nan
        if not self.task.decoder_only:
            share = self._anti_diagonal(model)  # (L, H)
            cross = heads["kind"] == "cross"
            heads.loc[cross, "anti_diagonal"] = share[heads.loc[cross, "layer"] - 1, heads.loc[cross, "head"] - 1]
        return heads[["kind", "layer", "head", *COLUMNS]].reset_index(drop=True)

    def _anti_diagonal(self, model: Transformer) -> np.ndarray:
        """The mean over the statistics' pairs of `anti_diagonal_share`: (L, H) of the cross heads."""
        tok, dev = self.tok, model.device
        srcs = [tok.encode_source(s).ids for s in self.sources]
        tgts = [tok.encode_target(t)[0].ids for t in self.targets]
        src, src_valid = pad_batch(srcs, tok.pad_id, dev)
        tgt, tgt_valid = pad_batch(tgts, tok.pad_id, dev)
        attn = model(src, tgt, src_valid, tgt_valid, return_attention=True, return_logits=False).attention
        cross = attn.stacked("cross").float().cpu().numpy()  # (L, B, H, T, S)
        pairs = enumerate(zip(srcs, tgts, strict=True))
        shares = [anti_diagonal_share(cross[:, b], len(s) - 1, len(t)) for b, (s, t) in pairs]
        return np.mean(shares, axis=0)
