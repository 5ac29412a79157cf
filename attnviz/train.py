"""Training with the paper's recipe (section 5), and exact-match evaluation on held-out pairs.

Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9; the learning rate of equation 3,
lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); label smoothing 0.1; dropout on
sub-layer outputs and embedding sums. Data is generated at train time (attnviz.data), seeds are
fixed, and the tokenizer is trained on generated text first, so one command reproduces a model.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from attnviz.checkpoints.native import WEIGHTS_FILE, save_checkpoint
from attnviz.data import HELDOUT_SHARE, Task, get_task
from attnviz.decoding import greedy_decode
from attnviz.devices import resolve_device
from attnviz.model import Transformer, TransformerConfig
from attnviz.optim import paper_optimizer
from attnviz.tokenizer import SentencePieceTokenizer, Tokenizer, pad_batch, train_sentencepiece


@dataclass(frozen=True)
class Recipe:
    """How one shipped model is trained; every field can be overridden from the CLI."""

    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    steps: int
    batch_size: int
    warmup: int  # warmup_steps of equation 3
    dropout: float = 0.1
    label_smoothing: float = 0.1
    lr_scale: float = 1.0  # multiplies equation 3; 1.0 is the paper's schedule
    spm_sentences: int = 20_000  # generated pairs the tokenizer is trained on
    target_exact_match: float = 0.97
    # A language model's (attnviz.train_lm); the translation models ignore them: sinusoids, 512 positions.
    pos_encoding: str = "sinusoidal"
    rope_theta: float = 10000.0
    max_len: int = 64
    batch_tokens: int = 0  # a language model's batches: at most this many tokens, padding included (0: no limit)
    long_steps: int = 0  # a language model's last steps, on its task's long texts (Task.make_long_pair)


RECIPES = {
    "en-de": Recipe(d_model=128, n_layers=3, n_heads=4, d_ff=512, steps=8000, batch_size=96, warmup=1000),
    "reverse": Recipe(
        d_model=128, n_layers=2, n_heads=4, d_ff=512, steps=5000, batch_size=64, warmup=1000, target_exact_match=0.99
    ),
    # A decoder-only model: target_exact_match is the held-out accuracy on the repeated half.
    "induction": Recipe(
        d_model=64,
        n_layers=2,
        n_heads=4,
        d_ff=256,
        steps=3000,
        batch_size=64,
        warmup=400,
        dropout=0.0,
        label_smoothing=0.0,
        target_exact_match=0.95,
    ),  # fmt: skip
    # Rotary positions with a large base (as Qwen2.5's 1e6) turn the slowest pairs of each head little
    # over 4,096 positions. The heads form on short texts (with long texts mixed in from the start,
    # even one in 200, no head formed in 2,500 steps), then the last 1,000 steps on long texts teach
    # them to keep their roles among thousands of keys (after short texts alone the previous-token
    # head put about 0.02 of its weight on the previous token at 4,095 tokens; 400 long steps did no better).
    "induction-long": Recipe(
        d_model=128,
        n_layers=2,
        n_heads=4,
        d_ff=512,
        steps=2800,
        batch_size=32,
        warmup=400,
        dropout=0.0,
        label_smoothing=0.0,
        target_exact_match=0.95,
        pos_encoding="rotary",
        rope_theta=1e6,
        max_len=4096,
        batch_tokens=4096,
        long_steps=1000,
    ),  # fmt: skip
}


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


def optimise(optimizer, schedule, logits, labels, label_smoothing: float) -> float:
    """One step of the paper's training: cross-entropy (padding labels -100 ignored), backward, Adam
    step, the learning-rate schedule; the loss, as a float."""
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=label_smoothing)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    schedule.step()
    return float(loss.detach())


def running_mean(mean: float | None, value: float, step: int, keep: float) -> float:
    """The loss's exponential running mean (``keep`` of the old per step), refusing a diverged run."""
    mean = value if mean is None else keep * mean + (1 - keep) * value
    if not math.isfinite(mean):
        raise RuntimeError(f"training diverged at step {step} (loss {mean}); lower --lr-scale")
    return mean


def _progress(step: int, total: int, loss: float, lr: float, start: float, extra: str = "") -> None:
    done = step / total
    elapsed = time.time() - start
    eta = elapsed / done - elapsed if done else 0.0
    bar = "#" * int(30 * done) + "-" * (30 - int(30 * done))
    print(
        f"\r[{bar}] {step}/{total} loss {loss:.3f} lr {lr:.2e} {elapsed / 60:.1f} min, eta {eta / 60:.1f} min{extra}",
        end="",
        file=sys.stderr,
        flush=True,
    )


