"""The paper's encoder-decoder models on generated translation tasks (``en-de``, ``reverse``): their batches,
their evaluation (exact match of the greedy output on held-out pairs) and their card.

`attnviz.training.loop` runs the one training loop; this module says what a step reads and what
the end of a training writes.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from attnviz.decoding import greedy_decode
from attnviz.model import Transformer, TransformerConfig
from attnviz.tokenizer import SentencePieceTokenizer, Tokenizer, pad_batch, train_sentencepiece
from attnviz.training.data import HELDOUT_SHARE, Task
from attnviz.training.recipes import Recipe

MONITOR_EVERY = 500  # steps between the progress line's held-out exact match
MONITOR_PAIRS = 200


def make_batch(pairs: list[tuple[str, str]], tok: Tokenizer, device):
    """(src, src_valid, tgt_in, tgt_valid, labels) tensors for a list of (source, target) texts."""
    srcs, tgt_ins, labels = [], [], []
    for src, tgt in pairs:
        srcs.append(tok.encode_source(src).ids)
        inp, lab = tok.encode_target(tgt)
        tgt_ins.append(inp.ids)
        labels.append(lab.ids)
    src_ids, src_valid = pad_batch(srcs, tok.pad_id, device)
    tgt_ids, tgt_valid = pad_batch(tgt_ins, tok.pad_id, device)
    label_ids, label_valid = pad_batch(labels, tok.pad_id, device)
    label_ids = label_ids.masked_fill(~label_valid, -100)  # ignored by the loss
    return src_ids, src_valid, tgt_ids, tgt_valid, label_ids


@torch.no_grad()
def exact_match(
    model: Transformer, tok: Tokenizer, pairs: list[tuple[str, str]], batch_size: int = 250
) -> tuple[float, list[tuple[str, str, str]]]:
    """Share of pairs whose greedy output equals the reference exactly, and the misses."""
    was_training = model.training
    model.eval()
    misses = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        src, src_valid = pad_batch([tok.encode_source(s).ids for s, _ in chunk], tok.pad_id, model.device)
        longest = max(len(tok.encode_target(t)[1].ids) for _, t in chunk)
        for (s, t), ids in zip(chunk, greedy_decode(model, src, src_valid, max_len=longest + 8), strict=True):
            out = tok.decode(ids)
            if out != t:
                misses.append((s, t, out))
    model.train(was_training)
    return 1 - len(misses) / len(pairs), misses


def forward(model: Transformer, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (B, T, V), labels (B, T)) of a batch of `make_batch`."""
    src, src_valid, tgt, tgt_valid, labels = batch
    return model(src, tgt, src_valid, tgt_valid).logits, labels


def tokenizer(task: Task, recipe: Recipe, seed: int) -> tuple[bytes, SentencePieceTokenizer]:
    """The task's sentencepiece model (bytes), trained on generated pairs, and the tokenizer it makes."""
    sentences = [s for pair in task.pairs(recipe.spm_sentences, seed) for s in pair]
    spm_bytes = train_sentencepiece(sentences, task.vocab_size, task.spm_model_type, task.symbols)
    return spm_bytes, SentencePieceTokenizer(spm_bytes)


def config(tok: Tokenizer, recipe: Recipe) -> TransformerConfig:
    """The model of ``recipe`` for ``tok``'s vocabulary (512 positions, sinusoids)."""
    return TransformerConfig(
        src_vocab_size=tok.src_vocab_size,
        tgt_vocab_size=tok.tgt_vocab_size,
        n_enc_layers=recipe.n_layers,
        n_dec_layers=recipe.n_layers,
        d_model=recipe.d_model,
        n_heads=recipe.n_heads,
        d_ff=recipe.d_ff,
        dropout=recipe.dropout,
        max_len=512,
    )


def step_texts(task: Task, recipe: Recipe, seed: int):
    """One list of ``batch_size`` training pairs per step, in stream order, endlessly."""
    stream = task.stream(seed, "train")
    while True:
        yield list(itertools.islice(stream, recipe.batch_size))


