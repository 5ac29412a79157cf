"""Threads (attnviz.threads): what OpenBLAS and torch report, and which threads do the work."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from attnviz import jobs
from attnviz.threads import compute_on, limit_numpy_blas, numpy_blas_threads, share_the_cores

pytestmark = pytest.mark.skipif(numpy_blas_threads() is None, reason="numpy here is not built on OpenBLAS")


def _in_a_fresh_process(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    result = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120, check=True
    )
    return result.stdout.strip()


def test_openblas_reports_one_thread_after_the_limit_and_every_core_before():
    code = (
        "from attnviz.threads import limit_numpy_blas, numpy_blas_threads\n"
        "before = numpy_blas_threads()\nchanged = limit_numpy_blas(1)\nprint(before, changed, numpy_blas_threads())"
    )
    before, changed, after = _in_a_fresh_process(code).split()
    assert int(before) == min(os.cpu_count(), 64)  # OpenBLAS's default: a thread per core (this build's limit 64)
    assert (changed, after) == ("True", "1")


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS takes at most a thread per core")
def test_the_operators_own_setting_is_left_alone():
    code = (
        "from attnviz.threads import limit_numpy_blas, numpy_blas_threads\n"
        "print(limit_numpy_blas(1), numpy_blas_threads())"
    )
    assert _in_a_fresh_process(code, OPENBLAS_NUM_THREADS="2") == "False 2"
    assert _in_a_fresh_process(code, OMP_NUM_THREADS="2").startswith("False")


def _cpu_ticks_by_thread() -> dict[int, int]:
    ticks = {}
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        ticks[int(task.name)] = int(fields[11]) + int(fields[12])
    return ticks


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2, reason="needs Linux, 2 cores")
def test_with_the_limit_an_svd_runs_on_the_calling_thread_alone():
    """An independent look from /proc: during SVDs on one BLAS thread no other thread gains CPU time; allowed
    every core, OpenBLAS's own threads do (a tick is 10 ms of CPU)."""
    x = np.random.default_rng(0).standard_normal((1024, 512))
    np.linalg.svd(x, full_matrices=False)  # OpenBLAS's threads exist before the look

    def others_gain(threads: int) -> int:
        """Clock ticks the other threads gain while this one spends 50 (half a second) on SVDs."""
        limit_numpy_blas(threads)
        me = threading.get_native_id()
        before = _cpu_ticks_by_thread()
        end = time.monotonic() + 60  # a bound, should the machine be too busy to give 50 ticks
        while _cpu_ticks_by_thread()[me] - before[me] < 50 and time.monotonic() < end:
            np.linalg.svd(x, full_matrices=False)
        after = _cpu_ticks_by_thread()
        return sum(after[t] - before.get(t, 0) for t in after if t != me)

    try:
        assert others_gain(1) <= 1  # a tick at most: the process's other threads (pytest's own) may wake once
        assert others_gain(os.cpu_count()) >= 10  # on two threads each does about half of the work
    finally:
        limit_numpy_blas(1)  # this process's setting (conftest)


def test_a_worker_computes_on_the_threads_the_operator_gives_it(monkeypatch):
    import torch

    before = torch.get_num_threads()
    try:
        limit_numpy_blas(2)
        monkeypatch.setenv("ATTNVIZ_WORKER_THREADS", "1")
        assert jobs.use_threads() == 1
        assert (torch.get_num_threads(), numpy_blas_threads()) == (1, 1)
        monkeypatch.setenv("ATTNVIZ_WORKER_THREADS", "2")
        assert jobs.use_threads() == 2
        assert (torch.get_num_threads(), numpy_blas_threads()) == (2, 2)
        monkeypatch.setenv("ATTNVIZ_WORKER_THREADS", "many")
        assert jobs.use_threads() == 1
    finally:
        torch.set_num_threads(before)
        limit_numpy_blas(1)


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_every_page_of_the_app_takes_one_thread_for_torch_and_numpy(fresh_streamlit_caches):
    import torch
    from conftest import open_app

    compute_on(2)
    try:
        at = open_app()
        assert not at.exception
        seen = []  # torch's setting as a new thread (the server's next run) finds it; this one keeps its own
        later = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        later.start()
        later.join()
        assert (seen, numpy_blas_threads()) == ([1], 1)
    finally:
        compute_on(1)  # this process's setting (conftest)


def test_sharing_the_cores_leaves_the_operators_omp_setting_to_torch(monkeypatch):
    import torch

    compute_on(2)
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        share_the_cores()
        assert (torch.get_num_threads(), numpy_blas_threads()) == (2, 2)
        monkeypatch.delenv("OMP_NUM_THREADS")
        share_the_cores()
        assert (torch.get_num_threads(), numpy_blas_threads()) == (1, 1)
    finally:
        compute_on(1)  # this process's setting (conftest)
