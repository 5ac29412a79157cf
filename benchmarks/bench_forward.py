"""How long one forward pass takes with all attention maps, without them, and in transformers.

Run it from the repository root:

```bash
python benchmarks/bench_forward.py                 # CPU, S=T=64 and 256, median of 15
python benchmarks/bench_forward.py --threads 1 --repeats 30 --lengths 32 128 512
python benchmarks/bench_forward.py --lm            # language models: GPT-2 small and a GQA Llama
```

With ``--lm`` it measures decoder-only language models instead (random weights of two real shapes:
GPT-2 small, 12 layers x 12 heads, d 768; and SmolLM2-135M's Llama layout, 30 layers, 9 query and
3 key/value heads, d 576), at ``--lm-lengths`` tokens (default 128 and 1024), side by side:

```text
(1) attnviz with every map, (2) attnviz fused, no maps, (3) transformers' AutoModelForCausalLM
    with eager attention and output_attentions=True (its only way to return maps);
    targets: (1)/(2) - 1 <= 10% and (1)/(3) <= 1.0 (at least transformers' speed);
(1n) (1) with ATTNVIZ_MAP_POOL_MB=0: every map written into new memory, as the first pass of a
    process, or one whose caller still holds its earlier maps, writes them (attnviz.buffers);
    (1) runs as a loop over texts does, in the memory of the maps it dropped;
greedy generation of 128 tokens after a 128-token prompt, with the key/value cache against
    recomputing the whole prefix at every step (each step's logits for the last position only):
    target >= 3x;
the peak memory one forward with every map adds at the longest length (Linux's VmHWM, reset
    before the pass), beside the size of the maps themselves (L x H x T x T float32).
```

bfloat16 is not timed: on a CPU without native bf16 (AVX2 only, as some of these machines are) its
products are emulated and slower than fp32; the line says which this CPU is.

What it measures, on the paper's base model (N=6, d_model=512, h=8, d_ff=2048; one vocabulary of
8000 tokens shared by source and target; random weights, eval mode, torch.no_grad, batch 1) and
for each length S = T:

```text
(1) attnviz with every attention map (return_attention=True: the explicit softmax path);
(2) attnviz without maps (the fused F.scaled_dot_product_attention kernel);
(3) Hugging Face MarianMTModel of the same size (relu, eager attention) called with
    output_attentions=True, when transformers is installed (pip install transformers);
(1b) attnviz with every map but no output projection (return_logits=False: what
    attnviz.attention and the app run), against
(3b) the same MarianMTModel's encoder-decoder alone (model.model, no LM head), like for like;
(1a) (1) again with oneDNN switched off (attnviz.linear.use_onednn(False)): every linear
    layer through F.linear, the same kernel transformers uses. (1)/(3) measures what a user
    gets; (1a)/(3) separates what the model code does from what the faster kernel does.
```

All three get the same token ids and the same all-real padding masks; the target starts with the
start token, which is also Marian's ``decoder_start_token_id``. Each time is the median over
``--repeats`` runs after warm-up. Within one repeat the variants run one after the other, so
drifting background load slows them alike; each ratio is therefore the median of the ratios
within a repeat, not a ratio of medians. Two targets are checked:

```text
capture overhead  (1)/(2) - 1 <= 5%
versus transformers  (1)/(3) <= 0.9, i.e. returning every map is at least 10% faster.
```
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from attnviz import buffers
from attnviz.devices import fast_bfloat16, resolve_device
from attnviz.errors import DeviceError
from attnviz.linear import onednn_enabled, use_onednn
from attnviz.model import Transformer, TransformerConfig

VOCAB_SIZE = 8000
MAX_OVERHEAD = 0.05  # target for (1)/(2) - 1
MAX_RATIO_VS_HF = 0.9  # target for (1)/(3)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time attnviz's forward pass with and without attention maps, and against transformers."
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256], help="S = T lengths (default: 64 256)")
    parser.add_argument("--repeats", type=int, default=15, help="timed runs per variant (default: 15)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs per variant first (default: 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu", help="default: cpu")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and token ids")
    parser.add_argument("--lm", action="store_true", help="time decoder-only language models (GPT-2, Llama)")
    parser.add_argument(
        "--lm-lengths", type=int, nargs="+", default=[128, 1024], help="prompt lengths with --lm (default: 128 1024)"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be at least 1 and --warmup at least 0")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if any(not 2 <= n <= TransformerConfig.max_len for n in args.lengths):
        parser.error(f"--lengths must lie in [2, {TransformerConfig.max_len}]")
    try:
        args.device = resolve_device(args.device)
    except DeviceError as err:
        parser.error(str(err))
    return args


def cpu_model() -> str:
    """The CPU's name from /proc/cpuinfo, or what the platform module knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def build_marian(cfg: TransformerConfig, device: torch.device) -> nn.Module | None:
    """A random MarianMTModel the size of ``cfg`` with eager attention; None without transformers."""
    try:
        import transformers
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    hf_cfg = MarianConfig(
        vocab_size=cfg.src_vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_enc_layers,
        decoder_layers=cfg.n_dec_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function=cfg.activation,
        max_position_embeddings=cfg.max_len,
        scale_embedding=cfg.scale_embedding,
        pad_token_id=cfg.pad_id,
        eos_token_id=cfg.eos_id,
        forced_eos_token_id=cfg.eos_id,
        decoder_start_token_id=cfg.bos_id,  # so one target tensor starts both decoders
        use_cache=False,  # a teacher-forced pass, like ours: no key/value cache to build
        attn_implementation="eager",  # the only implementation that returns attention maps
    )
    model = MarianMTModel(hf_cfg).to(device).eval()
    if model.config._attn_implementation != "eager":
        raise RuntimeError(f"MarianMTModel runs {model.config._attn_implementation!r} attention, not eager")
    return model


