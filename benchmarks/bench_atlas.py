"""How fast the head atlas runs, against a plain loop over transformers' MarianMTModel.

Run it from the repository root:

```bash
python benchmarks/bench_atlas.py                      # CPU, 128 sentences, 3 repeats
python benchmarks/bench_atlas.py --device cuda --sentences 2000
python benchmarks/bench_atlas.py --profile                 # also where the engine's time goes, by part
python benchmarks/bench_atlas.py --cluster                 # local engine vs Ray clusters of 1 and 2 nodes
```

What it measures, on one random Marian model of the paper's base size (6 + 6 layers, d_model 512,
8 heads, d_ff 2048, swish, one vocabulary of 8000 entries; built with transformers, saved as a
Hugging Face folder and read by attnviz's Marian importer: the same weights for every variant) and
one corpus of random sentences with given decoder inputs (a random model's greedy output means
nothing, and every variant must read the same decoder input):

```text
(plain) a loop over the sentences, batch 1: tokenise, MarianMTModel(..., output_attentions=True)
        with eager attention in float32, then every statistic of the atlas and the head-to-head
        Jensen-Shannon divergences computed from the returned maps with numpy, and the means per head;
(fp32)  attnviz.atlas.build_atlas into a fresh folder: tokenise, sort by length, padded batches,
        statistics on the device, Parquet shards and tables, the manifest;
(bf16)  the same with precision="bf16" (products in bfloat16, softmax in float32);
(fp32-1) where the engine runs several batches at once (`attnviz.atlas.engine.batches_at_once`:
        every CPU with two threads or more), the fp32 engine one batch at a time on every thread, as
        it ran before: what that gains.
```

The variants run in turn within each repeat, in an order that rotates, and each speed-up is the
median over repeats of (plain time / engine time) within a repeat, so that load drifting on a
shared machine cancels. The plain loop's numbers are checked against the engine's before timing
(they must agree to 1e-4: the same statistics, not a cheaper imitation). The last line is exactly
``atlas_speedup_fp32=<x> atlas_speedup_bf16=<y>``. Targets: fp32 >= 3, and bf16 >= 10 where the
hardware has fast bfloat16 (Intel AMX or AVX512-BF16 on a CPU; a CUDA GPU that supports it).
Elsewhere bf16 is not run (it would be emulated: past 10 minutes on an AVX2-only EPYC), the output
says why, and the last line reads ``atlas_speedup_bf16=nan``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_forward import cpu_model, hardware_name, synchronize  # noqa: E402

import attnviz  # noqa: E402
from attnviz.atlas import STATISTICS, build_atlas, engine  # noqa: E402
from attnviz.atlas.corpus import is_punctuation, special_ids  # noqa: E402
from attnviz.devices import fast_bfloat16, resolve_device  # noqa: E402
from attnviz.errors import DeviceError  # noqa: E402
from attnviz.tokenizer import train_sentencepiece  # noqa: E402

TARGET_FP32, TARGET_BF16 = 3.0, 10.0
# Plain loop vs engine, float32 both, the same weights: the kernels differ in summation order only.
AGREEMENT = 1e-4  # relative: a gap of at most 1e-4 x (1 + |value|), mean_distance counting tokens
MAX_ARGMAX_MOVED = 0.1  # argmax shares that may move on float32 ties (see check_agreement)
KINDS = ("encoder", "decoder", "cross")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Time the head atlas against a plain loop over transformers' Marian.")
    p.add_argument("--sentences", type=int, default=128, help="corpus size (default: 128)")
    p.add_argument("--min-words", type=int, default=3)
    p.add_argument("--max-words", type=int, default=30, help="sentence lengths are uniform in [min, max] words")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each variant (default: 3)")
    p.add_argument("--batch", type=int, default=32, help="the engines' --batch (default: 32)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu", help="default: cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=6, help="encoder and decoder layers (default: 6, base)")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--profile", action="store_true", help="also print where the engine's time goes (cProfile)")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="instead: sentences/s of the local engine and of Ray clusters of 1 and 2 nodes on this machine "
        "(benchmarks/atlas_cluster.py)",
    )
    p.add_argument("--cluster-lines", type=int, default=2000, help="--cluster: corpus lines (default: 2000)")
    p.add_argument("--cluster-model", default="reverse", help="--cluster: the model (default: reverse)")
    p.add_argument("--node-cpus", type=int, default=1, help="--cluster: CPUs of each Ray node (default: 1)")
    args = p.parse_args(argv)
    if args.cluster and (args.cluster_lines < 1 or args.node_cpus < 1):
        p.error("--cluster-lines and --node-cpus must be at least 1")
    if args.sentences < 1 or args.repeats < 1 or args.batch < 1 or not 1 <= args.min_words <= args.max_words:
        p.error("--sentences, --repeats and --batch must be at least 1, and 1 <= --min-words <= --max-words")
    try:
        args.device = resolve_device(args.device)
    except DeviceError as err:
        p.error(str(err))
    return args


# ---------------------------------------------------------------------------------------------
# The model and the corpus


def words(n: int, rng: np.random.Generator) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    return ["".join(rng.choice(letters, rng.integers(2, 9))) for _ in range(n)]


def sentence(vocab: list[str], n: int, rng: np.random.Generator) -> str:
    text = " ".join(rng.choice(vocab, n))
    return text + rng.choice([".", "!", "?", ","])  # some punctuation, as real text has


def build_marian(folder: Path, args: argparse.Namespace, training: list[str]) -> None:
    """A random MarianMTModel of the requested size saved as a Hugging Face folder attnviz can open."""
    import transformers
    from transformers import MarianConfig, MarianMTModel

    transformers.logging.set_verbosity_error()
    spm = train_sentencepiece(training, vocab_size=min(1000, args.vocab - 8))
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_proto=spm)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    pieces = [q for q in pieces if q not in ("<pad>", "<s>", "</s>", "<unk>")]
    names = ["</s>", "<unk>", *pieces]
    names += [f"<extra_{i}>" for i in range(args.vocab - 1 - len(names))] + ["<pad>"]  # the base-size vocabulary
    pad = len(names) - 1
    config = MarianConfig(
        vocab_size=len(names),
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn,
        decoder_ffn_dim=args.ffn,
        activation_function="swish",
        max_position_embeddings=512,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=None,
        init_std=0.05,  # attention far enough from uniform that the statistics differ between heads
        attn_implementation="eager",
    )
    torch.manual_seed(args.seed)
    MarianMTModel(config).eval().save_pretrained(folder)
    (folder / "source.spm").write_bytes(spm)
    (folder / "target.spm").write_bytes(spm)
    (folder / "vocab.json").write_text(json.dumps({name: i for i, name in enumerate(names)}))


def load_hf(folder: Path, device: torch.device):
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(folder, attn_implementation="eager").to(device).eval()
    if model.config._attn_implementation != "eager":
        raise RuntimeError("MarianMTModel must run eager attention to return its maps")
    return model


# ---------------------------------------------------------------------------------------------
# The plain loop: one sentence at a time, statistics with numpy from the returned maps


def aligned(kind: str, Q: int, K: int) -> np.ndarray:
    i = np.arange(Q)
    if kind != "cross":
        return i
    return np.zeros(Q, dtype=int) if Q == 1 else np.floor(i * (K - 1) / (Q - 1) + 0.5).astype(int)


def plain_statistics(maps: np.ndarray, kind: str, special: np.ndarray, punct: np.ndarray) -> np.ndarray:
    """(L, H, len(STATISTICS)) for one sentence's (L, H, Q, K) maps, numpy, as docs/atlas.md defines them."""
    p = maps.astype(np.float64)
    L, H, Q, K = p.shape
    i, d = np.arange(Q), aligned(kind, Q, K)
    out = np.full((L, H, len(STATISTICS)), np.nan)

    def mean(values, rows=None):
        rows = np.ones(Q, dtype=bool) if rows is None else rows
        return values[..., rows].mean(-1) if rows.any() else np.full((L, H), np.nan)

    logp = np.log(np.where(p > 0, p, 1.0))
    col = {name: n for n, name in enumerate(STATISTICS)}
    out[..., col["entropy"]] = mean(-(p * logp).sum(-1))
    if kind != "cross":
        out[..., col["mean_distance"]] = mean((p * np.abs(i[:, None] - np.arange(K))).sum(-1))
    out[..., col["diagonal"]] = mean(p[..., i, d])
    out[..., col["previous"]] = mean(p[..., i, np.maximum(d - 1, 0)], d >= 1)
    if kind != "decoder":
        out[..., col["next"]] = mean(p[..., i, np.minimum(d + 1, K - 1)], d + 1 < K)
        out[..., col["last"]] = mean(p[..., K - 1])
    out[..., col["first"]] = mean(p[..., 0])
    out[..., col["special"]] = mean(p[..., special].sum(-1))
    out[..., col["punctuation"]] = mean(p[..., punct].sum(-1))
    out[..., col["confidence"]] = mean(p.max(-1))
    top = p.argmax(-1)
    if kind != "cross":
        out[..., col["argmax_previous"]] = mean((top == i - 1).astype(float), i >= 1)
    if kind == "encoder":
        out[..., col["argmax_next"]] = mean((top == i + 1).astype(float), i + 1 < K)
    return out