class Monitor:
    """The progress line's held-out exact match, every `MONITOR_EVERY` steps and at the last."""

    def __init__(self, task: Task, tok: Tokenizer, seed: int, last: int):
        self.pairs = task.pairs(MONITOR_PAIRS, seed, "heldout")  # progress only; the card reports a fresh draw
        self.tok, self.last, self.text = tok, last, ""

    def __call__(self, step: int, model: Transformer) -> str:
        if step % MONITOR_EVERY == 0 or step == self.last:
            em, _ = exact_match(model, self.tok, self.pairs)
            self.text = f", held-out exact match {em:.3f}"
        return self.text


def evaluate(model: Transformer, tok: Tokenizer, task: Task, eval_n: int, eval_seed: int, loss_avg: float) -> dict:
    """The card's evaluation: metrics and the misses, on ``eval_n`` fresh held-out pairs."""
    em, misses = exact_match(model, tok, task.pairs(eval_n, eval_seed, "heldout"))
    return {
        "metrics": {"exact_match": em, "n": eval_n, "seed": eval_seed, "final_loss": round(loss_avg, 4)},
        "misses": misses,
    }


def write_card(
    out: Path, task: Task, recipe: Recipe, cfg: TransformerConfig, info: dict, misses, command: str, formation: str = ""
) -> None:
    """The card, README.md in ``out``."""
    (out / "README.md").write_text(card(task, recipe, cfg, {**info, "misses": misses}, command, formation))


def card(task: Task, recipe: Recipe, cfg: TransformerConfig, info: dict, command: str, formation: str = "") -> str:
    """The model card: task, data, model, recipe, evaluation and its misses, and how its characteristic head formed."""
    m = info["metrics"]
    status = "meets" if m["exact_match"] >= recipe.target_exact_match else "DOES NOT meet"
    misses = "\n".join(f"| {s} | {t} | {o} |" for s, t, o in info["misses"][:10]) or "| (none) | | |"
    return f"""# attnviz model: {task.name}

**Task.** {task.description}.

**Examples.** {", ".join(f"`{e}`" for e in task.examples)}

**Data.** Generated at training time by `attnviz.training.data` with fixed seeds; nothing is downloaded.
Source strings are split by CRC-32: one in {HELDOUT_SHARE} is held out and never used for training, and
the evaluation draws only from that held-out part.

**Model.** The paper's encoder-decoder (post-LayerNorm, ReLU, interleaved sinusoidal positions,
embeddings scaled by sqrt(d_model), one embedding matrix shared by source, target and output)
at a small size: N = {cfg.n_enc_layers} layers, d_model = {cfg.d_model}, h = {cfg.n_heads} heads,
d_ff = {cfg.d_ff}, a shared sentencepiece vocabulary of {cfg.src_vocab_size} pieces;
{info["n_parameters"]:,} parameters, {info["weights_bytes"] / 1e6:.1f} MB of float32 weights.

**Training.** Adam (beta1 0.9, beta2 0.98, eps 1e-9), learning rate of equation 3 with
warmup {recipe.warmup} steps (scale {recipe.lr_scale}), label smoothing {recipe.label_smoothing},
dropout {recipe.dropout}, {recipe.steps} steps of {recipe.batch_size} pairs, seed {info["seed"]}.
Trained in {info["train_minutes"]:.1f} minutes on {info["hardware"]}.

**Evaluation.** Greedy decoding, exact match on {m["n"]} freshly generated held-out pairs
(seed {m["seed"]}): **{m["exact_match"]:.4f}** (target {recipe.target_exact_match}: {status}).
Final training loss (label-smoothed): {m["final_loss"]:.4f}.

Reproduce:

```
{command}
attnviz evaluate --model {task.name} --n {m["n"]} --seed {m["seed"]}
```

{formation}
Some misses of the evaluation (source | reference | output):

| source | reference | output |
|---|---|---|
{misses}
"""
