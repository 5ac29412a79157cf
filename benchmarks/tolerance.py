"""How far attention maps move across thread counts, kernels, CPU instruction sets and devices.

```bash
python benchmarks/tolerance.py             # the CPU settings this machine can reach
python benchmarks/tolerance.py --cuda      # and the GPU against the CPU, when there is one
python benchmarks/tolerance.py --python ENV/bin/python   # and another environment (another torch)
```

The same maps (the shipped models on the golden inputs and on a 36-token sentence, and the paper's
base configuration with random weights at S = T = 64) are computed under each setting and compared
with the reference: this CPU's own vector unit, torch's default thread count, oneDNN on. The
other instruction sets run in a child process with ATen's, oneDNN's and MKL's dispatch capped
(``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``): the kernels a CPU
without AVX-512 (or without AVX) would run, on this CPU. ``--python`` computes the same maps in
another Python environment, with this project's code on its path: how torch versions are compared.
It prints a Markdown table for docs/tolerances.md: the largest |A - B| over
every cell of every map, and how many cells are off by more than the default tolerance.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import attnviz
from attnviz.devices import device_name
from attnviz.linear import use_onednn
from attnviz.model import Transformer, TransformerConfig
from attnviz.testing.compare import DEFAULT_ATOL

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "golden"))
from regenerate import INPUTS  # noqa: E402

LONG_SOURCE = "Thursday, July 2, 1998 and Friday, August 14, 2003 and twenty-one thousand three hundred and forty-two"
BASE_LENGTH = 64
# (label, environment) of the instruction sets emulated in a child process
ISAS = {
    "AVX2 (dispatch capped)": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "SSE4.2, no AVX (dispatch capped)": {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    },
}


def base_model(weights: Path) -> Transformer:
    """The paper's base configuration with random weights, the same in every process (read from ``weights``)."""
    model = Transformer(TransformerConfig(src_vocab_size=8000, tgt_vocab_size=8000)).eval().requires_grad_(False)
    model.load_state_dict(torch.load(weights, weights_only=True))
    return model


def collect(weights: Path, device: str = "cpu") -> dict[str, np.ndarray]:
    """Every map of every case, flat: '<case>/<kind>' -> (L, H, Q, K) float32."""
    maps = {}
    for name in ("en-de", "reverse"):
        bundle = attnviz.load(name, device=device)
        cases = [*INPUTS[name], *([(LONG_SOURCE, None)] if name == "en-de" else [])]
        for i, (src, tgt) in enumerate(cases):
            export = attnviz.attention(bundle, src, tgt)
            maps.update({f"{name}/{i}/{kind}": getattr(export, kind) for kind in ("encoder", "decoder", "cross")})
    model = base_model(weights).to(device)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 8000, (1, BASE_LENGTH), generator=g).to(device)
    tgt = torch.randint(4, 8000, (1, BASE_LENGTH), generator=g).to(device)
    with torch.no_grad():
        attention = model(src, tgt, return_attention=True, return_logits=False).attention
    for kind in ("encoder", "decoder", "cross"):
        maps[f"base/{kind}"] = attention.stacked(kind)[:, 0].float().cpu().numpy()
    return maps


def compare(reference: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> tuple[float, int, int]:
    """(largest |A - B|, cells over the default tolerance, cells) over every map both hold."""
    shared = [k for k in reference if k in other and reference[k].shape == other[k].shape]
    if len(shared) != len(reference):
        raise SystemExit(f"the settings gave different inputs for {sorted(set(reference) - set(shared))}")
    gaps = [np.abs(reference[k].astype(np.float64) - other[k]) for k in shared]
    return (
        max(float(g.max()) for g in gaps),
        sum(int((g > DEFAULT_ATOL).sum()) for g in gaps),
        sum(g.size for g in gaps),
    )


def in_child(
    weights: Path, env: dict[str, str], python: str = sys.executable
) -> tuple[dict[str, np.ndarray], str, str]:
    """The maps computed by ``python`` (this interpreter unless given) in a child process with ``env`` added."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "maps.npz"
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        subprocess.run(
            [python, __file__, "--worker", str(out), "--weights", str(weights)],
            env={**os.environ, "PYTHONPATH": path, **env},
            check=True,
        )
        with np.load(out) as z:
            maps = {k: z[k] for k in z.files if not k.startswith("__")}
            return maps, str(z["__capability__"]), str(z["__torch__"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuda", action="store_true", help="also compare the GPU with the CPU")
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="PYTHON",
        help="also compare the maps made by this interpreter (e.g. a virtual environment with another torch)",
    )
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--weights", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for python in args.python:
        if not os.access(python, os.X_OK) or os.path.isdir(python):
            parser.error(f"--python {python}: not an interpreter this user can run")
    if args.worker:
        maps = collect(args.weights)
        np.savez(
            args.worker,
            __capability__=np.array(torch.backends.cpu.get_cpu_capability()),
            __torch__=np.array(torch.__version__),
            **maps,
        )
        return

    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "base.pt"
        torch.manual_seed(0)
        torch.save(Transformer(TransformerConfig(src_vocab_size=8000, tgt_vocab_size=8000)).state_dict(), weights)
        threads = torch.get_num_threads()
        reference = collect(weights)
        rows = []
        torch.set_num_threads(1)
        rows.append((f"1 thread vs {threads}", compare(reference, collect(weights))))
        torch.set_num_threads(threads)
        with use_onednn(False):
            rows.append(("oneDNN off (F.linear) vs on", compare(reference, collect(weights))))
        native = torch.backends.cpu.get_cpu_capability()
        for label, env in ISAS.items():
            maps, capability, _ = in_child(weights, env)
            rows.append((f"{label}: {capability} vs {native}", compare(reference, maps)))
        for python in args.python:
            maps, _, version = in_child(weights, {}, python)
            rows.append((f"torch {version} vs {torch.__version__}", compare(reference, maps)))
        if args.cuda and torch.cuda.is_available():
            rows.append(
                (
                    f"GPU ({torch.cuda.get_device_name()}) fp32, TF32 off vs CPU",
                    compare(reference, collect(weights, "cuda")),
                )
            )
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            rows.append(("GPU with TF32 matmuls vs CPU", compare(reference, collect(weights, "cuda"))))
        elif args.cuda:
            print("no CUDA GPU here: the GPU rows are left out", file=sys.stderr)

    cpu = device_name(torch.device("cpu"))
    print(f"{cpu}, torch {torch.__version__}, {threads} threads; {len(reference)} maps")
    print(f"| setting | largest \\|A - B\\| | cells off by more than {DEFAULT_ATOL:g} |")
    print("|---|---|---|")
    for label, (largest, off, cells) in rows:
        print(f"| {label} | {largest:.1e} | {off:,} of {cells:,} |")


if __name__ == "__main__":
    main()
