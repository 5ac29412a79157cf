"""The Ray engine gives the local engine's atlas, on a local 2-CPU Ray started and stopped here."""

from __future__ import annotations

import logging
import os

import numpy as np
import pandas as pd
import pytest

import attnviz
from attnviz.atlas import build_atlas
from attnviz.atlas.ray_engine import LOCAL_ONLY

os.environ.setdefault(LOCAL_ONLY, "0")  # Ray's servers on 127.0.0.1 only; read when Ray is imported
ray = pytest.importorskip("ray", reason='the Ray engine needs Ray: pip install -e ".[ray]"')

LINES = ["twenty-one", "", "Thursday, July 2, 1998", "$1,234.50", "7/2/98", "3:45 PM", "one hundred"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    node = ray._private.worker._global_node
    pids = [p.process.pid for procs in node.all_processes.values() for p in procs]
    try:
        yield
    finally:
        ray.shutdown()
    left = [pid for pid in pids if _alive(pid)]
    assert not left, f"Ray left processes running: {left}"


@pytest.mark.slow
def test_the_ray_engine_equals_the_local_engine(local_ray, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    bundle = attnviz.load("en-de", device="cpu")
    kwargs = dict(batch_size=2, shard_size=3)
    local = build_atlas(bundle, corpus, tmp_path / "local", engine="local", **kwargs)
    remote = build_atlas(bundle, corpus, tmp_path / "ray", engine="ray", **kwargs)
    assert remote.manifest["engine"] == "ray" and remote.manifest["versions"]["ray"] == ray.__version__
    assert (
        remote.manifest["counts"]
        == local.manifest["counts"]
        == {
            "lines": 7,
            "sentences": 6,
            "skipped": {"empty": 1, "too_long": 0, "not_utf8": 0, "empty_target": 0, "target_too_long": 0},
        }
    )
    assert ray.is_initialized(), "a Ray the caller started is left running"
    for name in ("sentences", "heads", "distances", "mds", "inputs"):
        ours, theirs = getattr(local, name), getattr(remote, name)
        numbers = ours.select_dtypes("number").columns
        pd.testing.assert_frame_equal(ours.drop(columns=numbers), theirs.drop(columns=numbers), check_like=False)
        got, want = (frame[numbers].astype("float64").to_numpy() for frame in (theirs, ours))  # NA becomes NaN
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=name)
