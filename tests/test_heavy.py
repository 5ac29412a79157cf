"""Heavy work in the app: admitted in order, bounded in number, time and size, run in worker processes."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import open_app

from attnviz import api, jobs
from attnviz.app import heavy
from attnviz.errors import CheckpointError, InputError


@pytest.fixture
def pool(monkeypatch):
    """A pool made from the settings the test sets, stopped afterwards."""
    heavy.reset()
    yield monkeypatch
    heavy.reset()


@pytest.fixture(scope="module")
def bundle():
    return api.load("en-de", "cpu")


def no_bundle():
    raise AssertionError("worker processes load the model themselves")


# ---------------------------------------------------------------------------------------------
# The gate


def test_the_gate_lets_in_first_come_first_served_and_never_more_than_its_bound():
    gate = heavy.Gate(at_once=2, queue=100)
    inside, most, order = [0], [0], []
    lock = threading.Lock()
    tickets = [gate.join() for _ in range(8)]  # joined in this order, before any thread runs

    def visitor(i: int) -> None:
        while gate.wait(tickets[i], 0.01):
            pass
        with lock:
            order.append(i)
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        with lock:
            inside[0] -= 1
        gate.leave(tickets[i], admitted=True)

    threads = [threading.Thread(target=visitor, args=(i,)) for i in reversed(range(8))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert order == list(range(8))
    assert most[0] == 2
    assert gate.load == (0, 0)


def test_a_waiting_visitor_is_told_how_many_are_ahead():
    gate = heavy.Gate(at_once=1, queue=10)
    first, second, third = gate.join(), gate.join(), gate.join()
    assert gate.wait(first, 0.01) == 0
    assert gate.wait(second, 0.01) == 1  # the one running
    assert gate.wait(third, 0.01) == 2
    gate.leave(second, admitted=False)  # a visitor who left while waiting
    assert gate.wait(third, 0.01) == 1
    gate.leave(first, admitted=True)
    assert gate.wait(third, 0.01) == 0


def test_a_full_queue_is_a_message_not_a_longer_wait():
    gate = heavy.Gate(at_once=1, queue=2)
    gate.join(), gate.join()
    with pytest.raises(heavy.BusyError, match="The server is busy: 2 long computations are already waiting"):
        gate.join()


def test_limits_come_from_the_environment_and_bad_values_fall_back(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_HEAVY_AT_ONCE", "3")
    monkeypatch.setenv("ATTNVIZ_HEAVY_QUEUE", "many")
    monkeypatch.setenv("ATTNVIZ_HEAVY_SECONDS", "-5")
    monkeypatch.setenv("ATTNVIZ_HEAVY_IN", "Threads")
    limits = heavy.Limits.from_environment()
    assert (limits.at_once, limits.queue, limits.seconds, limits.in_processes) == (3, 64, 120, False)


@pytest.mark.parametrize(
    "at_once, queue, seconds, expected",
    [
        ("0.5", "0.5", "inf", (1, 64, 120)),  # int(0.5) had been 0 at once, which let every job in; inf: no bound
        ("1e9", "1e9", "1e9", (heavy.MOST_AT_ONCE, heavy.MOST_WAITING, heavy.A_DAY)),  # a billion workers warmed
        ("nan", "-3", "0", (1, 64, 120)),
        ("2.0", " 7 ", "0.05", (2, 7, 0.05)),
    ],
)
def test_an_operators_number_out_of_its_range_is_its_default_or_its_bound_never_an_error(
    monkeypatch, caplog, at_once, queue, seconds, expected
):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # the default: the cores less one
    monkeypatch.setenv("ATTNVIZ_HEAVY_AT_ONCE", at_once)
    monkeypatch.setenv("ATTNVIZ_HEAVY_QUEUE", queue)
    monkeypatch.setenv("ATTNVIZ_HEAVY_SECONDS", seconds)
    with caplog.at_level("WARNING", logger="attnviz.settings"):
        limits = heavy.Limits.from_environment()
    assert (limits.at_once, limits.queue, limits.seconds) == expected
    assert isinstance(limits.at_once, int) and isinstance(limits.queue, int)
    if expected[1] != 7:
        assert "ATTNVIZ_HEAVY_QUEUE=" in caplog.text, "a replaced value is said in the log"


@pytest.mark.parametrize("setting, started", [(None, 2), ("1", 2), ("0", 0), (" 0 ", 0)])
def test_workers_warm_with_the_first_model_unless_the_operator_says_0(monkeypatch, setting, started):
    """Loading a model starts ATTNVIZ_HEAVY_AT_ONCE workers that load it too; ATTNVIZ_HEAVY_WARM=0 starts none."""
    monkeypatch.setenv("ATTNVIZ_HEAVY_AT_ONCE", "2")
    monkeypatch.setenv("ATTNVIZ_HEAVY_IN", "processes")
    if setting is None:
        monkeypatch.delenv("ATTNVIZ_HEAVY_WARM", raising=False)
    else:
        monkeypatch.setenv("ATTNVIZ_HEAVY_WARM", setting)
    calls, done, warmed = [], threading.Event(), set()

    def call(worker, name, model, device, *rest):  # no process: what the warm-up asks of each worker
        calls.append((name, model, device))
        warmed.add(id(worker))
        if len(calls) == 2:
            done.set()

    monkeypatch.setattr(heavy.Worker, "call", call)
    threads, real_thread = [], threading.Thread
    monkeypatch.setattr(heavy.threading, "Thread", lambda **kw: threads.append(real_thread(**kw)) or threads[-1])
    pool = heavy.Pool(heavy.Limits.from_environment())
    pool.warm("en-de", "cpu")
    for t in threads:  # the warm-up runs in the background: wait for it
        t.join(timeout=30)
    assert calls == [("warm", "en-de", "cpu")] * started
    assert len(warmed) == started, "as many workers as at once: one worker had been taken, warmed and taken again"
    assert len(threads) == (1 if started else 0)


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            heavy.BusyError("a worker process ended with status -9 during a job", heavy.LOST),
            "a worker process ended while it loaded en-de: a worker process ended with status -9 during a job",
        ),
        (  # seen when a server was stopped a second after it started: its fork server had ended first
            heavy.ForkServerError("the fork server did not answer: [Errno 104] Connection reset by peer"),
            "a worker process could not be started to load en-de: the fork server did not answer: [Errno 104] "
            "Connection reset by peer",
        ),
    ],
    ids=["its-worker-ended", "its-fork-server-ended"],
)
def test_a_worker_that_ends_during_the_warm_up_is_one_line_in_the_log(monkeypatch, caplog, error, line):
    """A server stopped while its workers load (its workers, or its fork server, killed with it): a warning
    line, no traceback."""
    monkeypatch.setenv("ATTNVIZ_HEAVY_AT_ONCE", "1")
    monkeypatch.setenv("ATTNVIZ_HEAVY_IN", "processes")
    monkeypatch.delenv("ATTNVIZ_HEAVY_WARM", raising=False)
    killed = []

    def call(worker, *args):
        raise error

    monkeypatch.setattr(heavy.Worker, "call", call)
    monkeypatch.setattr(heavy.Worker, "kill", lambda worker: killed.append(worker))
    threads, real_thread = [], threading.Thread
    monkeypatch.setattr(heavy.threading, "Thread", lambda **kw: threads.append(real_thread(**kw)) or threads[-1])
    pool = heavy.Pool(heavy.Limits.from_environment())
    with caplog.at_level("WARNING", logger=heavy.__name__):
        pool.warm("en-de", "cpu")
        for t in threads:
            t.join(timeout=30)
    (record,) = caplog.records
    assert record.getMessage() == line
    assert record.exc_info is None
    assert len(killed) == 1 and pool._idle == killed  # its process is gone; the next job starts a fresh one


# ---------------------------------------------------------------------------------------------
# The worker's pipe


def framed(*messages) -> bytes:
    out = io.BytesIO()
    for m in messages:
        jobs.send(out, m)
    return out.getvalue()


def replies(data: bytes) -> list:
    stream, out = io.BytesIO(data), []
    while (m := jobs.receive(stream.read)) is not None:
        out.append(m)
    return out


def test_a_worker_runs_named_jobs_only_and_answers_each(bundle):
    settings = {k: v for k, v in os.environ.items() if k.startswith("ATTNVIZ_")}
    request = framed(
        ("job", "attention", "en-de", "cpu", ("twenty-one", None, False), settings),
        ("job", "os.system", "en-de", "cpu", ("true",), settings),
        ("job", "attention", "en-de", "cpu", ("", None, False), settings),
    )
    out = io.BytesIO()
    jobs.serve(io.BytesIO(request).read, out)
    answers = replies(out.getvalue())
    assert answers[0] == ("ready",)
    assert answers[1][0] == "done"
    np.testing.assert_array_equal(answers[1][1].cross, api.attention(bundle, "twenty-one").cross)
    assert answers[2][0] == "error" and "no job named 'os.system'" in str(answers[2][1])
    assert answers[3][0] == "error" and isinstance(answers[3][1], InputError)
    assert len(answers) == 4


def test_errors_keep_both_messages_across_the_pipe():
    error = CheckpointError("/srv/models/x/config.json is not JSON", public="this folder is not a checkpoint")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is CheckpointError
    assert (str(back), back.public) == (str(error), error.public)


def test_an_error_that_cannot_travel_is_described_instead():
    class Local(Exception):
        pass

    error = jobs.sendable(Local("a lambda inside"))
    assert isinstance(error, RuntimeError) and "Local: a lambda inside" in str(error)


def test_the_server_settings_reach_a_worker_as_they_are_now(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_GONE", "1")
    monkeypatch.setenv("ATTNVIZ_KEPT", "old")
    # A worker drops every ATTNVIZ_ setting the server no longer has: here, the test process's own too
    # (the suite's ATTNVIZ_HEAVY_WARM and ATTNVIZ_ROOMS_DIR), which the later tests of this process need.
    before = dict(os.environ)
    jobs._apply_settings({"ATTNVIZ_KEPT": "new", "ATTNVIZ_ADDED": "2"})
    try:
        assert sorted(k for k in os.environ if k.startswith("ATTNVIZ_")) == ["ATTNVIZ_ADDED", "ATTNVIZ_KEPT"]
        assert os.environ["ATTNVIZ_KEPT"] == "new" and os.environ["ATTNVIZ_ADDED"] == "2"
    finally:
        os.environ.clear()
        os.environ.update(before)


# ---------------------------------------------------------------------------------------------
# Worker processes


@pytest.mark.slow
@pytest.mark.parametrize("started", ["forked", "fresh interpreter"])
def test_a_job_in_a_worker_process_gives_what_the_api_gives_here(pool, bundle, started):
    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")
    if started == "fresh interpreter":  # as off Linux: each worker its own `python -m attnviz.jobs`
        pool.setattr(heavy, "fork_server", lambda: None)
    there = heavy.run("attention", "en-de", "cpu", ("3:45 PM", None, True), no_bundle)
    here = api.attention(bundle, "3:45 PM", words=True)
    assert there.src_tokens == here.src_tokens and there.tgt_tokens == here.tgt_tokens
    for kind in ("encoder", "decoder", "cross"):
        np.testing.assert_allclose(getattr(there, kind), getattr(here, kind), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_an_atlas_reports_its_progress_from_the_worker(pool):
    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")
    seen = []
    sentences = tuple(f"{n} PM" for n in range(1, 40))
    atlas = heavy.run("atlas", "en-de", "cpu", (sentences,), no_bundle, progress=lambda d, t: seen.append((d, t)))
    assert len(atlas.inputs) == len(sentences)
    assert seen and seen[-1] == (39, 39) and [d for d, _ in seen] == sorted(d for d, _ in seen)


@pytest.mark.slow
def test_a_job_past_the_time_bound_is_stopped_with_a_message_and_its_worker_replaced(pool):
    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")
    heavy.run("warm", "en-de", "cpu", (), no_bundle)  # started and loaded: only the job is timed
    heavy.pool().limits = dataclasses.replace(heavy.pool().limits, seconds=0.05)
    worker = heavy.pool()._idle[0]
    pid = worker.proc.pid
    sentences = tuple(f"Thursday, July {n}, 1998" for n in range(1, 29))
    start = time.monotonic()
    with pytest.raises(heavy.BusyError, match="was stopped after 0.05 s.*ATTNVIZ_HEAVY_SECONDS"):
        heavy.run("importance", "en-de", "cpu", (sentences, None), no_bundle, "Measuring every head")
    assert time.monotonic() - start < 10
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped
    heavy.pool().limits = dataclasses.replace(heavy.pool().limits, seconds=120)
    assert heavy.run("attention", "en-de", "cpu", ("twenty-one", None, False), no_bundle).cross.ndim == 4


@pytest.mark.slow
def test_a_visitor_who_leaves_stops_the_job_and_the_next_one_runs(pool):
    """Streamlit stops a script by raising in its next drawing call: here, the progress callback."""
    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")

    class Left(BaseException):
        pass

    def progress(done, total):
        raise Left

    sentences = tuple(f"{n} PM" for n in range(1, 80))
    with pytest.raises(Left):
        heavy.run("atlas", "en-de", "cpu", (sentences,), no_bundle, progress=progress)
    assert heavy.pool().gate.load == (0, 0)
    assert heavy.run("attention", "en-de", "cpu", ("twenty-one", None, False), no_bundle).cross.ndim == 4


@pytest.mark.slow
def test_a_job_s_own_error_keeps_the_worker(pool):
    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")
    heavy.run("warm", "en-de", "cpu", (), no_bundle)
    pid = heavy.pool()._idle[0].proc.pid
    with pytest.raises(InputError, match="empty"):
        heavy.run("attention", "en-de", "cpu", ("   ", None, False), no_bundle)
    assert heavy.pool()._idle[0].proc.pid == pid


def test_in_threads_the_same_queue_runs_the_job_on_the_server_s_model(pool, bundle):
    pool.setenv("ATTNVIZ_HEAVY_IN", "threads")
    result = heavy.run("attention", "en-de", "cpu", ("twenty-one", None, False), lambda: bundle)
    np.testing.assert_array_equal(result.cross, api.attention(bundle, "twenty-one").cross)
    assert not heavy.pool()._idle  # no process was started


# ---------------------------------------------------------------------------------------------
# In the app


@pytest.mark.slow
def test_short_inputs_run_in_place_and_long_ones_go_through_the_queue(pool, fresh_streamlit_caches, monkeypatch):
    from attnviz.app import cache

    queued = []
    real = heavy.run
    monkeypatch.setattr(heavy, "run", lambda name, *a, **k: queued.append(name) or real(name, *a, **k))
    cache.computed("attention", "en-de", "cpu", "twenty-one", None)
    assert queued == []
    cache.computed("attention", "en-de", "cpu", " ".join(["Thursday, July 2, 1998"] * 8), None)
    cache.computed("decoding", "en-de", "cpu", "twenty-one", 4, None)
    assert queued == ["attention", "decoding"]


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_a_text_over_the_operator_s_token_bound_is_refused_before_any_work(pool, fresh_streamlit_caches):
    pool.setenv("ATTNVIZ_MAX_TOKENS", "20")
    at = open_app("pages/explorer.py")
    at.sidebar.text_area(key="src").set_value(" ".join(["Thursday, July 2, 1998"] * 4)).run()
    assert not at.exception
    assert any("this server takes at most 20" in e.value and "MAX" in e.value for e in at.error)
    assert not at.get("plotly_chart")


@pytest.mark.slow
def test_beam_search_on_the_decoding_page_runs_in_a_worker(pool, fresh_streamlit_caches):
    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")
    at = open_app("pages/decoding.py")
    at.slider(key="beam").set_value(4).run()
    assert not at.exception and not at.error
    assert at.get("plotly_chart")
    assert heavy.pool()._idle and heavy.pool()._idle[0].proc is not None


@pytest.mark.slow
def test_an_atlas_past_the_time_bound_says_so_on_the_page(pool, fresh_streamlit_caches):
    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")
    pool.setenv("ATTNVIZ_HEAVY_SECONDS", "0.01")  # 200 sentences take more than half a second here
    at = open_app("pages/atlas.py")
    at.radio(key="at_source").set_value("pasted").run()
    lines = "\n".join([f"Thursday, July {d}, {y}" for d in range(1, 29) for y in range(1990, 1998)][:200])
    at.text_area(key="at_pasted").set_value(lines).run()
    assert not at.exception
    assert any("was stopped after 0.01 s" in e.value for e in at.error), [e.value for e in at.error]


@pytest.mark.slow
def test_a_worker_that_dies_mid_job_is_a_message_and_is_replaced(pool):
    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")
    heavy.run("warm", "en-de", "cpu", (), no_bundle)
    pid = heavy.pool()._idle[0].proc.pid
    killed = []

    def kill_at_first_report(done: int, total: int) -> None:
        """The atlas has started and has batches left: the kernel's out-of-memory killer strikes now."""
        if not killed and done < total:
            os.kill(pid, 9)
            killed.append(done)

    sentences = tuple(f"Thursday, July {d}, {y}" for d in range(1, 29) for y in range(1990, 1998))[:200]
    with pytest.raises(heavy.BusyError) as caught:
        heavy.run("atlas", "en-de", "cpu", (sentences,), no_bundle, progress=kill_at_first_report)
    assert killed, "the worker was killed mid-job, not before it started or after it ended"
    assert "stopped unexpectedly" in caught.value.public and "status -9" in str(caught.value)
    assert heavy.run("attention", "en-de", "cpu", ("twenty-one", None, False), no_bundle).cross.ndim == 4


