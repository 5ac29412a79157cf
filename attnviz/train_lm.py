"""Training attnviz's own language model (``attnviz train induction``), and reading its heads' roles.

The model is the paper's decoder with no encoder and no cross-attention: post-LN, ReLU, sinusoidal
positions, embeddings scaled and tied to the output. It reads ``<s>`` and a text one token at a
time and predicts each next token. On the induction task (random letters, then the same letters
again) the second half can only be predicted by looking back: Olsson et al. (2022, "In-context
Learning and Induction Heads") show that a previous-token head in the first layer and an
induction head in the second form for it, with a sudden drop of the loss (a phase change). The
card records the loss curve, the held-out accuracy on the repeated half, and which heads do what.
"""

from __future__ import annotations

import dataclasses
import itertools
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from attnviz.atlas.roles import mean_repeat_scores
from attnviz.checkpoints.native import WEIGHTS_FILE, save_checkpoint
from attnviz.data import HELDOUT_SHARE, REVERSE_ALPHABET, Task
from attnviz.model import Transformer, TransformerConfig
from attnviz.optim import paper_optimizer
from attnviz.tokenizer import SentencePieceTokenizer, pad_batch, train_sentencepiece

CURVE_EVERY = 100  # steps between the points of the card's loss curve
PROBE_PERIOD = 10  # letters per half of the probes that find the heads
PROBES = 200


def lm_batch(texts: list[str], tok: SentencePieceTokenizer, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, valid, labels): ``<s>`` and the text without its last token, and the text shifted by one
    (-100 on padding, which the loss ignores)."""
    ids = [tok.encode_source(t).ids for t in texts]
    x, valid = pad_batch([s[:-1] for s in ids], tok.pad_id, device)
    y, y_valid = pad_batch([s[1:] for s in ids], tok.pad_id, device)
    return x, valid, y.masked_fill(~y_valid, -100)


@torch.no_grad()
def repeat_accuracy(model: Transformer, tok: SentencePieceTokenizer, texts: list[str]) -> float:
    """Share of the repeated half's tokens (all but its first, which nothing announces) predicted exactly."""
    was_training = model.training
    model.eval()
    correct = total = 0
    for i in range(0, len(texts), 250):
        chunk = texts[i : i + 250]
        x, valid, y = lm_batch(chunk, tok, model.device)
        predicted = model(None, x, None, valid).logits.argmax(-1)
        for row, text in enumerate(chunk):
            k = len(text.split()) // 2
            # labels j predict token j + 1 of "<s> x1..xk x1..xk": the repeat's second token is j = k + 1
            span = slice(k + 1, 2 * k)
            correct += int((predicted[row, span] == y[row, span]).sum())
            total += k - 1
    model.train(was_training)
    return correct / total


def head_roles(model: Transformer, tok: SentencePieceTokenizer, seed: int) -> dict[str, np.ndarray]:
    """Each head's induction, previous-token and first-token scores (L, H), averaged over repeated
    random-letter probes of :data:`PROBE_PERIOD` letters (drawn with ``seed``)."""
    rng = random.Random(f"induction-probes/{seed}")
    texts = (
        " ".join(letters + letters)
        for letters in (rng.choices(REVERSE_ALPHABET, k=PROBE_PERIOD) for _ in range(PROBES))
    )
    with torch.no_grad():
        return mean_repeat_scores(model, [tok.encode_source(text).ids for text in texts], start=1, period=PROBE_PERIOD)


