"""How long the methods beyond the weights take, beside a forward pass with every map, in one run.

Run it from the repository root:

```bash
python benchmarks/bench_methods.py                  # en-de and a base-size model, S = 32, 20 sentences
python benchmarks/bench_methods.py --threads 2 --repeats 20
```

For each model (the shipped ``en-de``, then, as a harder second line, a random model of the paper's
base shape as in ``bench_forward.py``: N=6, d_model=512, h=8, d_ff=2048, vocabulary 8000), one
sentence of ``--length`` source tokens and its decoder input, eval mode, batch 1:

```text
(a) a forward pass with every map, as attnviz.attention runs it (no vocabulary projection);
(b) norm-based attention (records values and weights in one such pass, then W_O per head);
(c) value zeroing of every layer and every kind (one batched pass per layer and kind);
(d) rollout through encoder and decoder, and (e) gradient-weighted attention (one backward pass);
(f) head importance: every head switched off alone, over --sentences sentences.
```

(a) to (e) run in turn within each repeat, in an order that rotates between repeats, and (b)/(a)
is the median of the per-repeat ratios (``bench_forward.time_ms`` and ``paired_ratio``), so that
load drifting on a shared machine cancels; (f) is timed ``--importance-repeats`` times. Targets:

```text
norm-based  (b)/(a) <= 1.3;  value zeroing  (c) <= 1 s;  head importance  (f) <= 30 s.
```
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_forward import cpu_model, paired_ratio, time_ms  # noqa: E402

import attnviz  # noqa: E402
from attnviz.methods import METHODS  # noqa: E402
from attnviz.methods.importance import head_importance  # noqa: E402
from attnviz.model import Transformer, TransformerConfig  # noqa: E402
from attnviz.training.data import get_task  # noqa: E402

MAX_NORM_RATIO = 1.3
MAX_VALUE_ZEROING_S = 1.0
MAX_IMPORTANCE_S = 30.0
SHAPES = {
    "base": dict(n_enc_layers=6, n_dec_layers=6, d_model=512, n_heads=8, d_ff=2048),  # the paper's base model
    "tiny": dict(n_enc_layers=2, n_dec_layers=2, d_model=32, n_heads=4, d_ff=64),  # for the test of this script
}
VOCAB_SIZE = 8000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time the methods beyond the weights beside a forward with maps.")
    parser.add_argument("--length", type=int, default=32, help="source tokens of the timed sentence (default: 32)")
    parser.add_argument("--sentences", type=int, default=20, help="sentences for head importance (default: 20)")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs of (a)-(e) (default: 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first (default: 2)")
    parser.add_argument("--importance-repeats", type=int, default=1, help="timed runs of (f) (default: 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    parser.add_argument("--second", choices=sorted(SHAPES), default="base", help="the second model's shape")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.length < 2 or args.sentences < 1 or args.repeats < 1 or args.warmup < 0 or args.importance_repeats < 1:
        parser.error("--length >= 2, --sentences >= 1, --repeats >= 1, --warmup >= 0, --importance-repeats >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def en_de_inputs(length: int, n_sentences: int, seed: int):
    """The shipped en-de model; ``length`` source and decoder input tokens of held-out text; sentence pairs.

    The model's sentences are short (a date is about 12 tokens), so the timed pair is held-out
    sources, and their references as the decoder input (teacher forcing), one after another, cut at
    ``length`` tokens: value zeroing's cost grows with both lengths.
    """
    bundle = attnviz.load("en-de", device="cpu")
    tok = bundle.tokenizer
    pairs = get_task("en-de").pairs(max(n_sentences, 64), seed, "heldout")
    src_ids: list[int] = []
    tgt_ids: list[int] = []
    for source, reference in pairs:
        src_ids += tok.encode_source(source).ids[:-1]
        tgt_ids += tok.encode_target(reference)[1].ids[:-1]
        if min(len(src_ids), len(tgt_ids)) >= length:
            break
    src = torch.tensor([[*src_ids[: length - 1], tok.eos_id]])
    tgt = torch.tensor([[tok.bos_id, *tgt_ids[: length - 1]]])
    sentences = [(tok.encode_source(s).ids, tok.encode_target(r)[1].ids) for s, r in pairs[:n_sentences]]
    return bundle.model, src, tgt, sentences, "en-de (shipped)"


def random_inputs(shape: str, length: int, n_sentences: int, seed: int):
    """A random model of ``shape``, random ids of ``length`` tokens on both sides, random sentence pairs."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(src_vocab_size=VOCAB_SIZE, tgt_vocab_size=VOCAB_SIZE, dropout=0.0, **SHAPES[shape])
    model = Transformer(cfg).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB_SIZE, (1, length), generator=g)
    src[0, -1] = cfg.eos_id
    tgt = torch.randint(4, VOCAB_SIZE, (1, length), generator=g)
    tgt[0, 0] = cfg.bos_id
    sentences = []
    for i in range(n_sentences):  # lengths spread around `length`, as real sentences are
        n = max(2, length // 2 + (i * 7) % length)
        s = torch.randint(4, VOCAB_SIZE, (n,), generator=g).tolist()
        r = torch.randint(4, VOCAB_SIZE, (n,), generator=g).tolist()
        sentences.append(([*s[:-1], cfg.eos_id], [*r[:-1], cfg.eos_id]))
    name = "paper's base shape" if shape == "base" else f"{shape} shape"
    return model, src, tgt, sentences, f"random model of the {name}"


def verdict(passed: bool) -> str:
    return "PASS" if passed else "MISS"


def bench_model(model, src, tgt, sentences, name: str, args) -> None:
    cfg = model.cfg
    n_heads = (cfg.n_enc_layers + 2 * cfg.n_dec_layers) * cfg.n_heads
    print(
        f"\n{name}: {cfg.n_enc_layers}+{cfg.n_dec_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads; "
        f"source {src.shape[1]} tokens, decoder input {tgt.shape[1]} tokens"
    )
    variants = {
        "forward": lambda: model(src, tgt, return_attention=True, return_logits=False),
        **{name: (lambda m=method: m.function(model, src, tgt)) for name, method in METHODS.items()},
    }
    with torch.no_grad():
        times = time_ms(
            {k: v for k, v in variants.items() if k != "grad-attention"}, args.repeats, args.warmup, src.device
        )
    times.update(time_ms({"grad-attention": variants["grad-attention"]}, args.repeats, args.warmup, src.device))
    ms = {k: statistics.median(v) for k, v in times.items()}
    ratio = paired_ratio(times, "norm", "forward")
    vz_s = ms["value-zeroing"] / 1e3
    print(f"  (a) forward with every map                 {ms['forward']:>9.1f} ms")
    print(
        f"  (b) norm-based attention                   {ms['norm']:>9.1f} ms   (b)/(a) = {ratio:.2f}   "
        f"target <= {MAX_NORM_RATIO}   {verdict(ratio <= MAX_NORM_RATIO)}"
    )
    print(
        f"  (c) value zeroing, every layer and kind    {ms['value-zeroing']:>9.1f} ms   "
        f"(c)/(a) = {ms['value-zeroing'] / ms['forward']:.1f}   target <= {MAX_VALUE_ZEROING_S:g} s   "
        f"{verdict(vz_s <= MAX_VALUE_ZEROING_S)}"
    )
    print(
        f"  (d) rollout, encoder and decoder           {ms['rollout']:>9.1f} ms   (d)/(a) = "
        f"{ms['rollout'] / ms['forward']:.2f}"
    )
    print(
        f"  (e) gradient-weighted attention            {ms['grad-attention']:>9.1f} ms   (e)/(a) = "
        f"{ms['grad-attention'] / ms['forward']:.2f}"
    )
    seconds = []
    for _ in range(args.importance_repeats):
        start = time.perf_counter()
        head_importance(model, sentences)
        seconds.append(time.perf_counter() - start)
    s = statistics.median(seconds)
    tokens = sum(len(out) for _, out in sentences)
    print(
        f"  (f) head importance, all {n_heads} heads, {len(sentences)} sentences ({tokens} target tokens)   "
        f"{s:>6.2f} s   target <= {MAX_IMPORTANCE_S:g} s   {verdict(s <= MAX_IMPORTANCE_S)}"
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    print(f"CPU: {cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads | load average {load}")
    runs = f"{args.importance_repeats} run{'s' if args.importance_repeats > 1 else ''}"
    print(
        f"median of {args.repeats} runs after {args.warmup} warm-up runs (head importance: {runs}); "
        "ratios: median of the per-repeat ratios"
    )
    bench_model(*en_de_inputs(args.length, args.sentences, args.seed), args)
    bench_model(*random_inputs(args.second, args.length, args.sentences, args.seed), args)
    print(
        f"\ntargets: norm-based <= {MAX_NORM_RATIO}x a forward with maps; value zeroing of every layer and kind "
        f"<= {MAX_VALUE_ZEROING_S:g} s; head importance of every head <= {MAX_IMPORTANCE_S:g} s. The en-de line is "
        "the one the targets are set for; the base-size line shows how they scale. On a machine whose cores are "
        "busy with other work, compare --threads 1 with the default: small products waiting for a busy peer "
        "thread can take many times longer."
    )


if __name__ == "__main__":
    main()