def plain_divergences(maps: np.ndarray) -> np.ndarray:
    """(N, N) mean over rows of the Jensen-Shannon divergence between every two heads, numpy float32.

    Each unordered pair once (the matrix is symmetric), vectorised over pairs, rows and keys.
    """
    p = maps.reshape(-1, *maps.shape[2:])  # (N, Q, K) float32
    N = p.shape[0]

    def entropy(x):
        return -(x * np.log(np.where(x > 0, x, 1))).sum(-1, dtype=np.float64)

    own = entropy(p)  # (N, Q)
    a, b = np.triu_indices(N, 1)
    mixed = entropy((p[a] + p[b]) / 2)  # (pairs, Q)
    out = np.zeros((N, N))
    out[a, b] = out[b, a] = (mixed - (own[a] + own[b]) / 2).mean(-1)
    return out


def plain_loop(model, tokenizer, pairs: list[tuple[str, str]], device: torch.device) -> dict:
    """Every sentence's statistics and the per-kind divergence sums, one sentence at a time."""
    specials = special_ids(tokenizer)
    stats, sums = {k: [] for k in KINDS}, {}
    seconds = dict.fromkeys(("model", "statistics", "divergences"), 0.0)
    with torch.no_grad():
        for src_text, tgt_text in pairs:
            start = time.perf_counter()
            src = tokenizer.encode_source(src_text)
            tgt, _ = tokenizer.encode_target(tgt_text)
            out = model(
                input_ids=torch.tensor([src.ids], device=device),
                decoder_input_ids=torch.tensor([tgt.ids], device=device),
                output_attentions=True,
                use_cache=False,
            )
            sides = {
                "encoder": (out.encoder_attentions, src),
                "decoder": (out.decoder_attentions, tgt),
                "cross": (out.cross_attentions, src),
            }
            maps = {kind: torch.stack(layers)[:, 0].float().cpu().numpy() for kind, (layers, _) in sides.items()}
            seconds["model"] += time.perf_counter() - start
            for kind, (_, keys) in sides.items():
                start = time.perf_counter()
                special = np.array([i in specials for i in keys.ids])
                punct = np.array([is_punctuation(t) for t in keys.tokens])
                stats[kind].append(plain_statistics(maps[kind], kind, special, punct))
                middle = time.perf_counter()
                sums[kind] = sums.get(kind, 0) + plain_divergences(maps[kind])
                seconds["statistics"] += middle - start
                seconds["divergences"] += time.perf_counter() - middle
    stacked = {k: np.stack(v) for k, v in stats.items()}  # (sentences, L, H, statistics)
    with np.errstate(invalid="ignore"):  # a statistic a kind does not have is NaN in every sentence: 0 / 0
        means = {k: np.nansum(v, axis=0) / (~np.isnan(v)).sum(axis=0) for k, v in stacked.items()}
    return {"stats": stacked, "sums": sums, "means": means, "seconds": seconds}