def test_a_waiting_visitor_sees_the_place_then_the_seconds_redrawn_only_when_they_change(monkeypatch):
    import streamlit as st
    from streamlit.runtime import scriptrunner

    drawn = []

    class Slot:
        def info(self, text, icon=None):
            drawn.append(text)

        def empty(self):
            drawn.append(None)

    monkeypatch.setattr(scriptrunner, "get_script_run_ctx", lambda suppress_warning=False: object())
    monkeypatch.setattr(st, "empty", Slot)
    notice = heavy.Notice("Computing the atlas", heavy.Limits(at_once=1, queue=8, seconds=90, in_processes=True))
    notice.waiting(3)  # too soon: nothing is drawn for a short wait
    notice.start -= heavy.SHOW_AFTER_S
    notice.waiting(3)
    notice.waiting(3)
    notice.waiting(1)
    notice.running()
    notice.clear()
    assert drawn[0] == (
        "Computing the atlas: waiting for the server, 3 computations ahead of this one (this server runs 1 at once)."
    )
    assert drawn[1].endswith("1 computation ahead of this one (this server runs 1 at once).")
    assert drawn[2].startswith("Computing the atlas: running, ") and "stops a computation after 90 s" in drawn[2]
    assert drawn[3:] == [None]


def test_two_messages_written_at_once_are_both_read():
    """The pipe is read with os.read: a buffered reader took the second message into its buffer, where
    select() could not see it, and the job then waited for its time bound."""
    read_end, write_end = os.pipe()

    class Proc:
        stdout = os.fdopen(read_end, "rb")  # buffered, as subprocess.PIPE gives it

        def poll(self):
            return None

    os.write(write_end, framed(("progress", 1, 2), ("done", "result")))
    worker = heavy.Worker()
    worker.proc = Proc()
    try:
        deadline = time.monotonic() + 5
        assert worker._next(deadline, tick=lambda: None) == ("progress", 1, 2)
        assert worker._next(deadline, tick=lambda: None) == ("done", "result")
    finally:
        os.close(write_end)
        Proc.stdout.close()


