"""One thread against every core, for torch and for numpy's BLAS: alone, and in processes that share the cores.

Run it from the repository root:

```bash
python benchmarks/bench_threads.py            # sizes 256, 512 and 1024; 3 repeats
python benchmarks/bench_threads.py --quick    # a smoke run (what the test suite does)
```

What it measures: the thin SVD of a (2n, n) float64 matrix (what the linearity page's least-squares
fits take, `attnviz.lessons.positional`) and the product of two (n, n) float64 matrices with numpy's
OpenBLAS, and a greedy translation of one sentence by the shipped en-de model with torch (what the
app's server runs for a short text), each the median of ``--repeats`` runs (the translation: of as
many as fit in ``--seconds``, 2), on 1 thread and on every core (`attnviz.threads.compute_on`).
First one process alone ("alone"), then one process per core doing the same work at the same time,
all with the same setting
("shared": the app's server and its heavy-work workers under a class, or a test suite's workers and
the servers they start); the figure is the median over the processes. The last line is exactly
``threads_shared_slowdown=<x> threads_alone_gain=<y>``: the most times as long any of the work takes
on every core as on one when the processes share the cores, and the most times as fast every core
makes any of it for a process alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_forward import cpu_model  # noqa: E402

from attnviz.threads import compute_on, numpy_blas_threads  # noqa: E402

SENTENCE = "Thursday, July 2, 1998, at 3:45 PM: three thousand, four hundred and fifty-six."


def timed(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(sizes: list[int], repeats: int, threads: int, seconds: float) -> dict[tuple[str, int], float]:
    import attnviz

    compute_on(threads)
    rng = np.random.default_rng(0)
    out = {}
    for n in sizes:
        tall, square = rng.standard_normal((2 * n, n)), rng.standard_normal((n, n))
        out["svd", n] = timed(lambda tall=tall: np.linalg.svd(tall, full_matrices=False), repeats)
        out["matmul", n] = timed(lambda square=square: square @ square, repeats)
    bundle = attnviz.load("en-de", "cpu")
    attnviz.translate(bundle, SENTENCE)  # the first call's one-time work is not timed
    times, end = [], time.monotonic() + seconds
    while time.monotonic() < end or len(times) < repeats:
        start = time.perf_counter()
        attnviz.translate(bundle, SENTENCE)
        times.append(time.perf_counter() - start)
    out["translate", 1] = statistics.median(times)  # one sentence
    return out


def in_processes(args: argparse.Namespace, threads: int, processes: int) -> dict[tuple[str, int], float]:
    """`measure` in ``processes`` processes at once: the median over them of each figure."""
    command = [sys.executable, __file__, "--child", str(threads), "--repeats", str(args.repeats)]
    command += ["--seconds", str(args.seconds), "--sizes", *map(str, args.sizes)]
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    outputs = []
    for child in children:
        out, _ = child.communicate(timeout=1800)
        if child.returncode != 0:
            raise RuntimeError(f"a measuring process ended with status {child.returncode}")
        outputs.append(json.loads(out))
    keys = [(key.split()[0], int(key.split()[1])) for key in outputs[0]]
    return {(work, n): statistics.median(o[f"{work} {n}"] for o in outputs) for work, n in keys}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="One thread against every core, for torch and numpy's BLAS, alone and shared."
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="how long the translation is repeated")
    parser.add_argument("--quick", action="store_true", help="sizes 32 and 64, 1 repeat, 0.2 s: a smoke run")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)  # one measuring process
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats, args.seconds = [32, 64], 1, 0.2
    if args.child is not None:
        figures = measure(args.sizes, args.repeats, args.child, args.seconds)
        print(json.dumps({f"{work} {n}": seconds for (work, n), seconds in figures.items()}))
        return 0
    if any(os.environ.get(name) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")):
        parser.error("unset OPENBLAS_NUM_THREADS and OMP_NUM_THREADS: this benchmark sets the threads itself")
    if numpy_blas_threads() is None:
        parser.error("numpy here is not built on OpenBLAS: there is no thread count to compare")
    cores = os.cpu_count() or 1
    print(f"attnviz threads benchmark | {cpu_model()}, {cores} cores | numpy {np.__version__} (OpenBLAS)")
    results = {
        (shared, threads): in_processes(args, threads, cores if shared else 1)
        for shared in (False, True)
        for threads in (1, cores)
    }
    print(f"\n{'work':9} {'n':>5} {'processes':>10}  {'1 thread':>9} {f'{cores} threads':>10}  ratio   (median s)")
    for shared in (False, True):
        for work, n in results[shared, 1]:
            one, every = results[shared, 1][work, n], results[shared, cores][work, n]
            where = f"{cores} shared" if shared else "1 alone"
            print(f"{work:9} {n:5d} {where:>10}  {one:9.4f} {every:10.4f}  {every / one:5.2f}")
    worst = max(results[True, cores][key] / results[True, 1][key] for key in results[True, 1])
    best = max(results[False, 1][key] / results[False, cores][key] for key in results[False, 1])
    print(f"\nthreads_shared_slowdown={worst:.2f} threads_alone_gain={best:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