# ---------------------------------------------------------------------------------------------
# A language model: the same comparison on a random Llama layout (grouped-query attention, RoPE)


def build_llama(folder: Path, args: argparse.Namespace, texts: list[str]):
    """A random LlamaForCausalLM of the benchmark's size (a quarter as many key/value heads), saved with a
    byte-level BPE tokenizer.json trained on ``texts``; the model, eager, on the benchmark's device."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # no bars for writing and loading the weights
    folder.mkdir(parents=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab, special_tokens=["<|end|>", "<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=args.d_model, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 4), max_position_embeddings=512, bos_token_id=1, eos_token_id=0,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(args.seed)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").to(args.device)


def plain_lm_loop(model, tokenizer, texts: list[str], device: torch.device) -> dict:
    """The plain loop for a language model: each text's decoder maps, statistics and divergences, one at a time."""
    specials = special_ids(tokenizer)
    stats, sums = [], 0
    seconds = dict.fromkeys(("model", "statistics", "divergences"), 0.0)
    with torch.no_grad():
        for text in texts:
            start = time.perf_counter()
            enc = tokenizer.encode_source(text)
            out = model(input_ids=torch.tensor([enc.ids], device=device), output_attentions=True, use_cache=False)
            maps = torch.stack(out.attentions)[:, 0].float().cpu().numpy()
            middle = time.perf_counter()
            special = np.array([i in specials for i in enc.ids])
            punct = np.array([is_punctuation(t) for t in enc.tokens])
            stats.append(plain_statistics(maps, "decoder", special, punct))
            after = time.perf_counter()
            sums = sums + plain_divergences(maps)
            seconds["model"] += middle - start
            seconds["statistics"] += after - middle
            seconds["divergences"] += time.perf_counter() - after
    return {"stats": {"decoder": np.stack(stats)}, "sums": {"decoder": sums}, "seconds": seconds}