def _card(task: Task, recipe: Recipe, cfg: TransformerConfig, info: dict, command: str) -> str:
    m = info["metrics"]
    status = "meets" if m["exact_match"] >= recipe.target_exact_match else "DOES NOT meet"
    misses = "\n".join(f"| {s} | {t} | {o} |" for s, t, o in info["misses"][:10]) or "| (none) | | |"
    return f"""# attnviz model: {task.name}

**Task.** {task.description}.

**Examples.** {", ".join(f"`{e}`" for e in task.examples)}

**Data.** Generated at training time by `attnviz.data` with fixed seeds; nothing is downloaded.
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

Some misses of the evaluation (source | reference | output):

| source | reference | output |
|---|---|---|
{misses}
"""


def train(
    task_name: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    device: str = "auto",
    eval_n: int = 1000,
    eval_seed: int = 1,
    **overrides,
) -> dict:
    """Train a model for ``task_name`` and write its checkpoint directory; returns its info."""
    task = get_task(task_name)
    recipe = dataclasses.replace(RECIPES[task_name], **{k: v for k, v in overrides.items() if v is not None})
    dev = resolve_device(device)
    torch.manual_seed(seed)
    if task.decoder_only:
        from attnviz.train_lm import train_lm

        return train_lm(task, recipe, Path(out_dir), seed, dev, eval_n, eval_seed, overrides)
    start = time.time()

    sentences = [s for pair in task.pairs(recipe.spm_sentences, seed) for s in pair]
    spm_bytes = train_sentencepiece(sentences, task.vocab_size, task.spm_model_type, task.symbols)
    tok = SentencePieceTokenizer(spm_bytes)
    cfg = TransformerConfig(
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
    model = Transformer(cfg).to(dev).train()
    optimizer, schedule = paper_optimizer(model.parameters(), cfg.d_model, recipe.warmup, recipe.lr_scale)
    stream = task.stream(seed, "train")
    monitor = task.pairs(200, seed, "heldout")  # progress only; the card reports a fresh draw
    loss_avg, extra = None, ""
    for step in range(1, recipe.steps + 1):
        src, src_valid, tgt, tgt_valid, labels = make_batch(list(itertools.islice(stream, recipe.batch_size)), tok, dev)
        logits = model(src, tgt, src_valid, tgt_valid).logits
        value = optimise(optimizer, schedule, logits, labels, recipe.label_smoothing)
        loss_avg = running_mean(loss_avg, value, step, keep=0.98)
        if step % 500 == 0 or step == recipe.steps:
            em, _ = exact_match(model, tok, monitor)
            extra = f", held-out exact match {em:.3f}"
        if step % 10 == 0 or step == recipe.steps:
            _progress(step, recipe.steps, loss_avg, schedule.get_last_lr()[0], start, extra)
    print(file=sys.stderr)
    train_minutes = (time.time() - start) / 60

    model.eval()
    em, misses = exact_match(model, tok, task.pairs(eval_n, eval_seed, "heldout"))
    n_params = sum(p.numel() for p in model.parameters())
    info = {
        "name": task.name,
        "task": task.name,
        "description": task.description,
        "examples": list(task.examples),
        "seed": seed,
        "recipe": dataclasses.asdict(recipe),
        "n_parameters": n_params,
        "train_minutes": round(train_minutes, 2),
        "hardware": f"{platform.machine()} {dev.type}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "metrics": {"exact_match": em, "n": eval_n, "seed": eval_seed, "final_loss": round(loss_avg, 4)},
    }
    overrides_cli = "".join(f" --{k.replace('_', '-')} {v}" for k, v in overrides.items() if v is not None)
    command = f"attnviz train {task.name} --out {Path(out_dir).as_posix()} --seed {seed}{overrides_cli}"
    out = Path(out_dir)
    save_checkpoint(model, out, spm_bytes, info, card="")
    info["weights_bytes"] = (out / WEIGHTS_FILE).stat().st_size
    (out / "README.md").write_text(_card(task, recipe, cfg, {**info, "misses": misses}, command))
    print(f"exact_match={em:.4f} on {eval_n} held-out pairs; wrote {out}", file=sys.stderr)
    return info
