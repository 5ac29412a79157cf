"""Small random language models built with transformers, saved as Hugging Face folders: the references
for the GPT-2, Llama and Qwen2 importers.

Every parameter is perturbed after initialisation (norms away from 1, biases away from 0), so that a
weight mapped to the wrong place, or a norm or bias left out, changes the output and cannot pass.
The tokenizer is a byte-level BPE trained here with the ``tokenizers`` library; the Llama one adds a
BOS, as Llama-family post-processors do.
"""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "the cat sat on the mat",
    "one two three four five six",
    "a b c d e f g h",
    "When Mary and John went to the store, John gave a drink to Mary.",
]
BOS, EOS = "<s>", "<|endoftext|>"


def write_tokenizer(folder: Path, bos: bool, vocab_size: int = 300) -> None:
    """A byte-level BPE tokenizer.json (GPT-2's scheme) in ``folder``; ids 0 and 1 are the end and start tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS, BOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 1)])
    tok.save(str(folder / "tokenizer.json"))


def perturb(model: torch.nn.Module, scale: float = 0.05, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def build(family: str, folder: Path, seed: int = 0, max_shard_size: str | None = None, **overrides):
    """A random ``family`` (gpt2, llama, qwen2) model saved in ``folder`` with its tokenizer; the model, eager."""
    import transformers as tf

    torch.manual_seed(seed)
    if family == "gpt2":
        config = tf.GPT2Config(
            vocab_size=320, n_positions=96, n_embd=48, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
        )
        cls = tf.GPT2LMHeadModel
    elif family == "llama":  # grouped-query attention, an untied head, a BOS
        config = tf.LlamaConfig(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=0,
            rope_theta=500.0,
            rms_norm_eps=1e-5,
        )
        cls = tf.LlamaForCausalLM
    elif family == "qwen2":  # biases on Q, K and V, a tied head
        config = tf.Qwen2Config(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=0,
        )
        cls = tf.Qwen2ForCausalLM
    else:
        raise ValueError(family)
    for key, value in overrides.items():
        setattr(config, key, value)
    config._attn_implementation = "eager"  # transformers 5 returns no maps from its fused kernels
    model = cls(config).eval()
    perturb(model, seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    write_tokenizer(folder, bos=family == "llama")
    return model