def hardware_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model() if device.type == "cpu" else device.type


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that a timer measures the kernels, not their launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":  # "auto" picks it on Apple silicon
        torch.mps.synchronize()


def time_ms(
    variants: dict[str, Callable[[], object]], repeats: int, warmup: int, device: torch.device
) -> dict[str, list[float]]:
    """Wall times in ms of each variant's timed runs; each repeat runs every variant once, in turn.

    The order rotates from one repeat to the next: a variant that always ran first, or always after
    transformers, would pay alone for whatever the one before it left behind (freed memory the
    allocator has handed back to the system, a cold cache).
    """
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for i in range(warmup + repeats):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            run = variants[name]
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            if i >= warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def relative_spread(ms: list[float]) -> float:
    """Interquartile range over median: how far apart runs were (a few % on a quiet machine)."""
    if len(ms) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(ms, n=4)
    return (q3 - q1) / statistics.median(ms)


def check_same_shapes(ours, hf) -> None:
    """Fail loudly unless both models return the same logits shape and 3 x 6 maps of equal shapes."""
    pairs = [(ours.logits, hf.logits)]
    for mine, theirs in [
        (ours.attention.encoder, hf.encoder_attentions),
        (ours.attention.decoder, hf.decoder_attentions),
        (ours.attention.cross, hf.cross_attentions),
    ]:
        if theirs is None or len(mine) != len(theirs):
            raise RuntimeError("transformers did not return one attention map per layer")
        pairs += zip(mine, theirs, strict=True)
    for mine, theirs in pairs:
        if mine.shape != theirs.shape:
            raise RuntimeError(f"shape mismatch with transformers: {tuple(mine.shape)} vs {tuple(theirs.shape)}")


def onednn_applies(device: torch.device) -> bool:
    """Whether attnviz's linear layers take oneDNN in this run (CPU only; see attnviz/linear.py)."""
    return device.type == "cpu" and onednn_enabled()


def maps_without_onednn(model: Transformer, *inputs: torch.Tensor) -> object:
    with use_onednn(False):
        return model(*inputs, return_attention=True)


