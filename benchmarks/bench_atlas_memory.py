"""The driver's peak memory of `attnviz atlas` against the corpus's size: streamed, it should not grow.

```bash
python benchmarks/bench_atlas_memory.py --lines 20000 --lines 60000          # the `reverse` model
python benchmarks/bench_atlas_memory.py --lines 1000000 --stub               # no model: the driver only
```

Each size runs `attnviz atlas` (the local engine) in a fresh process on a generated corpus of short
lines (3 to 8 letters, the `reverse` model's task) and prints that process's peak RSS
(``ru_maxrss``). ``--stub`` replaces the model's batch function with one that returns arrays of the
right shapes at once: everything the driver holds (reading, tokenising, sorting, shards, the
merge into the final tables) at full size, in less time than the model takes (1,000,000 lines
with the model: 21.6 minutes over a kill and a resume on a quiet 2-core AMD EPYC with avx512_bf16,
hours on a loaded one).
The CPU is printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STUB = """
import sys
from dataclasses import replace

import numpy as np

import attnviz.atlas.engine as engine
from attnviz.atlas.stats import STATISTICS


def run_batch(bundle, sentences, precision="fp32"):
    cfg, tok = bundle.config, bundle.tokenizer
    sentences = [s if s.tgt_ids is not None else replace(s, tgt_ids=(tok.bos_id, *s.src_ids[::-1]),
                 tgt_tokens=("<s>", *s.src_tokens[::-1])) for s in sentences]
    rng = np.random.default_rng([len(sentences), sentences[0].line])
    B, H = len(sentences), cfg.n_heads
    stats, divergences = {}, {}
    for kind in ("encoder", "decoder", "cross"):
        L = cfg.n_layers_of(kind)
        stats[kind] = rng.random((B, L, H, len(STATISTICS)), dtype=np.float32)
        divergences[kind] = rng.random((B, L * H, L * H))
    return engine.BatchResult(tuple(sentences), stats, divergences)


engine.run_batch = run_batch
from attnviz.cli import main

sys.exit(main(sys.argv[1:]))
"""


def corpus(path: Path, lines: int) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    with open(path, "w") as f:
        for start in range(0, lines, 100_000):
            n = min(100_000, lines - start)
            sizes = rng.integers(3, 9, n)
            f.writelines(" ".join(rng.choice(letters, k)) + "\n" for k in sizes)


def peak_rss_mb(command: list[str]) -> tuple[float, float]:
    """(peak RSS in MB, wall seconds) of ``command`` run as a child (``ru_maxrss`` from wait4: KiB on Linux)."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.communicate()
    if status != 0:
        raise SystemExit(f"{' '.join(command[:4])}... failed with status {status}")
    return usage.ru_maxrss / 1024, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, action="append", help="corpus sizes (repeat); default 2000 and 8000")
    parser.add_argument("--stub", action="store_true", help="no model: arrays of the right shapes (the driver only)")
    parser.add_argument("--model", default="reverse")
    args = parser.parse_args()
    with open("/proc/cpuinfo") as f:
        info = f.read()
    cpu = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
    flags = sorted({flag for flag in ("avx512_bf16", "amx_bf16") if f" {flag}" in info}) or ["neither bf16 flag"]
    print(f"CPU: {cpu} ({os.cpu_count()} cores; {', '.join(flags)})")
    runner = [sys.executable, "-c", STUB] if args.stub else [sys.executable, "-m", "attnviz.cli"]
    os.environ["ATTNVIZ_MAX_ATLAS_ROWS"] = str(10**10)  # beyond what the app reads: allowed for the measurement
    with tempfile.TemporaryDirectory() as tmp:
        for lines in args.lines or [2000, 8000]:
            path = Path(tmp) / f"corpus{lines}.txt"
            corpus(path, lines)
            out = Path(tmp) / f"atlas{lines}"
            command = runner + ["atlas", "--model", args.model, "--device", "cpu", "--corpus", str(path)]
            rss, seconds = peak_rss_mb(command + ["--out", str(out)])
            size = sum(p.stat().st_size for p in out.iterdir()) / 2**20
            what = "stub engine" if args.stub else f"model {args.model}"
            print(f"{lines:>9,} lines ({what}): peak RSS {rss:,.0f} MB, {seconds:,.0f} s, atlas {size:,.0f} MB")


if __name__ == "__main__":
    main()
