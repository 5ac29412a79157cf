"""The recipes of attnviz's own models: how each shipped model is trained (section 5 of the paper, at a small size).

`attnviz.training.loop.train` trains by them; every field can be overridden from the CLI or the API.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    # A language model's (attnviz.training.lm); the translation models ignore them: sinusoids, 512 positions.
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