# ---------------------------------------------------------------------------------------------
# A bounded wait, and a lane of its own for reading a visitor's text (issue 31)


def test_the_wait_bound_comes_from_the_environment_and_bad_values_fall_back(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_QUEUE_WAIT_SECONDS", "7.5")
    assert heavy.Limits.from_environment().wait == 7.5
    monkeypatch.setenv("ATTNVIZ_QUEUE_WAIT_SECONDS", "forever")
    assert heavy.Limits.from_environment().wait == 300


def _occupy(gate: heavy.Gate) -> object:
    """A ticket let in and never leaving: a computation that does not end."""
    ticket = gate.join()
    assert gate.wait(ticket, 0.01) == 0
    return ticket


def test_a_queued_job_waits_at_most_the_operator_s_time_then_the_visitor_is_told(pool, bundle):
    pool.setenv("ATTNVIZ_HEAVY_IN", "threads")
    pool.setenv("ATTNVIZ_HEAVY_AT_ONCE", "1")
    pool.setenv("ATTNVIZ_QUEUE_WAIT_SECONDS", "0.3")
    gate = heavy.pool().gate
    running = _occupy(gate)
    outcome = []

    def visitor() -> None:
        start = time.monotonic()
        try:
            heavy.run("attention", "en-de", "cpu", ("twenty-one", None, False), lambda: bundle, "Running the model")
            outcome.append(("it ran: it waited until the other computation ended", 0))
        except heavy.BusyError as e:
            outcome.append((str(e), time.monotonic() - start))

    thread = threading.Thread(target=visitor, daemon=True)
    thread.start()
    thread.join(10)
    gate.leave(running, admitted=True)
    thread.join(10)
    message, waited = outcome[0]
    assert message.startswith("The server is busy: this computation (running the model) waited 0.3 s"), message
    assert "ATTNVIZ_QUEUE_WAIT_SECONDS" in message and "1 still ahead" in message
    assert 0.3 <= waited < 3
    assert gate.load == (0, 0), "the visitor who gave up left the queue"


def test_reading_a_text_never_waits_behind_heavy_work(pool, bundle):
    pool.setenv("ATTNVIZ_HEAVY_IN", "threads")
    pool.setenv("ATTNVIZ_HEAVY_AT_ONCE", "1")
    pool.setenv("ATTNVIZ_QUEUE_WAIT_SECONDS", "2")
    gate = heavy.pool().gate
    running = _occupy(gate)  # a beam search that takes minutes
    text = " ".join(["Thursday, July 2, 1998"] * 20)
    try:
        facts = heavy.run("text_facts", "en-de", "cpu", (text, None), lambda: bundle, lane=heavy.TEXT)
    finally:
        gate.leave(running, admitted=True)
    assert facts.source_tokens == facts.tokens == len(bundle.tokenizer.encode_source(text).ids)
    assert (facts.source_tokens, facts.maps_bytes) == api.maps_size(bundle, text)
    assert facts.out_of_domain == api.out_of_domain(bundle, text) and facts.refused is None
    assert jobs.text_facts(bundle, "   ", None).refused.endswith("empty: type a sentence")
    target = "Donnerstag, 2. Juli 1998"
    with_target = jobs.text_facts(bundle, "twenty-one", target)
    assert with_target.tokens == len(bundle.tokenizer.encode_target(target)[0].ids) > with_target.source_tokens


@pytest.mark.slow
def test_a_long_text_is_read_in_its_lane_and_a_short_one_in_place(pool, fresh_streamlit_caches, monkeypatch):
    """The app reads a long text away from the server's thread (in processes: in a worker), a short one at once."""
    import inspect

    from attnviz.app import cache

    pool.setenv("ATTNVIZ_HEAVY_IN", "threads")
    lanes = []
    real = heavy.run

    def recorded(*args, **kwargs):
        call = inspect.signature(real).bind(*args, **kwargs)
        call.apply_defaults()
        lanes.append((call.arguments["name"], call.arguments["lane"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(heavy, "run", recorded)
    monkeypatch.setattr(cache, "LIGHT_CHARS", 100)  # en-de reads 512 tokens, about 1,000 characters
    assert cache.text_facts("en-de", "cpu", "twenty-one").tokens == 4
    assert lanes == []
    long = " ".join(["Thursday, July 2, 1998"] * 20)  # 459 characters
    assert cache.text_facts("en-de", "cpu", long).tokens > 200
    assert lanes == [("text_facts", heavy.TEXT)]
    cache.is_long("en-de", "cpu", long), cache.is_light("en-de", "cpu", long), cache.maps_bytes("en-de", "cpu", long)
    assert lanes == [("text_facts", heavy.TEXT)], "read once for every question asked of it"


@pytest.mark.slow
def test_a_text_read_in_a_worker_process_comes_back_whole(pool, bundle):
    """What the job returns is a class of attnviz.jobs, which the worker runs as its __main__: it must unpickle here."""
    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")
    text = " ".join(["3:45 PM"] * 30)
    facts = heavy.run("text_facts", "en-de", "cpu", (text, None), no_bundle, lane=heavy.TEXT)
    assert facts == jobs.text_facts(bundle, text, None)


@pytest.mark.slow
@pytest.mark.parametrize("read_in_place", [True, False])
def test_the_out_of_domain_notice_comes_with_the_text_s_facts(pool, fresh_streamlit_caches, monkeypatch, read_in_place):
    from attnviz.app import cache

    pool.setenv("ATTNVIZ_HEAVY_IN", "threads")
    if not read_in_place:
        monkeypatch.setattr(cache, "LIGHT_CHARS", 5)  # read in the text lane
    at = open_app("app.py")
    at.sidebar.text_area(key="src").set_value("Grüße aus Köln").run()
    assert not at.exception and not at.error
    assert any("cannot read" in w.value and "looks outside" in w.value for w in at.warning), at.warning
    at.sidebar.text_area(key="src").set_value("Thursday, July 2, 1998").run()
    assert not at.warning


# ---------------------------------------------------------------------------------------------
# The fork server: workers forked from one process that has imported torch and the API

# A fork server with one job of the test's own besides `attnviz.jobs.JOBS`: what a worker sees of its world.
PROBING_FORK_SERVER = (
    "import os, sys, tempfile\n"
    "from attnviz import jobs\n"
    "jobs.JOBS['probe'] = lambda _: (os.getcwd(), os.environ.get('ATTNVIZ_TEST_PROBE'), tempfile.gettempdir(),"
    " os.getppid())\n"
    "tempfile.gettempdir()\n"  # cached in the fork server, as an import may do: a worker must not keep it
    "sys.argv[1:1] = ['--fork-server']\n"
    "jobs.main()\n"
)


def probe(worker: heavy.Worker) -> tuple:
    return worker.call("probe", None, "cpu", (), 60, None, lambda: None)


@pytest.mark.slow  # 1.5 s or more in the quick tier, on a 2-core Intel Xeon already
def test_a_forked_worker_takes_the_server_s_environment_and_folder_as_they_are_when_it_is_forked(monkeypatch, tmp_path):

    forks = heavy.ForkServer((sys.executable, "-c", PROBING_FORK_SERVER))
    monkeypatch.setattr(heavy, "fork_server", lambda: forks)
    try:
        (tmp_path / "first").mkdir()
        monkeypatch.chdir(tmp_path / "first")
        monkeypatch.setenv("TMPDIR", str(tmp_path))
        monkeypatch.delenv("ATTNVIZ_TEST_PROBE", raising=False)
        first = heavy.Worker()
        # its folder and TMPDIR as this process has them now; a variable unset here is unset there
        assert probe(first) == (str(tmp_path / "first"), None, str(tmp_path), forks.proc.pid)
        (tmp_path / "second").mkdir()
        monkeypatch.chdir(tmp_path / "second")
        monkeypatch.setenv("TMPDIR", str(tmp_path / "second"))
        second = heavy.Worker()
        assert probe(second)[:3] == (str(tmp_path / "second"), None, str(tmp_path / "second"))
        assert probe(first)[:3] == (str(tmp_path / "first"), None, str(tmp_path)), "a worker keeps its own"
        # an ATTNVIZ_ setting reaches a running worker with each job, as it did a fresh interpreter
        monkeypatch.setenv("ATTNVIZ_TEST_PROBE", "now")
        assert probe(first)[1] == "now"
        pids = [first.proc.pid, second.proc.pid]
        first.kill()
        second.kill()
        assert not any(os.path.exists(f"/proc/{pid}") for pid in pids), "killed and reaped by the fork server"
    finally:
        forks.close()
    assert forks.proc.returncode == 0, "its server's end closed: the fork server ended by itself"


@pytest.mark.slow
def test_a_worker_process_imports_torch_already_below_the_server():
    """``python -m attnviz.jobs`` (a fork server or a worker) had lowered its priority after its imports: torch's
    first CPU seconds ran at the server's priority, while a class's first pages were drawn."""
    spy = (
        "import os, runpy, sys\n"
        "class Spy:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            print('niceness at torch', os.nice(0), file=sys.stderr)\n"
        "            sys.meta_path.remove(self)\n"
        "sys.meta_path.insert(0, Spy())\n"
        "runpy.run_module('attnviz.jobs', run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run(  # its replies (pickles) to nobody; no job: it says it is ready and ends
        [sys.executable, "-c", spy],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    assert f"niceness at torch {os.nice(0) + 10}" in done.stderr, done.stderr[-2000:]


# A fork server whose workers have a job that computes for ten minutes, and say so in a file first.
SPINNING_FORK_SERVER = (
    "import os, sys, time\n"
    "from attnviz import jobs\n"
    "def spin(_, marker):\n"
    "    open(marker, 'w').write(str(os.getpid()))\n"
    "    end = time.monotonic() + 600\n"
    "    while time.monotonic() < end:\n"
    "        sum(range(1000))\n"
    "jobs.JOBS['spin'] = spin\n"
    "sys.argv[1:1] = ['--fork-server']\n"
    "jobs.main()\n"
)


@pytest.mark.slow
def test_a_worker_whose_server_dies_mid_job_ends_with_it(tmp_path):
    """A worker had computed on, for as long as its job took, after its server was killed (a replica crashed),
    beside the replica started in its place: it now ends when its server's end of the socket closes."""
    marker = tmp_path / "worker.pid"
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from attnviz.app import heavy\n"
            f"forks = heavy.ForkServer((sys.executable, '-c', {SPINNING_FORK_SERVER!r}))\n"
            "heavy.fork_server = lambda: forks\n"
            f"heavy.Worker().call('spin', None, 'cpu', ({str(marker)!r},), 3600, None, lambda: None)\n",
        ]
    )
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() and marker.read_text()):
            assert time.monotonic() < deadline and server.poll() is None, "the worker never started its job"
            time.sleep(0.05)
        worker = int(marker.read_text())
    finally:
        server.kill()
        server.wait()
    from test_live_training import ended  # gone, or a zombie not yet reaped

    deadline = time.monotonic() + 30
    try:
        while not ended(worker):
            assert time.monotonic() < deadline, "the worker computes on for nobody"
            time.sleep(0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, 9)  # a worker left computing: not past this test


# A fork server whose workers can run a short live training (10 steps of reverse's live recipe) and say
# which modules it imported: what a worker imports during a training is paid from the training's CPU bound.
TRAINING_FORK_SERVER = (
    "import sys\n"
    "from attnviz import jobs\n"
    "from attnviz.app.live_runs import LIVE_RECIPES\n"
    "def imported_by_training(_, out):\n"
    "    before = set(sys.modules)\n"
    "    recipe = {**LIVE_RECIPES['reverse'], 'steps': 10}\n"
    "    done = jobs.live_training(None, 'reverse', out, 60.0, 5, tuple(recipe.items()))\n"
    "    return done['stopped_by'], sorted(set(sys.modules) - before)\n"
    "jobs.JOBS['imported_by_training'] = imported_by_training\n"
    "sys.argv[1:1] = ['--fork-server', '--live-training']\n"
    "jobs.main()\n"
)


@pytest.mark.slow  # a fork server and a training
def test_a_forked_worker_s_live_training_imports_no_more_of_torch(monkeypatch, tmp_path):
    """The fork server has imported what a live training's first steps import (jobs.preload_live_training):
    torch's first optimizer imports torch._dynamo and sympy with it, about 800 modules, which inside a
    worker at nice 10 beside two busy processes took most of an 8 CPU s bound."""

    forks = heavy.ForkServer((sys.executable, "-c", TRAINING_FORK_SERVER))
    monkeypatch.setattr(heavy, "fork_server", lambda: forks)
    worker = heavy.Worker()
    try:
        stopped_by, imported = worker.call(
            "imported_by_training", None, "cpu", (str(tmp_path / "run"),), 120, None, lambda: None
        )
    finally:
        worker.kill()
        forks.close()
    assert stopped_by == "steps"
    # Without the preload, 518 of these among the modules imported; with it, a few small ones remain (pyarrow's
    # datasets, for the first record's Parquet: 8 ms).
    heavy_ones = [m for m in imported if m.split(".")[0] == "sympy" or m.startswith(("torch._dynamo", "torch.fx"))]
    assert not heavy_ones, f"a live training in a forked worker imported {len(heavy_ones)} of them: {heavy_ones[:8]}"
    assert len(imported) < 100, imported


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork servers are Linux's")
@pytest.mark.parametrize(("setting", "preloads"), [(None, True), ("1", True), ("0", False)])
def test_the_fork_server_imports_for_live_trainings_only_where_they_are_allowed(monkeypatch, setting, preloads):
    """ATTNVIZ_LIVE_TRAININGS=0 turns the button off: its servers' fork servers skip torch._dynamo (70 MB)."""
    monkeypatch.setattr(heavy, "ForkServer", lambda command: command)  # the command it would start
    monkeypatch.setattr(heavy, "_FORKS", None)  # this process's own is put back after the test
    if setting is None:
        monkeypatch.delenv("ATTNVIZ_LIVE_TRAININGS", raising=False)
    else:
        monkeypatch.setenv("ATTNVIZ_LIVE_TRAININGS", setting)
    assert heavy.fork_server() == (*heavy.FORK_SERVER, *(("--live-training",) if preloads else ()))


@pytest.mark.slow  # 1.5 s or more in the quick tier, on a 2-core Intel Xeon already
def test_when_the_server_dies_its_fork_server_and_idle_workers_end(tmp_path):
    """A server killed with SIGKILL leaves neither its fork server nor an idle worker behind."""
    import subprocess

    from test_live_training import ended, workers

    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from attnviz.app import heavy\n"
            "worker = heavy.Worker()\n"
            "worker.call('warm', None, 'cpu', (), 120, None, lambda: None)\n"
            "print(heavy.fork_server().proc.pid, worker.proc.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        fork_server, worker = map(int, server.stdout.readline().split())
        assert workers(server.pid) == [worker]
    finally:
        server.kill()
        server.wait()
        server.stdout.close()

    deadline = time.monotonic() + 60
    while not (ended(fork_server) and ended(worker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ended(fork_server) and ended(worker)


@pytest.mark.slow  # 1.5 s or more in the quick tier, on a 2-core Intel Xeon already
def test_a_replaced_worker_starts_without_importing_torch_again(pool):
    """The reason for the fork server: a worker forked from it has torch and the API imported already."""
    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")
    heavy.run("warm", None, "cpu", (), no_bundle)
    (worker,) = heavy.pool()._idle
    worker.kill()  # replaced at the next job, as after a job that overran its time bound
    replaced = heavy.Worker()
    replaced._start()
    try:
        stat = Path(f"/proc/{replaced.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        spent = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        assert spent < 0.5, f"{spent:.2f} CPU s before its first job: importing torch alone takes more"
    finally:
        replaced.kill()


@pytest.mark.slow
def test_a_worker_killed_before_it_read_its_job_is_a_message_and_is_replaced(pool):
    """A forked worker's socket, unlike a pipe, answers a read with a reset (not the end of the stream) when
    the worker died with a message unread: still the message of a lost worker, and the next job runs."""
    import signal

    pool.setenv("ATTNVIZ_HEAVY_IN", "processes")
    heavy.run("warm", "en-de", "cpu", (), no_bundle)
    pid = heavy.pool()._idle[0].proc.pid
    os.kill(pid, signal.SIGSTOP)  # it reads nothing now: the job will wait unread in its socket
    sent, real_send = [], jobs.send

    def send_then_kill(out, message) -> None:
        real_send(out, message)
        if message[0] == "job" and not sent:  # the job is in its socket, unread: the kernel's OOM killer strikes
            sent.append(message[1])
            os.kill(pid, signal.SIGKILL)

    pool.setattr(jobs, "send", send_then_kill)
    with pytest.raises(heavy.BusyError) as caught:
        heavy.run("attention", "en-de", "cpu", ("twenty-one", None, False), no_bundle)
    assert sent == ["attention"]
    assert "stopped unexpectedly" in caught.value.public and "status -9" in str(caught.value)
    assert heavy.run("attention", "en-de", "cpu", ("twenty-one", None, False), no_bundle).cross.ndim == 4


# A fork server that says it is ready and ends: what a server finds when its fork server was stopped with it.
ENDED_FORK_SERVER = (
    "import pickle, socket, sys\nsocket.socket(fileno=int(sys.argv[1])).send(pickle.dumps(('ready',)))\n"
)


def test_a_fork_server_that_has_ended_is_told_apart_from_other_errors():
    """Its end, before it is ready or after, raises heavy.ForkServerError: the warm-up says that in one line
    (above), as it does a worker's end."""
    with pytest.raises(heavy.ForkServerError, match="ended with status 0"):
        heavy.ForkServer((sys.executable, "-c", "pass"))  # it ends before it is ready
    forks = heavy.ForkServer((sys.executable, "-c", ENDED_FORK_SERVER))
    try:
        assert forks.proc.wait(timeout=30) == 0
        with pytest.raises(heavy.ForkServerError, match="the fork server (did not answer|ended with status 0)"):
            forks.fork()
    finally:
        forks.close()


# A forked worker whose server ends with the worker's "ready" unread: the worker's next read is reset.
WORKER_OF_AN_ENDED_SERVER = (
    "import os, select, socket\n"
    "from attnviz import jobs\n"
    "ours, theirs = socket.socketpair()\n"
    "control, _ = socket.socketpair()\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    ours.close()\n"
    "    jobs._forked_worker(control, theirs.fileno(), dict(os.environ), os.getcwd())\n"
    "theirs.close()\n"
    "assert select.select([ours], [], [], 60)[0], 'the worker never said it was ready'\n"
    "ours.close()\n"
    "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
)


@pytest.mark.slow  # a process that imports torch
def test_a_forked_worker_whose_server_has_ended_ends_quietly():
    """A Ctrl-C in the server's terminal once printed a worker's ConnectionResetError there: the server had
    ended with the worker's message unread. The worker now ends with status 0 and says nothing."""
    done = subprocess.run(
        [sys.executable, "-c", WORKER_OF_AN_ENDED_SERVER], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0" and done.stderr == "", (done.stdout, done.stderr)


def test_a_fork_server_whose_server_has_ended_ends_quietly(monkeypatch):
    """A server stopped while its fork server starts, or while a reply is on its way, leaves no traceback:
    the fork server returns (its process then ends), where a BrokenPipeError once reached the terminal."""
    import gc
    import select
    import socket

    monkeypatch.setattr(gc, "freeze", lambda: None)  # the fork server freezes its process: here, the test's
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.close()  # the server ended before its fork server was ready
    try:
        assert jobs.fork_server(theirs) is None
    finally:
        theirs.close()

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    raised = []

    def serve() -> None:
        try:
            jobs.fork_server(theirs)
        except BaseException as e:  # noqa: BLE001 - what the thread raised is the test's finding
            raised.append(e)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert pickle.loads(ours.recv(jobs.PACKET)) == ("ready",)
        ours.send(pickle.dumps(("wait", 2**22 + 1)))  # not a child: answered ("status", None)
        assert select.select([ours], [], [], 30)[0], "no answer"
        # The server ends with the answer unread: the fork server's next read finds the connection reset (a
        # server that ends before the answer is sent breaks the fork server's write instead, as "ready" did above).
        ours.close()
        thread.join(30)
        assert not thread.is_alive() and not raised, raised
    finally:
        theirs.close()


@pytest.mark.slow  # a worker process and two loads
def test_a_worker_reads_a_rewritten_model_folder_again(tmp_path):
    """A worker keeps the models it loaded, by folder and by the folder's version (`checkpoint_stamp`):
    weights rewritten on disk (a training resumed into the folder) are read again, not answered from memory."""
    import shutil

    from safetensors.torch import load_file, save_file

    from attnviz.checkpoints.catalog import checkpoint_stamp, pretrained_dir

    folder = tmp_path / "en-de-training"
    shutil.copytree(pretrained_dir() / "en-de", folder, ignore=shutil.ignore_patterns("history"))
    worker = heavy.Worker()
    try:
        ask = lambda: worker.call("attention", str(folder), "cpu", ("twenty-one", None), 120, None, lambda: None)
        before, stamp = ask().cross, checkpoint_stamp(folder)
        tensors = load_file(folder / "model.safetensors")
        tensors = {name: value * 1.5 if "q_proj.weight" in name else value for name, value in tensors.items()}
        save_file(tensors, folder / "model.safetensors", metadata={"format": "attnviz"})
        assert checkpoint_stamp(folder) != stamp
        after = ask().cross
    finally:
        worker.kill()
    want = api.attention(api.load(str(folder), "cpu"), "twenty-one").cross
    assert not np.allclose(after, before) and np.allclose(after, want, atol=1e-6)


def test_a_folders_version_is_its_checkpoints_files_not_a_trainings_saved_state(tmp_path):
    """A resumed training rewrites train_state.pt at every record: that is not a new model to load again."""
    import shutil

    from attnviz.checkpoints.catalog import checkpoint_stamp, pretrained_dir

    folder = tmp_path / "run"
    shutil.copytree(pretrained_dir() / "reverse", folder, ignore=shutil.ignore_patterns("history"))
    stamp = checkpoint_stamp(folder)
    assert {name for name, *_ in stamp} >= {"config.json", "model.safetensors"}
    (folder / "train_state.pt").write_bytes(b"state")
    assert checkpoint_stamp(folder) == stamp
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")
    assert checkpoint_stamp(folder) != stamp
    assert checkpoint_stamp("reverse") == checkpoint_stamp(pretrained_dir() / "reverse") != ()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_rotary_offset_chart_reads_the_first_words_key_with_or_without_a_start_token(family, tmp_path, monkeypatch):
    """The linearity page's chart: the prompt's last query against its first word's key. Llama's tokenizer starts
    a prompt with <s>, Qwen2's with the first word: the key is the first piece that is not the start token."""
    pytest.importorskip("transformers")
    from lm_models import build

    from attnviz.checkpoints import load_checkpoint
    from attnviz.lessons import rotary

    build(family, tmp_path / family)
    bundle = load_checkpoint(tmp_path / family, "cpu")
    prompt = "the cat sat on the mat"
    tokens = bundle.tokenizer.encode_source(prompt).tokens
    first_word = next(i for i, t in enumerate(tokens) if t != "<s>")
    assert first_word == (1 if family == "llama" else 0)
    seen = []
    real = rotary.score_by_offset
    monkeypatch.setattr(rotary, "score_by_offset", lambda *a: seen.append(a[3:5]) or real(*a))
    jobs._rotary(bundle, prompt, None, 0, 8)
    assert seen == [(len(tokens) - 1, first_word)], tokens