def named_heads(roles: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
    """The previous-token head (the first layer's best) and the induction head (the last layer's best),
    as (layer, head) counted from 1."""
    first = int(np.argmax(roles["previous"][0]))
    last = int(np.argmax(roles["induction"][-1]))
    return {"previous-token": (1, first + 1), "induction": (roles["induction"].shape[0], last + 1)}


def _config(tok: SentencePieceTokenizer, recipe) -> TransformerConfig:
    return TransformerConfig(
        src_vocab_size=tok.src_vocab_size,
        tgt_vocab_size=tok.tgt_vocab_size,
        n_enc_layers=0,
        n_dec_layers=recipe.n_layers,
        d_model=recipe.d_model,
        n_heads=recipe.n_heads,
        d_ff=recipe.d_ff,
        dropout=recipe.dropout,
        max_len=64,
    )


def train_lm(task: Task, recipe, out: Path, seed: int, dev, eval_n: int, eval_seed: int, overrides: dict) -> dict:
    """Train ``task``'s language model and write its checkpoint directory with its card; returns its info."""
    from attnviz.train import _progress, optimise, running_mean  # the translation models' own steps

    start = time.time()
    texts = [t for t, _ in task.pairs(2000, seed)]
    spm_bytes = train_sentencepiece(texts, task.vocab_size, task.spm_model_type, task.symbols)
    tok = SentencePieceTokenizer(spm_bytes, decoder_only=True)
    model = Transformer(_config(tok, recipe)).to(dev).train()
    optimizer, schedule = paper_optimizer(model.parameters(), recipe.d_model, recipe.warmup, recipe.lr_scale)
    stream = task.stream(seed, "train")
    loss_avg, curve = None, []
    for step in range(1, recipe.steps + 1):
        x, valid, y = lm_batch([t for t, _ in itertools.islice(stream, recipe.batch_size)], tok, dev)
        logits = model(None, x, None, valid).logits
        value = optimise(optimizer, schedule, logits, y, recipe.label_smoothing)
        loss_avg = running_mean(loss_avg, value, step, keep=0.95)
        if step % CURVE_EVERY == 0:
            curve.append((step, round(loss_avg, 4)))
        if step % 10 == 0 or step == recipe.steps:
            _progress(step, recipe.steps, loss_avg, schedule.get_last_lr()[0], start)
    print(file=sys.stderr)
    model.eval()
    accuracy = repeat_accuracy(model, tok, [t for t, _ in task.pairs(eval_n, eval_seed, "heldout")])
    roles = head_roles(model, tok, eval_seed)
    heads = named_heads(roles)
    info = {
        "name": task.name,
        "task": task.name,
        "description": task.description,
        "examples": list(task.examples),
        "seed": seed,
        "recipe": dataclasses.asdict(recipe),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "train_minutes": round((time.time() - start) / 60, 2),
        "hardware": f"{platform.machine()} {dev.type}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "metrics": {"repeat_accuracy": round(accuracy, 4), "n": eval_n, "seed": eval_seed},
        "heads": {role: f"layer {layer} head {head}" for role, (layer, head) in heads.items()},
        "loss_curve": curve,
    }
    flags = "".join(f" --{k.replace('_', '-')} {v}" for k, v in overrides.items() if v is not None)
    command = f"attnviz train {task.name} --out {out.as_posix()} --seed {seed}{flags}"
    save_checkpoint(model, out, spm_bytes, info, card="")
    info["weights_bytes"] = (out / WEIGHTS_FILE).stat().st_size
    (out / "README.md").write_text(card(task, recipe, model.cfg, info, roles, heads, command))
    print(f"repeat_accuracy={accuracy:.4f} on {eval_n} held-out texts; wrote {out}", file=sys.stderr)
    return info


def card(task: Task, recipe, cfg: TransformerConfig, info: dict, roles: dict, heads: dict, command: str) -> str:
    """The model card: task, recipe, command, held-out accuracy, the loss curve and the heads' roles."""
    m = info["metrics"]
    status = "meets" if m["repeat_accuracy"] >= recipe.target_exact_match else "DOES NOT meet"
    rows = "\n".join(
        f"| layer {layer + 1} head {head + 1} | {roles['previous'][layer, head]:.3f} | "
        f"{roles['induction'][layer, head]:.3f} | {roles['bos'][layer, head]:.3f} |"
        for layer in range(cfg.n_dec_layers)
        for head in range(cfg.n_heads)
    )
    curve = " ".join(f"{step}:{loss:.2f}" for step, loss in info["loss_curve"])
    (pl, ph), (il, ih) = heads["previous-token"], heads["induction"]
    return f"""# attnviz model: {task.name}

**Task.** A language model: {task.description}, as in `{task.examples[0]}`. The first half
cannot be predicted; the second half can, by looking back.

**Heads.** The previous-token head is **layer {pl} head {ph}** (each letter looks at the one before
it), and the induction head is **layer {il} head {ih}** (in the repeated half, each letter looks at
the letter after its own earlier occurrence, and the model copies it), counted from 1. Open
`q w e r t y q w e r t y` in the explorer to see both.

**Data.** Generated at training time by `attnviz.data` with fixed seeds; nothing is downloaded.
Texts are split by CRC-32: one in {HELDOUT_SHARE} is held out and never used for training.

**Model.** The paper's decoder with no encoder and no cross-attention (a language model):
post-LayerNorm, ReLU, interleaved sinusoidal positions, embeddings scaled by sqrt(d_model) and tied
to the output; N = {cfg.n_dec_layers} layers, d_model = {cfg.d_model}, h = {cfg.n_heads} heads,
d_ff = {cfg.d_ff}, one piece per letter ({cfg.tgt_vocab_size} pieces with the special ones);
{info["n_parameters"]:,} parameters, {info["weights_bytes"] / 1e6:.2f} MB of float32 weights.

**Training.** Next-token prediction on every position, Adam (beta1 0.9, beta2 0.98, eps 1e-9),
learning rate of equation 3 with warmup {recipe.warmup} steps (scale {recipe.lr_scale}), label
smoothing {recipe.label_smoothing}, dropout {recipe.dropout}, {recipe.steps} steps of {recipe.batch_size} texts,
seed {info["seed"]}.
Trained in {info["train_minutes"]:.1f} minutes on {info["hardware"]}.

**Loss** (running mean, nats per token, every {CURVE_EVERY} steps; the drop is the phase change in which
the induction head forms): {curve}

**Evaluation.** Greedy next-token prediction on {m["n"]} freshly generated held-out texts (seed {m["seed"]}):
accuracy on the repeated half, all but its first letter, **{m["repeat_accuracy"]:.4f}** (target
{recipe.target_exact_match}: {status}).

Reproduce:

```
{command}
```

**Every head** on {PROBES} probes of {PROBE_PERIOD} random letters repeated (Olsson et al.'s repeated random tokens):
the mean weight on the previous token, on the token after the current token's earlier occurrence
(induction), and on the first token, `<s>` (bos).

| head | previous | induction | bos |
|---|---|---|---|
{rows}
"""
