"""attnviz's own language models (``attnviz train induction``, ``induction-long``): their batches, their
evaluation, their card, and reading their heads' roles.

The model is the paper's decoder with no encoder and no cross-attention: post-LN, ReLU, sinusoidal
positions (rotary ones for ``induction-long``, which takes 4,096 tokens), embeddings scaled and tied
to the output. It reads ``<s>`` and a text one token at a
time and predicts each next token. On the induction task (random letters, then the same letters
again) the second half can only be predicted by looking back: Olsson et al. (2022, "In-context
Learning and Induction Heads") show that a previous-token head in the first layer and an
induction head in the second form for it, with a sudden drop of the loss (a phase change). The
card records the loss curve, the held-out accuracy on the repeated half, and which heads do what;
a long-context model's card adds each head's scores on a text of 4,095 tokens, measured tile by tile.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch

from attnviz.atlas.roles import mean_repeat_scores
from attnviz.hooks import Recorder, act_name, attention_site
from attnviz.model import Transformer, TransformerConfig
from attnviz.tiles import HeadQK, scan, statistics_row
from attnviz.tokenizer import SentencePieceTokenizer, pad_batch, train_sentencepiece
from attnviz.training.data import (
    HELDOUT_SHARE,
    LONG_INDUCTION_LENGTHS,
    LONG_INDUCTION_LONGEST,
    REVERSE_ALPHABET,
    Task,
    long_probe,
    repeated_words,
)

CURVE_EVERY = 100  # steps between the points of the card's loss curve
PROBE_PERIOD = 10  # tokens (letters, words) per half of the probes that find the heads
PROBES = 200
PROBE_FILE = "probe.txt"  # a long-context model's long probe, shipped beside it: paste it into the explorer


def lm_batch(texts: list[str], tok: SentencePieceTokenizer, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, valid, labels): ``<s>`` and the text without its last token, and the text shifted by one
    (-100 on padding, which the loss ignores)."""
    ids = [tok.encode_source(t).ids for t in texts]
    x, valid = pad_batch([s[:-1] for s in ids], tok.pad_id, device)
    y, y_valid = pad_batch([s[1:] for s in ids], tok.pad_id, device)
    return x, valid, y.masked_fill(~y_valid, -100)


def text_batches(texts: Iterator[str], size: int, max_tokens: int = 0) -> Iterator[list[str]]:
    """Batches of ``size`` texts in stream order, cut short where the padded batch (texts x the longest
    one, in words) would pass ``max_tokens`` (0: never): a long text then starts the next batch, alone if it must."""
    batch, longest = [], 0
    for text in texts:
        n = len(text.split())
        if batch and max_tokens and (len(batch) + 1) * max(longest, n) > max_tokens:
            yield batch
            batch, longest = [], 0
        batch.append(text)
        longest = max(longest, n)
        if len(batch) == size:
            yield batch
            batch, longest = [], 0
    if batch:
        yield batch


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


def probe_texts(task: Task, seed: int) -> list[str]:
    """`PROBES` texts of `PROBE_PERIOD` random tokens of ``task``'s kind, each repeated once (drawn with ``seed``)."""
    if task.name == "induction-long":
        rng = random.Random(f"induction-long-probes/{seed}")
        return [repeated_words(rng, PROBE_PERIOD) for _ in range(PROBES)]
    rng = random.Random(f"induction-probes/{seed}")
    return [
        " ".join(letters + letters)
        for letters in (rng.choices(REVERSE_ALPHABET, k=PROBE_PERIOD) for _ in range(PROBES))
    ]


def head_roles(model: Transformer, tok: SentencePieceTokenizer, texts: list[str]) -> dict[str, np.ndarray]:
    """Each head's induction, previous-token and first-token scores (L, H), averaged over ``texts``, each
    `PROBE_PERIOD` tokens repeated once (`probe_texts`)."""
    with torch.no_grad():
        return mean_repeat_scores(model, [tok.encode_source(text).ids for text in texts], start=1, period=PROBE_PERIOD)


LONG_SCORES = ("previous", "induction", "bos")  # the statistics a long-context card states, per head


@torch.no_grad()
def long_text_scores(model: Transformer, tok: SentencePieceTokenizer, text: str) -> dict[str, np.ndarray]:
    """Each head's mean weight on the previous token, on the token after the current token's latest earlier
    occurrence (induction) and on `<s>` over every query of ``text``: {name: (L, H)}.

    Computed tile by tile from the queries and keys (`attnviz.tiles`), as the explorer's long view
    does: no whole map is held, so a text of thousands of tokens costs a few MB.
    """
    enc = tok.encode_source(text)
    L = model.cfg.n_dec_layers
    names = {part: [act_name(attention_site("decoder", layer), part) for layer in range(L)] for part in ("q", "k")}
    with Recorder({*names["q"], *names["k"]}) as rec:
        model(None, torch.tensor([enc.ids], device=model.device), return_logits=False)
    out = {name: np.zeros((L, model.cfg.n_heads)) for name in LONG_SCORES}
    for layer in range(L):
        q = rec.tensors[names["q"][layer]][0].float().cpu().numpy()  # (H, T, D), rotated
        k = rec.tensors[names["k"][layer]][0].float().cpu().numpy()
        for head in range(model.cfg.n_heads):
            scanned = scan(HeadQK(q[head], k[head], causal=True), "decoder", tokens=enc.tokens)
            row = statistics_row(scanned)
            for name in LONG_SCORES:
                out[name][layer, head] = row[name]
    return out