def forward_variants(
    model: Transformer, marian: nn.Module | None, length: int, device: torch.device
) -> dict[str, Callable[[], object]]:
    """The forward passes to time at S = T = ``length``, all on the same ids and masks."""
    cfg = model.cfg
    src = torch.randint(4, cfg.src_vocab_size, (1, length), device=device)  # no special ids
    tgt = torch.randint(4, cfg.tgt_vocab_size, (1, length), device=device)
    tgt[:, 0] = cfg.bos_id
    src_valid = torch.ones_like(src, dtype=torch.bool)  # no padding, said explicitly to every model
    tgt_valid = torch.ones_like(tgt, dtype=torch.bool)
    variants: dict[str, Callable[[], object]] = {
        "maps": lambda: model(src, tgt, src_valid, tgt_valid, return_attention=True),
        "fused": lambda: model(src, tgt, src_valid, tgt_valid),
        "maps_only": lambda: model(src, tgt, src_valid, tgt_valid, return_attention=True, return_logits=False),
    }
    if onednn_applies(device):
        variants["maps_aten"] = lambda: maps_without_onednn(model, src, tgt, src_valid, tgt_valid)
    if marian is not None:
        if int(tgt[0, 0]) != marian.config.decoder_start_token_id:
            raise RuntimeError("Marian's decoder input must start with its decoder_start_token_id")
        hf_inputs = {
            "input_ids": src,
            "attention_mask": src_valid.long(),  # transformers' 1 = real token
            "decoder_input_ids": tgt,
            "decoder_attention_mask": tgt_valid.long(),
            "output_attentions": True,
            "use_cache": False,
        }
        variants["hf"] = lambda: marian(**hf_inputs)
        variants["hf_base"] = lambda: marian.model(**hf_inputs)  # no LM head
    return variants


def verdict(passed: bool) -> str:
    return "PASS" if passed else "MISS"


def repeat_ratios(times: dict[str, list[float]], a: str, b: str) -> list[float]:
    """a's time / b's time within each repeat.

    The two ran back to back, so load that drifts across repeats (on a shared machine) slows both
    alike and cancels in each ratio; a ratio of two medians would keep it.
    """
    return [x / y for x, y in zip(times[a], times[b], strict=True)]


def paired_ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """The median of `repeat_ratios`: how much slower a is than b."""
    return statistics.median(repeat_ratios(times, a, b))


def table_row(length: int, times: dict[str, list[float]]) -> str:
    ms = {name: statistics.median(t) for name, t in times.items()}
    overhead = paired_ratio(times, "maps", "fused") - 1
    row = f"{length:>5} {ms['maps']:>10.1f} {ms['fused']:>10.1f} "
    row += f"{ms['hf']:>13.1f}" if "hf" in ms else f"{'skipped':>13}"
    row += f"   {overhead:>+11.1%} {verdict(overhead <= MAX_OVERHEAD)}"
    if "hf" not in ms:
        return row + f"   {'n/a':>12}   {ms['maps_only']:>9.1f}"
    ratio = paired_ratio(times, "maps", "hf")
    row += f"   {ratio:>7.2f} {verdict(ratio <= MAX_RATIO_VS_HF)}"
    row += f"   {ms['maps_only']:>9.1f} {ms['hf_base']:>9.1f} {paired_ratio(times, 'maps_only', 'hf_base'):>10.2f}"
    if "maps_aten" in ms:
        row += f"   {ms['maps_aten']:>9.1f} {paired_ratio(times, 'maps_aten', 'hf'):>8.2f}"
    return row


# ---------------------------------------------------------------------------------------------
# Language models (--lm)

MAX_LM_OVERHEAD = 0.10  # (1)/(2) - 1 for a language model
MAX_LM_RATIO_VS_HF = 1.0  # (1)/(3): at least transformers' speed
MIN_CACHE_SPEEDUP = 3.0  # recomputation / cached generation
GENERATED = 128
PROMPT_TOKENS = 128  # the prompt generation starts from: a paragraph, read once (prefill) or at every step
LM_SHAPES = {
    "gpt2-small": (
        "gpt2",
        {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12},
    ),
    "llama-gqa (SmolLM2-135M)": (
        "llama",
        {
            "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 2048,
            "rope_theta": 100000.0, "tie_word_embeddings": True,
        },
    ),
}  # fmt: skip