def language_model_line(args: argparse.Namespace, texts: list[str], tmp: Path) -> float:
    """Build, check and time the atlas of a random Llama layout against the plain loop; print its line."""
    import attnviz

    folder = tmp / "llama-random"
    hf = build_llama(folder, args, texts)
    bundle = attnviz.load(str(folder), device=str(args.device))
    corpus = tmp / "lm-corpus.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    plain = plain_lm_loop(hf, bundle.tokenizer, texts, args.device)  # also the warm-up
    cfg = bundle.config
    worst, where, moved = check_agreement(
        plain, engine_run(bundle, corpus, None, args.batch, "fp32"), cfg.n_dec_layers, cfg.n_heads
    )
    if not (worst <= AGREEMENT and moved <= MAX_ARGMAX_MOVED):
        raise RuntimeError(f"the plain loop and the engine disagree on the language model: {worst:.1e} on {where}")
    times = {"plain": [], "engine": []}
    for repeat in range(args.repeats):
        order = ["plain", "engine"] if repeat % 2 == 0 else ["engine", "plain"]
        for name in order:
            synchronize(args.device)
            start = time.perf_counter()
            if name == "plain":
                plain_lm_loop(hf, bundle.tokenizer, texts, args.device)
            else:
                engine_run(bundle, corpus, None, args.batch, "fp32")
            synchronize(args.device)
            times[name].append(time.perf_counter() - start)
    speedup = statistics.median([p / e for p, e in zip(times["plain"], times["engine"], strict=True)])
    verdict = "PASS" if speedup >= TARGET_FP32 else "MISS"
    print(
        f"language model (random Llama layout: {cfg.n_dec_layers} layers, {cfg.n_heads} query and {cfg.kv_heads} "
        f"key/value heads, d_model {cfg.d_model}, RoPE), {len(texts)} texts, fp32: plain loop "
        f"{statistics.median(times['plain']):.2f} s, engine {statistics.median(times['engine']):.2f} s, "
        f"{speedup:.2f}x, target >= {TARGET_FP32:g}x: {verdict} (agreement {worst:.1e}, {where})"
    )
    return speedup


