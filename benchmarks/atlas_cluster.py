"""`bench_atlas.py --cluster`: the atlas's sentences per second on the local engine and on real Ray
clusters of one and two nodes started on this machine.

Each engine runs `attnviz.atlas.write_atlas` on the same generated corpus (short lines of the
`reverse` model's task by default) in a fresh driver process that times the call alone: reading and
tokenising the corpus, the work, the shards and the final tables; on Ray also connecting to the
cluster and starting the actors (which load the model), costs a real run pays too. The clusters are
started as the tests start theirs (``tests/ray_cluster.py``: ``ray start`` on 127.0.0.1, nodes of
``--node-cpus`` CPUs, stopped by process id) and the driver reaches them through ``RAY_ADDRESS``.
Each Ray atlas is checked against the local one (heads' table, within 1e-5) before its figure is
printed. Per-node throughput is the cluster's figure divided by its nodes.

Nodes on one machine share its cores with each other, the driver and Ray's own processes: on two
cores, two nodes cannot show scaling, and the output says so beside the figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ray_cluster import RayCluster, cluster_env  # noqa: E402

DRIVER = """
import json, sys, time
import attnviz
from attnviz.atlas import write_atlas
model, corpus, out, engine = sys.argv[1:5]
bundle = attnviz.load(model, device="cpu")
start = time.perf_counter()
manifest = write_atlas(bundle, corpus, out, engine=engine)
print(json.dumps({"seconds": time.perf_counter() - start, "sentences": manifest["counts"]["sentences"]}))
"""


def reverse_corpus(path: Path, lines: int, seed: int = 0) -> None:
    """``lines`` lines of 3 to 8 letters: the `reverse` model's task, every line usable."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    path.write_text("".join(" ".join(rng.choice(letters, rng.integers(3, 9))) + "\n" for _ in range(lines)))


def timed_atlas(model: str, corpus: Path, out: Path, engine: str, env: dict[str, str]) -> tuple[float, int]:
    """(seconds, sentences) of one `write_atlas` call in a fresh driver process."""
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, model, str(corpus), str(out), engine],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"the {engine} engine failed:\n{result.stderr[-3000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    return figures["seconds"], figures["sentences"]


def same_heads(ours: Path, theirs: Path) -> float:
    """The largest difference between two atlases' heads' tables; SystemExit when their heads differ."""
    want, got = (pd.read_parquet(folder / "heads.parquet") for folder in (ours, theirs))
    numbers = want.select_dtypes("number").columns
    if not want.drop(columns=numbers).equals(got.drop(columns=numbers)):
        raise SystemExit(f"{theirs.name}: its heads are not the local engine's")
    a, b = (frame[numbers].astype("float64").to_numpy() for frame in (want, got))
    return float(np.nanmax(np.abs(a - b)))


def run(args) -> None:
    """Print the local engine's and 1 and 2 Ray nodes' sentences per second, with the CPU."""
    from bench_forward import cpu_model

    with open("/proc/cpuinfo", encoding="utf-8") as f:
        info = f.read()
    flags = sorted({flag for flag in ("avx512_bf16", "amx_bf16") if f" {flag}" in info}) or ["neither bf16 flag"]
    cores = os.cpu_count()
    print(f"CPU: {cpu_model()} ({cores} cores; {', '.join(flags)}); load average {os.getloadavg()[0]:.1f}")
    print(
        f"corpus: {args.cluster_lines:,} generated lines of the `{args.cluster_model}` model's task; "
        f"Ray nodes of {args.node_cpus} CPU each on 127.0.0.1"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus = tmp / "corpus.txt"
        reverse_corpus(corpus, args.cluster_lines)
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        seconds, sentences = timed_atlas(args.cluster_model, corpus, tmp / "local", "local", env)
        rows.append(("local engine", "-", cores, seconds, sentences, None))
        for nodes in (1, 2):
            (tmp / f"ray{nodes}").mkdir()
            with RayCluster(tmp / f"ray{nodes}") as cluster:
                for _ in range(nodes):
                    cluster.add_node(cpus=args.node_cpus)
                out = tmp / f"atlas{nodes}"
                env = cluster_env(cluster.address)
                seconds, sentences = timed_atlas(args.cluster_model, corpus, out, "ray", env)
            gap = same_heads(tmp / "local", out)
            rows.append(
                (f"Ray, {nodes} node{'s' * (nodes > 1)}", nodes, nodes * args.node_cpus, seconds, sentences, gap)
            )
    print(f"\n{'engine':<14} {'nodes':>5} {'CPUs':>4} {'seconds':>8} {'sentences/s':>11} {'per node':>9}  vs local")
    for name, nodes, cpus, seconds, sentences, gap in rows:
        rate = sentences / seconds
        per_node = "-" if nodes == "-" else f"{rate / nodes:.1f}"
        agree = "" if gap is None else f"  heads agree to {gap:.0e}"
        note = ""
        if nodes == 2 and cores is not None and cores <= 2 * args.node_cpus:
            note = f"  (no scaling can show: {cores} cores shared by both nodes, the driver and Ray's own processes)"
        print(f"{name:<14} {nodes:>5} {cpus:>4} {seconds:>8.1f} {rate:>11.1f} {per_node:>9}{agree}{note}")
