"""The app's memory is bounded by bytes: results are counted by what they hold and dropped oldest first."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from conftest import toy_export

from attnviz.app.budget import ByteBudget, held_bytes

MB = 2**20


def test_held_bytes_counts_arrays_tensors_and_tables_once():
    import pandas as pd

    a = np.zeros((256, 1024), dtype=np.float32)  # 1 MB
    t = torch.zeros(1024, 256, dtype=torch.float64)  # 2 MB
    frame = pd.DataFrame({"x": np.zeros(MB // 8)})  # 1 MB of float64
    assert MB <= held_bytes(a) < MB + 1024
    assert held_bytes({"a": a, "again": a, "t": t, "f": frame}) == pytest.approx(4 * MB, rel=0.01)
    export = toy_export()
    arrays = sum(v.nbytes for v in (export.encoder, export.decoder, export.cross, export.src_ids, export.tgt_ids))
    assert arrays <= held_bytes(export) < arrays + 64 * 1024
    assert not export.encoder.flags.writeable, "a result shared by every session is read-only"


def test_the_least_recently_used_results_go_first_and_the_total_stays_under_the_budget():
    budget = ByteBudget(lambda: 3 * MB + 4096)
    make = lambda: np.zeros(MB // 4, dtype=np.float32)  # noqa: E731 - 1 MB each
    for key in "abc":
        budget.get(key, make)
    budget.get("a", lambda: pytest.fail("'a' is kept: no new computation"))  # 'a' is now the most recent
    budget.get("d", make)
    assert budget.total <= 3 * MB + 4096 and len(budget) == 3
    made = []
    budget.get("b", lambda: made.append("b") or make())
    assert made == ["b"], "'b' was the least recently used: it went first"
    budget.get("a", lambda: pytest.fail("'a' was used recently: it stays"))
    assert budget.get("huge", lambda: np.zeros(MB, dtype=np.float32)).nbytes == 4 * MB
    assert len(budget) == 3 and budget.total <= 3 * MB + 4096, "a result over the whole budget is not kept"


def test_a_job_s_results_can_be_forgotten_and_only_that_job_s(fresh_streamlit_caches, monkeypatch):
    from attnviz.app import cache

    made = []
    monkeypatch.setitem(cache.JOB_RULES, "timing", ("Timing", lambda *a: True))  # in place: no worker needed
    monkeypatch.setitem(cache.JOB_RULES, "warm", ("Nothing", lambda *a: True))
    monkeypatch.setattr(cache.jobs, "run_job", lambda b, name, args, p=None: made.append(name) or np.zeros(8))
    cache.computed("timing", "en-de", "cpu", 64), cache.computed("timing", "en-de", "cpu", 64)
    cache.computed("warm", "en-de", "cpu")
    before = cache.RESULTS.total
    cache.forget("timing")  # "Measure again"
    assert cache.RESULTS.total == before - 64
    cache.computed("timing", "en-de", "cpu", 64), cache.computed("warm", "en-de", "cpu")
    assert made == ["timing", "warm", "timing"]


def test_sessions_asking_at_once_make_a_result_once():
    budget, calls = ByteBudget(lambda: 64 * MB), []

    def slow():
        calls.append(1)
        time.sleep(0.2)
        return np.ones(10)

    threads = [threading.Thread(target=budget.get, args=("k", slow)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1


def test_a_session_arriving_while_a_result_is_measured_neither_makes_it_again_nor_counts_it_twice(monkeypatch):
    """Measuring a result (a figure's JSON) takes milliseconds after it is made: a session that asked then
    made it a second time and the budget counted its bytes twice, for good (30 students opening one page
    at once left half the shared figures counted double)."""
    from attnviz.app import budget as module

    measuring, second_done = threading.Event(), threading.Event()

    def measured(value, seen=None):
        if threading.current_thread().name == "first":
            measuring.set()
            second_done.wait(1.0)  # the second session's whole visit, if it does not wait for this result
        return held_bytes(value, seen)

    monkeypatch.setattr(module, "held_bytes", measured)
    cache, made = ByteBudget(lambda: 64 * MB), []

    def make():
        made.append(threading.current_thread().name)
        return np.ones(MB // 8)  # 1 MB

    first = threading.Thread(target=cache.get, args=("k", make), name="first")
    first.start()
    assert measuring.wait(10)

    def second_visit():
        cache.get("k", make)
        second_done.set()

    second = threading.Thread(target=second_visit, name="second")
    second.start()
    first.join(10)
    second.join(10)
    assert made == ["first"], "the second session waited for the first one's result"
    assert len(cache) == 1 and cache.total == MB, "the result's bytes are counted once"


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_distinct_long_inputs_one_after_another_stay_under_the_operators_budget(monkeypatch):
    """The app's own cache, with 12 distinct inputs (about 50 kB of maps each) under a 0.2 MB budget."""
    from attnviz.app import cache

    monkeypatch.setenv("ATTNVIZ_CACHE_MB", "0.2")
    cache.RESULTS.clear()
    letters = "abcdefghijklmnopqrstuvwxyz"
    try:
        for i in range(12):
            sentence = " ".join(letters[(i + j) % 26] for j in range(19))  # the reverse model reads up to 20
            cache.computed("attention", "reverse", "cpu", sentence, None)
            assert cache.RESULTS.total <= 0.2 * MB
        assert 0 < len(cache.RESULTS) < 12, "the oldest were dropped"
    finally:
        cache.RESULTS.clear()


def test_a_result_made_while_a_model_folder_changes_is_not_handed_out_after():
    """A figure being made from the old weights when the folder changes is kept under the old epoch, where
    nobody asks for it (a review: dropping what was kept missed what was being made)."""
    from attnviz.app import cache

    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(30)
        return "made from the old weights"

    making = threading.Thread(target=lambda: cache.shared("race", ("key",), slow))
    making.start()
    assert started.wait(30)
    cache.forget_model("a model whose folder changed")
    release.set()
    making.join(30)
    assert cache.shared("race", ("key",), lambda: "made from the new weights") == "made from the new weights"