# ---------------------------------------------------------------------------------------------
# Timing


def engine_run(bundle, corpus: Path, targets: Path | None, batch: int, precision: str):
    with tempfile.TemporaryDirectory() as out:
        return build_atlas(bundle, corpus, Path(out) / "atlas", targets=targets, batch_size=batch, precision=precision)


@contextlib.contextmanager
def one_batch_at_a_time():
    """The local engine as it runs where `engine.batches_at_once` is 1: one batch at a time on every thread."""
    at_once = engine.batches_at_once
    engine.batches_at_once = lambda device: 1
    try:
        yield
    finally:
        engine.batches_at_once = at_once


def engine_one_at_a_time(bundle, corpus: Path, targets: Path | None, batch: int):
    with one_batch_at_a_time():
        return engine_run(bundle, corpus, targets, batch, "fp32")


def bf16_ceiling(bundle, pairs: list[tuple[str, str]], args: argparse.Namespace) -> tuple[float, float, float]:
    """What bf16 can give at most here: (fp32 s, bf16 s, fp32 / bf16) of the model's forward pass alone.

    The engine's own forward (`Transformer.attention_maps`: every map, on the real tokens) on the
    engine's own batches (same plan), once in float32 and once under its bf16 autocast, in turn
    within each repeat; the statistics, divergences and files, which bf16 does not speed up, are
    left out. Medians of ``args.repeats`` runs after one warm-up of each; the ratio is the median of
    the per-repeat ratios.
    """
    from attnviz.atlas.corpus import batch_plan, tokenize
    from attnviz.atlas.engine import precision_context
    from attnviz.tokenizer import pad_batch

    tok, device = bundle.tokenizer, bundle.device
    corpus = tokenize(tok, [s for s, _ in pairs], [t for _, t in pairs])
    inputs = []
    for batch in batch_plan(corpus.sentences, args.batch):
        src, src_valid = pad_batch([s.src_ids for s in batch], tok.pad_id, device)
        tgt, tgt_valid = pad_batch([s.tgt_ids for s in batch], tok.pad_id, device)
        inputs.append((src, tgt, src_valid, tgt_valid))

    @torch.no_grad()
    def forward(precision: str) -> None:
        with precision_context(precision, device):
            for src, tgt, src_valid, tgt_valid in inputs:
                bundle.model.attention_maps(src, tgt, src_valid, tgt_valid)

    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for repeat in range(args.repeats + 1):  # the first round warms up
        for name in ("fp32", "bf16") if repeat % 2 == 0 else ("bf16", "fp32"):
            synchronize(device)
            start = time.perf_counter()
            forward(name)
            synchronize(device)
            if repeat:
                times[name].append(time.perf_counter() - start)
    ratio = statistics.median([f / b for f, b in zip(times["fp32"], times["bf16"], strict=True)])
    return statistics.median(times["fp32"]), statistics.median(times["bf16"]), ratio


def profile_parts(bundle, corpus: Path, targets: Path | None, batch: int, precision: str) -> list[tuple[str, float]]:
    """Where one engine run's time goes, from cProfile: (part, seconds), the whole run last.

    Parts are the cumulative times of the engine's own functions (the model's top-level forward, its
    linear layers and attention, the statistics, the divergences and their logarithms); what is left
    is tokenising, batching, the key flags and the files. cProfile adds about 1% here (0.5 M calls).
    """
    import cProfile
    import pstats

    with one_batch_at_a_time():  # cProfile sees the main thread only
        engine_run(bundle, corpus, targets, batch, precision)  # warm
        profiler = cProfile.Profile()
        profiler.enable()
        engine_run(bundle, corpus, targets, batch, precision)
        profiler.disable()
    entries = pstats.Stats(profiler).stats  # {(file, line, name): (calls, primitive calls, own s, cumulative s, _)}

    def cumulative(file: str, name: str) -> float:
        """The largest cumulative time of functions ``name`` in files ending with ``file``."""
        return max((v[3] for (f, _, n), v in entries.items() if f.endswith(file) and n == name), default=0.0)

    whole = cumulative("bench_atlas.py", "engine_run")
    forward = cumulative("attnviz/model.py", "attention_maps")  # the engine's whole model pass
    statistics_s = cumulative("attnviz/atlas/stats.py", "sentence_statistics")
    divergences = cumulative("attnviz/atlas/stats.py", "js_divergences")
    return [
        ("model forward (every map, no logits)", forward),
        ("  linear layers", cumulative("attnviz/linear.py", "forward")),  # Linear.forward, fp32 and bf16
        ("  attention (scores, softmax, maps)", cumulative("attnviz/model.py", "attention")),
        ("statistics", statistics_s),
        ("divergences", divergences),
        ("  logarithms in them", cumulative("attnviz/atlas/stats.py", "_log")),
        ("tokenising, batching, flags, files", whole - forward - statistics_s - divergences),
        ("the whole run", whole),
    ]