def build_lm(family: str, config: dict, device: torch.device):
    """(a random transformers model of this shape with eager attention, attnviz's model with its weights).

    attnviz's model is built by the importer's own config and conversion functions, from the
    transformers model's state dict: the same path a checkpoint folder takes, without the disk.
    """
    import transformers

    from attnviz.checkpoints import gpt2, llama

    transformers.logging.set_verbosity_error()
    if family == "gpt2":
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config, attn_implementation="eager"))
        importer = gpt2.GPT2
    else:
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config, attn_implementation="eager"))
        importer = llama.LLAMA
    hf = hf.to(device).eval()
    if hf.config._attn_implementation != "eager":
        raise RuntimeError(f"transformers runs {hf.config._attn_implementation!r} attention, not eager")
    cfg = importer.config(hf.config.to_dict(), "benchmark")
    raw = {importer.rename(k): v.detach() for k, v in hf.state_dict().items()}
    tensors = importer.convert(raw, cfg)
    ours = Transformer(cfg)
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(tensors[name])
    return hf, ours.to(device).eval()


def in_new_memory(run: Callable[[], object]) -> object:
    """``run()`` with the pool of map memory off (``ATTNVIZ_MAP_POOL_MB=0``, attnviz.buffers)."""
    before = os.environ.get("ATTNVIZ_MAP_POOL_MB")
    os.environ["ATTNVIZ_MAP_POOL_MB"] = "0"
    try:
        return run()
    finally:
        if before is None:
            del os.environ["ATTNVIZ_MAP_POOL_MB"]
        else:
            os.environ["ATTNVIZ_MAP_POOL_MB"] = before


def lm_variants(ours: Transformer, hf: nn.Module, length: int, device: torch.device) -> dict[str, Callable]:
    ids = torch.randint(4, ours.cfg.tgt_vocab_size, (1, length), device=device)
    return {
        "maps": lambda: ours(None, ids, return_attention=True),
        "maps_new": lambda: in_new_memory(lambda: ours(None, ids, return_attention=True)),
        "fused": lambda: ours(None, ids),
        "hf": lambda: hf(ids, output_attentions=True, use_cache=False),
    }


def recomputed_greedy(model: Transformer, prompt: torch.Tensor, n: int) -> list[int]:
    """Greedy decoding without a cache: the whole prefix through the model at every step."""
    from attnviz.hooks import Recorder

    ids = prompt
    for _ in range(n):
        with Recorder({"decoder_out"}) as rec:
            model(None, ids, return_logits=False)
        token = model.logits(rec.tensors["decoder_out"][:, -1:]).argmax(-1)  # (1, 1)
        ids = torch.cat([ids, token], dim=1)
    return ids[0, prompt.shape[1] :].tolist()


def generation_times(model: Transformer, device: torch.device, repeats: int) -> tuple[float, float, bool]:
    """(cached ms, recomputed ms, same tokens) for 128 greedy tokens after a 128-token prompt, median of ``repeats``."""
    from attnviz.decoding import greedy_decode

    prompt = torch.randint(4, model.cfg.tgt_vocab_size, (1, PROMPT_TOKENS), device=device)
    eos = model.cfg.eos_id
    prompt[prompt == eos] = eos + 1  # so that greedy decoding cannot stop at once on a prompt token
    times = time_ms(
        {
            "cached": lambda: greedy_decode(model, prompt, max_len=GENERATED),
            "recomputed": lambda: recomputed_greedy(model, prompt, GENERATED),
        },
        repeats,
        0,
        device,
    )
    cached = greedy_decode(model, prompt, max_len=GENERATED)[0]
    same = recomputed_greedy(model, prompt, len(cached)) == cached
    return statistics.median(times["cached"]), statistics.median(times["recomputed"]), same


def peak_rss_added_mb(run: Callable[[], object]) -> float | None:
    """How far one call raises this process's peak resident memory (Linux VmHWM, reset first), in MB."""

    def hwm_kb() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

    def rss_kb() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        before = rss_kb()
        run()
        return (hwm_kb() - before) / 1024
    except (OSError, StopIteration):
        return None