def named_heads(roles: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
    """The previous-token head (the first layer's best) and the induction head (the last layer's best),
    as (layer, head) counted from 1."""
    first = int(np.argmax(roles["previous"][0]))
    last = int(np.argmax(roles["induction"][-1]))
    return {"previous-token": (1, first + 1), "induction": (roles["induction"].shape[0], last + 1)}


def config(tok: SentencePieceTokenizer, recipe) -> TransformerConfig:
    """The language model of ``recipe`` for ``tok``'s vocabulary: no encoder, no cross-attention."""
    return TransformerConfig(
        src_vocab_size=tok.src_vocab_size,
        tgt_vocab_size=tok.tgt_vocab_size,
        n_enc_layers=0,
        n_dec_layers=recipe.n_layers,
        d_model=recipe.d_model,
        n_heads=recipe.n_heads,
        d_ff=recipe.d_ff,
        dropout=recipe.dropout,
        pos_encoding=recipe.pos_encoding,
        rope_theta=recipe.rope_theta,
        max_len=recipe.max_len,
    )


def tokenizer(task: Task, recipe, seed: int) -> tuple[bytes, SentencePieceTokenizer]:
    """The task's sentencepiece model (bytes), trained on 2,000 generated texts, and the tokenizer it makes."""
    texts = [t for t, _ in task.pairs(2000, seed)]
    spm_bytes = train_sentencepiece(texts, task.vocab_size, task.spm_model_type, task.symbols)
    return spm_bytes, SentencePieceTokenizer(spm_bytes, max_tokens=recipe.max_len, decoder_only=True)


def step_texts(task: Task, recipe, seed: int) -> Iterator[list[str]]:
    """One batch of training texts per step, endlessly; the recipe's last ``long_steps`` steps on its long texts."""
    batches = text_batches((t for t, _ in task.stream(seed, "train")), recipe.batch_size, recipe.batch_tokens)
    if recipe.long_steps:
        long_texts = (t for t, _ in task.stream(seed, "train", long=True))
        long_batches = text_batches(long_texts, recipe.batch_size, recipe.batch_tokens)
    step = 0
    while True:
        step += 1
        yield next(long_batches if step > recipe.steps - recipe.long_steps else batches)


def forward(model: Transformer, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (B, T, V), labels (B, T)) of a batch of `lm_batch`."""
    x, valid, y = batch
    return model(None, x, None, valid).logits, y


def evaluate(model: Transformer, tok, task: Task, eval_n: int, eval_seed: int, curve: list) -> dict:
    """The card's evaluation: the repeated half's accuracy, each head's role, the named heads, the loss
    curve, and a long-context model's scores on its long probe."""
    accuracy = repeat_accuracy(model, tok, [t for t, _ in task.pairs(eval_n, eval_seed, "heldout")])
    roles = head_roles(model, tok, probe_texts(task, eval_seed))
    heads = named_heads(roles)
    info = {
        "metrics": {"repeat_accuracy": round(accuracy, 4), "n": eval_n, "seed": eval_seed},
        "heads": {role: f"layer {layer} head {head}" for role, (layer, head) in heads.items()},
        "loss_curve": [list(point) for point in curve],
    }
    if task.name == "induction-long":
        long_text = long_probe()
        scores = long_text_scores(model, tok, long_text)
        info["long_text"] = {
            "file": PROBE_FILE,
            "tokens": len(tok.encode_source(long_text).ids),
            "repeat_accuracy": round(repeat_accuracy(model, tok, [long_text]), 4),
            "heads": {name: np.round(value, 4).tolist() for name, value in scores.items()},
        }
    return {"info": info, "roles": roles, "heads": heads}


def card(
    task: Task,
    recipe,
    cfg: TransformerConfig,
    info: dict,
    roles: dict,
    heads: dict,
    command: str,
    formation: str = "",
) -> str:
    """The model card: task, recipe, command, held-out accuracy, the loss curve, the phase change, the heads' roles."""
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
    unit = "word" if "long_text" in info else "letter"
    if cfg.pos_encoding == "rotary":
        positions = f"rotary positions (RoPE, base {cfg.rope_theta:g}) in every head"
    else:
        positions = "interleaved sinusoidal positions"
    return f"""# attnviz model: {task.name}

**Task.** A language model: {task.description}, as in `{task.examples[0]}`. The first half
cannot be predicted; the second half can, by looking back.

**Heads.** The previous-token head is **layer {pl} head {ph}** (each {unit} looks at the one before
it), and the induction head is **layer {il} head {ih}** (in the repeated half, each {unit} looks at
the {unit} after its own earlier occurrence, and the model copies it), counted from 1. Open
`{task.examples[0]}` in the explorer to see both.
{long_text_section(cfg, info, heads)}
**Data.** Generated at training time by `attnviz.training.data` with fixed seeds; nothing is downloaded.
Texts are split by CRC-32: one in {HELDOUT_SHARE} is held out and never used for training.

**Model.** The paper's decoder with no encoder and no cross-attention (a language model):
post-LayerNorm, ReLU, {positions}, embeddings scaled by sqrt(d_model) and tied
to the output; N = {cfg.n_dec_layers} layers, d_model = {cfg.d_model}, h = {cfg.n_heads} heads,
d_ff = {cfg.d_ff}, one piece per {unit} ({cfg.tgt_vocab_size:,} pieces with the special ones),
at most {cfg.max_len:,} tokens;
{info["n_parameters"]:,} parameters, {info["weights_bytes"] / 1e6:.2f} MB of float32 weights.

**Training.** Next-token prediction on every position, Adam (beta1 0.9, beta2 0.98, eps 1e-9),
learning rate of equation 3 with warmup {recipe.warmup} steps (scale {recipe.lr_scale}), label
smoothing {recipe.label_smoothing}, dropout {recipe.dropout}, {recipe.steps} steps of
{recipe.batch_size} texts{batching(recipe)}, seed {info["seed"]}.
Trained in {info["train_minutes"]:.1f} minutes on {info["hardware"]}.

**Loss** (running mean, nats per token, every {CURVE_EVERY} steps; the drop is the phase change in which
the induction head forms): {curve}
{formation}
**Evaluation.** Next-token prediction from the true prefix (the top token at each position of one
teacher-forced pass) on {m["n"]} freshly generated held-out texts (seed {m["seed"]}):
accuracy on the repeated half, all but its first {unit}, **{m["repeat_accuracy"]:.4f}** (target
{recipe.target_exact_match}: {status}).

Reproduce:

```
{command}
```

**Every head** on {PROBES} probes of {PROBE_PERIOD} random {unit}s repeated (Olsson et al.'s repeated random tokens):
the mean weight on the previous token, on the token after the current token's earlier occurrence
(induction), and on the first token, `<s>` (bos).

| head | previous | induction | bos |
|---|---|---|---|
{rows}
"""


def batching(recipe) -> str:
    """How the card says a recipe's batches are cut and its last steps' texts drawn; empty for plain batches."""
    text = f" (at most {recipe.batch_tokens:,} tokens with padding)" if recipe.batch_tokens else ""
    if recipe.long_steps:
        first = recipe.steps - recipe.long_steps + 1
        words = LONG_INDUCTION_LONGEST
        text += (
            f"; from step {first:,} on, texts of {words[0]} to {words[1]:,} words repeated (up to {2 * words[1] + 1:,} "
            "tokens): the loss rises while the heads learn to reach that far, and falls again"
        )
    return text


def long_text_section(cfg: TransformerConfig, info: dict, heads: dict) -> str:
    """The card's paragraph on a long text: each head's scores on the shipped probe, as the long view measures them."""
    if "long_text" not in info:
        return ""
    long = info["long_text"]
    scores = {name: np.array(value) for name, value in long["heads"].items()}
    rows = "\n".join(
        f"| layer {layer + 1} head {head + 1} | "
        + " | ".join(f"{scores[name][layer, head]:.3f}" for name in LONG_SCORES)
        + " |"
        for layer in range(cfg.n_dec_layers)
        for head in range(cfg.n_heads)
    )
    (pl, ph), (il, ih) = heads["previous-token"], heads["induction"]
    half = (long["tokens"] - 1) // 2
    return f"""
**Long texts.** The model takes {cfg.max_len:,} tokens: its heads formed on texts of at most
{2 * LONG_INDUCTION_LENGTHS[1] + 1} tokens and learned to keep their roles on texts of up to
{2 * LONG_INDUCTION_LONGEST[1] + 1:,} (rotary positions make each score depend on the distance between
query and key, not on where they stand). Measured on `{long["file"]}` (shipped
in this folder: {half:,} distinct random words, then the same {half:,} again; {long["tokens"]:,} tokens with `<s>`),
with the explorer's long view (`attnviz.tiled_attention(...).statistics("decoder")`, computed tile
by tile from the queries and keys), each head's mean over every query of the weight on the
previous token, on the token after the current token's latest earlier occurrence (induction: the
repeated half's queries, whose target is {half - 1:,} tokens back) and on `<s>` (bos). Layer {pl} head {ph} and
layer {il} head {ih} are the card's heads. Next-token prediction from the true prefix (the top token at
each position of one teacher-forced pass) on the repeated half of this text,
all but its first word: **{long["repeat_accuracy"]:.4f}**.

| head | previous | induction | bos |
|---|---|---|---|
{rows}
"""
