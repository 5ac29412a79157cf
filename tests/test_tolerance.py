"""The snapshot tolerance the manual documents (DEFAULT_ATOL, docs/snapshots.md) holds across what this
machine can vary: thread counts, oneDNN on and off, and the CPU's instruction set (capped in a child process).

benchmarks/tolerance.py measures the same settings on more maps and prints the table in docs/tolerances.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import attnviz
from attnviz.linear import onednn_supported, use_onednn
from attnviz.testing.compare import DEFAULT_ATOL, compare_exports

# Long enough (36 source tokens) that the en-de encoder's feed-forward products reach oneDNN's
# threshold (attnviz.linear.MIN_WORK); a short sentence would never take oneDNN at d_model 128.
LONG = "Thursday, July 2, 1998 and Friday, August 14, 2003 and twenty-one thousand three hundred and forty-two"
# What a CPU without AVX-512 runs: ATen's, oneDNN's and MKL's dispatch capped to AVX2 (or, on a
# CPU whose best is AVX2, to no AVX at all).
CAPS = {
    "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "DEFAULT": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


@pytest.fixture(scope="module")
def bundle():
    return attnviz.load("en-de", device="cpu")


def assert_within_tolerance(a, b):
    report = compare_exports(a, b)
    assert report.equal, report.to_text()
    assert a.tgt_tokens == b.tgt_tokens  # the same greedy output: the maps really were compared


def test_one_thread_against_two(bundle):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = attnviz.attention(bundle, LONG)
        torch.set_num_threads(2)
        two = attnviz.attention(bundle, LONG)
    finally:
        torch.set_num_threads(before)
    assert (one.manifest["run"]["threads"], two.manifest["run"]["threads"]) == (1, 2)
    assert_within_tolerance(one, two)


@pytest.mark.skipif(not onednn_supported(), reason="oneDNN's linear kernel needs an x86-64 torch with oneDNN")
def test_onednn_on_against_off(bundle, monkeypatch):
    calls = []
    kernel = torch.ops.mkldnn._linear_pointwise

    def counted(*args, **kwargs):
        calls.append(args[1].shape)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counted)
    with use_onednn(True):
        on = attnviz.attention(bundle, LONG)
    assert calls, "oneDNN never ran: the comparison would prove nothing"
    calls.clear()
    with use_onednn(False):
        off = attnviz.attention(bundle, LONG)
    assert not calls
    assert (on.manifest["run"]["onednn"], off.manifest["run"]["onednn"]) == (True, False)
    assert_within_tolerance(on, off)


CHILD = """
import sys, attnviz
bundle = attnviz.load("en-de", device="cpu")
attnviz.attention(bundle, sys.argv[1]).save(sys.argv[2])
"""


@pytest.mark.slow
def test_another_instruction_set(bundle, tmp_path):
    native = torch.backends.cpu.get_cpu_capability()
    if native == "DEFAULT" or not onednn_supported():
        pytest.skip(f"this CPU ({native}) has no narrower x86 instruction set to compare with")
    capped = "AVX2" if native.startswith("AVX512") else "DEFAULT"
    out = tmp_path / "capped.npz"
    subprocess.run(
        [sys.executable, "-c", CHILD, LONG, str(out)], env={**os.environ, **CAPS[capped]}, check=True, timeout=300
    )
    other = attnviz.load_export(out)
    assert other.manifest["run"]["cpu_capability"] == capped  # the cap took effect
    assert_within_tolerance(attnviz.attention(bundle, LONG), other)


def test_the_default_tolerance_is_what_the_manual_documents():
    page = (Path(__file__).parent.parent / "docs" / "snapshots.md").read_text()
    assert "the default is atol 1e-5, rtol 0" in page and DEFAULT_ATOL == 1e-5


def test_the_measuring_script_counts_cells_off_and_refuses_other_inputs():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tolerance

    a = {"m/encoder": np.zeros((2, 3), np.float32), "m/cross": np.ones(4, np.float32)}
    b = {"m/encoder": np.array([[0, 2e-5, 0], [0, 0, -3e-6]], np.float32), "m/cross": np.ones(4, np.float32)}
    largest, off, cells = tolerance.compare(a, b)
    assert largest == pytest.approx(2e-5) and (off, cells) == (1, 10)
    with pytest.raises(SystemExit, match="different inputs"):
        tolerance.compare(a, {"m/encoder": b["m/encoder"]})


@pytest.mark.slow
def test_the_measuring_script_reads_maps_made_by_another_interpreter(tmp_path):
    """--python (torch versions are compared this way): a child interpreter computes the same maps
    as this process, and says which torch made them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import tolerance

    weights = tmp_path / "base.pt"
    torch.manual_seed(0)
    torch.save(
        tolerance.Transformer(tolerance.TransformerConfig(src_vocab_size=8000, tgt_vocab_size=8000)).state_dict(),
        weights,
    )
    maps, capability, version = tolerance.in_child(weights, {}, sys.executable)
    assert version == torch.__version__ and capability == torch.backends.cpu.get_cpu_capability()
    largest, off, cells = tolerance.compare(tolerance.collect(weights), maps)
    # equal up to the thread count (the suite runs one thread, the child torch's default), which
    # moves nothing on torch 2.13 and up to 6e-7 on torch 2.4
    assert largest < DEFAULT_ATOL and off == 0 and cells > 600_000