def print_profile(bundle, corpus: Path, targets: Path | None, batch: int, precisions: list[str]) -> None:
    runs = {precision: profile_parts(bundle, corpus, targets, batch, precision) for precision in precisions}
    print(f"\nwhere the engine's time goes (one run each, cProfile, one batch at a time; --batch {batch}):")
    print(f"  {'part':<38}" + "".join(f"{p + ' s':>9} {'share':>6}" for p in precisions))
    for i, (label, _) in enumerate(runs[precisions[0]]):
        cells = "".join(f"{parts[i][1]:>9.3f} {parts[i][1] / parts[-1][1]:>6.0%}" for parts in runs.values())
        print(f"  {label:<38}{cells}")


def check_agreement(plain: dict, atlas, n_layers: int, n_heads: int) -> tuple[float, str, float]:
    """How far the plain loop is from the engine: (largest relative gap, where, share of argmax values moved).

    The argmax shares count rows; where two keys' weights tie to float32 rounding (repeated tokens
    in a random model's input), a different summation order can move a row's largest weight, and
    the share jumps by 1 / rows. They are compared by how many values moved, the rest by their gap.
    """
    worst, where, moved, counted = 0.0, "", 0, 0
    argmax = [i for i, name in enumerate(STATISTICS) if name.startswith("argmax")]
    for kind in (k for k in KINDS if k in plain["stats"]):  # a language model has the decoder's alone
        rows = atlas.sentences[atlas.sentences["kind"] == kind].sort_values(["line", "layer", "head"])
        ours = rows[list(STATISTICS)].to_numpy(dtype=np.float64).reshape(-1, n_layers, n_heads, len(STATISTICS))
        theirs = plain["stats"][kind]
        if not np.array_equal(np.isnan(ours), np.isnan(theirs)):
            raise RuntimeError(f"{kind}: the plain loop and the engine disagree on which statistics exist")
        gap = np.abs(ours - theirs)
        moved += int((gap[..., argmax] > 1e-6).sum())
        counted += int((~np.isnan(gap[..., argmax])).sum())
        gap = gap / (1 + np.abs(theirs))
        gap[..., argmax] = 0
        with warnings.catch_warnings():  # a statistic a kind does not have is NaN in every sentence
            warnings.simplefilter("ignore", RuntimeWarning)
            gaps = np.nanmax(gap, axis=(0, 1, 2))
        for name, value in zip(STATISTICS, gaps, strict=True):
            if value > worst:
                worst, where = float(value), f"{kind} {name}"
        table = atlas.distances[atlas.distances["kind"] == kind]
        divergence = table.sort_values(["layer_a", "head_a", "layer_b", "head_b"])["js_divergence"].to_numpy()
        mean = plain["sums"][kind] / theirs.shape[0]
        value = float(np.abs(divergence.reshape(mean.shape) - mean).max())
        if value > worst:
            worst, where = value, f"{kind} divergences"
    return worst, where, moved / max(counted, 1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cluster:
        from atlas_cluster import run

        return run(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = args.device
    rng = np.random.default_rng(args.seed)
    vocab = words(2000, rng)
    lengths = rng.integers(args.min_words, args.max_words + 1, size=args.sentences)
    pairs = [(sentence(vocab, n, rng), sentence(vocab, max(1, int(n * rng.uniform(0.8, 1.2))), rng)) for n in lengths]

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "marian-base-random"
        build_marian(folder, args, [text for pair in pairs for text in pair] + vocab)
        hf = load_hf(folder, device)
        bundle = attnviz.load(str(folder), device=str(device))
        corpus, targets = Path(tmp) / "corpus.txt", Path(tmp) / "targets.txt"
        corpus.write_text("\n".join(s for s, _ in pairs) + "\n", encoding="utf-8")
        targets.write_text("\n".join(t for _, t in pairs) + "\n", encoding="utf-8")
        cfg = bundle.config
        tokens = [len(bundle.tokenizer.encode_source(s).ids) for s, _ in pairs]

        import transformers

        bf16_fast, bf16_why = fast_bfloat16(device)
        print(
            f"Random Marian, base size: {cfg.n_enc_layers}+{cfg.n_dec_layers} layers, d_model {cfg.d_model}, "
            f"{cfg.n_heads} heads, d_ff {cfg.d_ff}, vocabulary {cfg.src_vocab_size}; the same weights in every variant"
        )
        print(
            f"corpus: {len(pairs)} sentences with given decoder inputs, source {min(tokens)}..{max(tokens)} tokens "
            f"(mean {statistics.mean(tokens):.1f}); engines: --batch {args.batch}"
        )
        print(
            f"torch {torch.__version__}, transformers {transformers.__version__} | device {device} "
            f"({hardware_name(device)}) | {torch.get_num_threads()} threads"
        )
        print(f"fast bfloat16 on this hardware: {'yes' if bf16_fast else 'no'} ({bf16_why})")
        at_once = engine.batches_at_once(bundle.device)
        print(
            "the local engine runs "
            + (f"{at_once} batches at once, each on one torch thread" if at_once > 1 else "one batch at a time")
            + " here (attnviz.atlas.engine.batches_at_once)"
        )

        plain = plain_loop(hf, bundle.tokenizer, pairs, device)  # also the warm-up
        worst, where, moved = check_agreement(
            plain, engine_run(bundle, corpus, targets, args.batch, "fp32"), cfg.n_enc_layers, cfg.n_heads
        )
        print(
            f"plain loop vs fp32 engine: largest relative difference of a statistic or divergence {worst:.1e} "
            f"({where}); "
            f"argmax shares moved by a float32 tie: {moved:.2%} of values"
        )
        if not (worst <= AGREEMENT and moved <= MAX_ARGMAX_MOVED):
            raise RuntimeError(f"the plain loop and the engine disagree: {worst:.1e} on {where}, {moved:.2%} argmax")
        variants = {
            "plain": lambda: plain_loop(hf, bundle.tokenizer, pairs, device),
            "fp32": lambda: engine_run(bundle, corpus, targets, args.batch, "fp32"),
        }
        if at_once > 1:  # beside it, in the same repeats: what running batches at once gains here
            variants["fp32-1"] = lambda: engine_one_at_a_time(bundle, corpus, targets, args.batch)
        if bf16_fast:  # emulated bf16 measures the emulation (past 10 minutes on an AVX2-only EPYC): skipped
            bf16_atlas = engine_run(bundle, corpus, targets, args.batch, "bf16")
            a = engine_run(bundle, corpus, targets, args.batch, "fp32").heads[list(STATISTICS)].to_numpy(dtype=float)
            b = bf16_atlas.heads[list(STATISTICS)].to_numpy(dtype=float)
            print(f"bf16 vs fp32 engine, largest difference of a head's mean statistic: {np.nanmax(np.abs(a - b)):.1e}")
            variants["bf16"] = lambda: engine_run(bundle, corpus, targets, args.batch, "bf16")
        else:
            print(f"bf16: skipped, this hardware has no fast bfloat16 ({bf16_why}): emulated, slower than fp32")
        print()
        times: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for repeat in range(args.repeats):
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                synchronize(device)
                start = time.perf_counter()
                variants[name]()
                synchronize(device)
                times[name].append(time.perf_counter() - start)
        ceiling = bf16_ceiling(bundle, pairs, args) if bf16_fast else None

    spent = plain["seconds"]
    print(
        f"the plain loop's warm-up run: model {spent['model']:.1f} s, statistics {spent['statistics']:.1f} s, "
        f"divergences {spent['divergences']:.1f} s (numpy, each pair of heads once)"
    )
    print(f"{'variant':<8} {'median s':>9} {'sentences/s':>12} {'speed-up':>9}  (median of {args.repeats} repeats)")
    speedup = {}
    for name in names:
        ratios = [p / t for p, t in zip(times["plain"], times[name], strict=True)]
        speedup[name] = statistics.median(ratios)
        median = statistics.median(times[name])
        print(f"{name:<8} {median:>9.2f} {len(pairs) / median:>12.1f} {speedup[name]:>8.2f}x")
    spread = max(
        (max(r) - min(r)) / statistics.median(r)
        for r in ([p / t for p, t in zip(times["plain"], times[n], strict=True)] for n in names if n != "plain")
    )
    print(f"\nspread of a speed-up across repeats (max - min) / median: {spread:.0%}")
    if "fp32-1" in times:
        gain = statistics.median([a / b for a, b in zip(times["fp32-1"], times["fp32"], strict=True)])
        print(f"batches at once against one at a time (fp32-1 / fp32 time, median within repeats): {gain:.2f}x")
    without = (spent["model"] + spent["statistics"]) / (spent["model"] + spent["statistics"] + spent["divergences"])
    print(
        "without the divergences (the plain loop's model and statistics time alone, against the whole engine): "
        f"fp32 {speedup['fp32'] * without:.2f}x" + (f", bf16 {speedup['bf16'] * without:.2f}x" if bf16_fast else "")
    )
    verdict = lambda ok: "PASS" if ok else "MISS"  # noqa: E731
    print(f"target fp32 >= {TARGET_FP32:g}x: {verdict(speedup['fp32'] >= TARGET_FP32)}")
    if bf16_fast:
        print(f"target bf16 >= {TARGET_BF16:g}x: {verdict(speedup['bf16'] >= TARGET_BF16)}")
        fp32_s, bf16_s, most = ceiling
        gained = statistics.median([f / b for f, b in zip(times["fp32"], times["bf16"], strict=True)])
        print(
            f"bf16 ceiling: the forward alone (the engine's batches, every map) {fp32_s:.2f} s in fp32, {bf16_s:.2f} s "
            f"in bf16: {most:.2f}x; the whole engine's bf16 run against its fp32 run {gained:.2f}x, "
            f"{gained / most:.0%} of that ceiling"
        )
    else:
        print(f"target bf16 >= {TARGET_BF16:g}x: does not apply, this hardware has no fast bfloat16 ({bf16_why})")
    if args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "marian-base-random"  # the same model and corpus again, from the same seed
            build_marian(folder, args, [text for pair in pairs for text in pair] + vocab)
            bundle = attnviz.load(str(folder), device=str(device))
            corpus, targets = Path(tmp) / "corpus.txt", Path(tmp) / "targets.txt"
            corpus.write_text("\n".join(s for s, _ in pairs) + "\n", encoding="utf-8")
            targets.write_text("\n".join(t for _, t in pairs) + "\n", encoding="utf-8")
            print_profile(bundle, corpus, targets, args.batch, ["fp32", "bf16"] if bf16_fast else ["fp32"])
    with tempfile.TemporaryDirectory() as tmp:
        language_model_line(args, [s for s, _ in pairs], Path(tmp))
    if device.type == "cpu":
        print(f"CPU: {cpu_model()}")
    print(f"atlas_speedup_fp32={speedup['fp32']:.2f} atlas_speedup_bf16={speedup.get('bf16', math.nan):.2f}")
    if not math.isfinite(speedup["fp32"]):
        raise RuntimeError("a timing went wrong")


if __name__ == "__main__":
    main()
