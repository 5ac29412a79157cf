"""The gpu tier: on a CUDA GPU, every shipped model's maps equal the CPU's, and decoding, the atlas and the
app's device choice run there. Skipped, with the reason, where there is no CUDA GPU or torch is a CPU build.

Run it alone with ``pytest -m gpu``; it is part of the default suite and skips itself elsewhere. A
CUDA build of torch: docs/install.md.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import open_app

import attnviz
from attnviz.api import list_models
from attnviz.atlas import STATISTICS, compute_atlas
from attnviz.kinds import KINDS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason=f"no CUDA GPU here (torch {torch.__version__}, CUDA build: {torch.version.cuda is not None})",
    ),
]
ATOL = 1e-4  # GPU and CPU kernels sum in different orders; float32 maps agree far inside this
FALLBACK = ["The cat sat on the mat.", "Attention is all you need."]  # for a model without examples


def _sentences(bundle) -> list[str]:
    return list(bundle.info.get("examples") or FALLBACK)[:4]


@pytest.fixture(autouse=True)
def no_tf32():
    """float32 products in float32: TF32 (10-bit mantissas) would move maps by about 1e-3."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("name", list_models())
def test_every_shipped_models_maps_on_cuda_equal_the_cpus(name):
    cpu, gpu = attnviz.load(name, device="cpu"), attnviz.load(name, device="cuda")
    assert gpu.device.type == "cuda"
    for sentence in _sentences(cpu):
        want = attnviz.attention(cpu, sentence)
        # a language model has no source: its text is the decoder's input (src None, as in api.attention)
        src = None if want.src_ids is None else torch.from_numpy(want.src_ids)[None].cuda()
        tgt = None if want.tgt_ids is None else torch.from_numpy(want.tgt_ids)[None].cuda()  # the CPU's decoder input
        with torch.no_grad():
            got = gpu.model(src, tgt, return_attention=True, return_logits=False).attention
        for kind in KINDS:
            if getattr(want, kind) is None:
                continue
            maps = got.stacked(kind)[:, 0].cpu().numpy()
            np.testing.assert_allclose(maps, getattr(want, kind), atol=ATOL, rtol=0, err_msg=f"{name} {kind}")


def test_the_step_through_runs_on_cuda_and_equals_the_cpus():
    cpu, gpu = attnviz.load("en-de", device="cpu"), attnviz.load("en-de", device="cuda")
    for beam in (1, 4):
        want, got = (
            attnviz.step_through(cpu, "twenty-one", beam=beam),
            attnviz.step_through(gpu, "twenty-one", beam=beam),
        )
        assert got.ids == want.ids
        for a, b in zip(got.steps, want.steps, strict=True):
            np.testing.assert_allclose(a.cross_attn.numpy(), b.cross_attn.numpy(), atol=ATOL, rtol=0)
            np.testing.assert_allclose(a.self_attn.numpy(), b.self_attn.numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_atlas_runs_on_cuda(precision):
    cpu, gpu = attnviz.load("en-de", device="cpu"), attnviz.load("en-de", device="cuda")
    sentences = _sentences(cpu)
    want = compute_atlas(cpu, sentences)
    got = compute_atlas(gpu, sentences, precision=precision)
    assert got.manifest["device"].startswith("cuda") and got.manifest["precision"] == precision
    tolerance = ATOL if precision == "fp32" else 0.05  # bf16: the bound of tests/test_atlas_stats.py
    continuous = [name for name in STATISTICS if not name.startswith("argmax")]
    a = got.sentences[continuous].to_numpy(dtype=np.float64)
    b = want.sentences[continuous].to_numpy(dtype=np.float64)
    np.testing.assert_allclose(a, b, atol=tolerance, rtol=0)


@pytest.mark.usefixtures("fresh_streamlit_caches")
def test_the_apps_automatic_device_choice_picks_cuda():
    at = open_app("app.py")
    assert not at.exception
    assert at.sidebar.selectbox(key="device").value == "auto"
    assert any("on cuda" in c.value for c in at.sidebar.caption), [c.value for c in at.sidebar.caption]
    assert at.get("plotly_chart")