def bf16_line(device: torch.device) -> str:
    """Whether this hardware runs bfloat16 natively, and what the benchmark does about it."""
    fast, why = fast_bfloat16(device)
    if fast:
        return f"bf16: native here ({why}); fp32 is what is timed, as the targets are"
    return (
        f"bf16: skipped, no native bfloat16 here ({why}): its products would be emulated, slower than fp32 "
        "(5x for a linear layer on an AVX2-only EPYC), so a bf16 column would measure the emulation"
    )


def main_lm(args) -> None:
    device = args.device
    torch.manual_seed(args.seed)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__} | device {device} "
          f"({hardware_name(device)}) | {torch.get_num_threads()} threads")  # fmt: skip
    print(f"median of {args.repeats} runs after {args.warmup} warm-up runs; ms per forward pass; batch 1, fp32")
    print(bf16_line(device) + "\n")
    print(f"{'model':<26} {'T':>5} {'(1) maps':>10} {'(2) fused':>10} {'(3) HF eager':>13}   "
          f"{'(1)/(2)-1':>16}   {'(1)/(3)':>12}   {'(1n) new memory':>16} {'(1n)/(2)-1':>11}")  # fmt: skip
    results = []
    for name, (family, config) in LM_SHAPES.items():
        results += measure_lm(name, family, config, args)
    print(
        f"\ntargets: (1)/(2)-1 <= {MAX_LM_OVERHEAD:.0%}; (1)/(3) <= {MAX_LM_RATIO_VS_HF} vs transformers eager; "
        f"cached generation >= {MIN_CACHE_SPEEDUP:.0f}x recomputation"
    )
    forward = [r for r in results if r[0] is not None]
    print(
        f"lm_overhead_max={max(o for o, _ in forward):.3f} lm_ratio_vs_hf_max={max(r for _, r in forward):.2f} "
        f"cache_speedup_min={min(r for o, r in results if o is None):.1f}"
    )


def measure_lm(name: str, family: str, config: dict, args) -> list[tuple[float | None, float]]:
    """Print one shape's rows: the forward at each length, generation, peak memory. Returns
    (overhead, ratio vs transformers) per length, then (None, cache speed-up)."""
    device = args.device
    hf, ours = build_lm(family, config, device)
    results = []
    for length in args.lm_lengths:
        variants = lm_variants(ours, hf, length, device)
        with torch.no_grad():
            check_lm_maps(variants["maps"](), variants["hf"]())
            times = time_ms(variants, args.repeats, args.warmup, device)
        ms = {k: statistics.median(v) for k, v in times.items()}
        overhead, ratio = paired_ratio(times, "maps", "fused") - 1, paired_ratio(times, "maps", "hf")
        results.append((overhead, ratio))
        print(
            f"{name:<26} {length:>5} {ms['maps']:>10.1f} {ms['fused']:>10.1f} {ms['hf']:>13.1f}   "
            f"{overhead:>+10.1%} {verdict(overhead <= MAX_LM_OVERHEAD)}   "
            f"{ratio:>7.2f} {verdict(ratio <= MAX_LM_RATIO_VS_HF)}   "
            f"{ms['maps_new']:>16.1f} {paired_ratio(times, 'maps_new', 'fused') - 1:>+11.1%}"
        )
    with torch.no_grad():
        cached, recomputed, same = generation_times(ours, device, max(1, args.repeats // 5))
        longest = max(args.lm_lengths)
        ids = torch.randint(4, ours.cfg.tgt_vocab_size, (1, longest), device=device)
        buffers.release()  # the peak of a pass into new memory, not of one into memory kept from the last
        peak = peak_rss_added_mb(lambda: ours(None, ids, return_attention=True))
        peak_hf = peak_rss_added_mb(lambda: hf(ids, output_attentions=True, use_cache=False))
    speedup = recomputed / cached
    print(
        f"{name:<26} {PROMPT_TOKENS} + {GENERATED} generated: cached {cached / 1e3:.2f} s, "
        f"recomputed {recomputed / 1e3:.2f} s, {speedup:.1f}x {verdict(speedup >= MIN_CACHE_SPEEDUP)}"
        + ("" if same else " (WARNING: the two gave different tokens)")
    )
    if peak is not None and device.type == "cpu":
        n_maps = ours.cfg.n_dec_layers * ours.cfg.n_heads * longest**2
        fill = statistics.median(time_ms({"fill": lambda: torch.empty(n_maps).fill_(0.0)}, 3, 1, device)["fill"])
        print(
            f"{name:<26} T={longest}: one forward with every map adds {peak:,.0f} MB at peak "
            f"(transformers: {peak_hf:,.0f} MB); the maps themselves are {n_maps * 4 / 2**20:,.0f} MB, and "
            f"writing that much fresh memory once takes {fill:,.0f} ms here: the floor of (1n)'s capture overhead"
        )
    return [*results, (None, speedup)]


def check_lm_maps(ours, hf) -> None:
    """Fail loudly unless both return one map per layer of the same shape, equal to 1e-4."""
    if not hf.attentions or len(hf.attentions) != len(ours.attention.decoder):
        raise RuntimeError("transformers did not return one attention map per layer")
    for mine, theirs in zip(ours.attention.decoder, hf.attentions, strict=True):
        if mine.shape != theirs.shape or float((mine - theirs).abs().max()) > 1e-4:
            raise RuntimeError("attnviz's maps differ from transformers': the two models are not the same")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.lm:
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        main_lm(args)
        return
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = args.device
    torch.manual_seed(args.seed)

    cfg = TransformerConfig(src_vocab_size=VOCAB_SIZE, tgt_vocab_size=VOCAB_SIZE)  # base model otherwise
    model = Transformer(cfg).to(device).eval()
    marian = build_marian(cfg, device)

    print(
        f"Paper base model: N={cfg.n_enc_layers}+{cfg.n_dec_layers}, d_model={cfg.d_model}, h={cfg.n_heads}, "
        f"d_ff={cfg.d_ff}, shared vocab {VOCAB_SIZE}; random weights, eval, torch.no_grad, batch 1"
    )
    versions = f"torch {torch.__version__}"
    if marian is not None:
        import transformers

        versions += f", transformers {transformers.__version__}"
    print(f"{versions} | device {device} ({hardware_name(device)}) | {torch.get_num_threads()} threads")
    print(
        f"median of {args.repeats} runs after {args.warmup} warm-up runs; ms per forward pass; "
        "ratios: median of the per-repeat ratios\n"
    )

    print(
        f"{'S=T':>5} {'(1) maps':>10} {'(2) fused':>10} {'(3) HF eager':>13}   {'(1)/(2)-1':>17}   {'(1)/(3)':>12}"
        f"   {'(1b) maps':>9} {'(3b) HF':>9} {'(1b)/(3b)':>10}   {'(1a) maps':>9} {'(1a)/(3)':>8}"
    )
    spread = 0.0
    for length in args.lengths:
        variants = forward_variants(model, marian, length, device)
        with torch.no_grad():
            if marian is not None:
                check_same_shapes(variants["maps"](), variants["hf"]())
            times = time_ms(variants, args.repeats, args.warmup, device)
        checked = [("maps", "fused")] + ([("maps", "hf")] if "hf" in times else [])
        spread = max(spread, *(relative_spread(repeat_ratios(times, a, b)) for a, b in checked))
        print(table_row(length, times))

    print(f"\ntargets: capture overhead (1)/(2)-1 <= {MAX_OVERHEAD:.0%}; (1)/(3) <= {MAX_RATIO_VS_HF} vs transformers")
    print("(1b), (3b): every map without the output projection over the vocabulary, ours and transformers'")
    if onednn_applies(device):
        print("(1a): (1) with oneDNN off, every linear layer through F.linear as in transformers")
    else:
        print("oneDNN does not apply here (off, unavailable or not a CPU): (1) runs F.linear, no (1a) column")
    print(
        f"largest spread of a checked ratio across repeats (interquartile range / median): {spread:.1%}; "
        "a verdict within that distance of its target is noise"
    )
    if marian is None:
        print(
            "(3) skipped: transformers is not installed. Install it with `pip install transformers` "
            f'(add "torch=={torch.__version__.split("+")[0]}" to keep this torch).'
        )


if __name__ == "__main__":
    main()
