"""Heavy work, admitted in order, a few at a time, each bounded in time: the server stays responsive.

Eight atlases or beam searches at once made every visitor's page wait for all of them (the health
check took 15-39 s), because Python work from many script threads shares one GIL and two cores.
Every computation that can take seconds (a long input, beam search, an atlas, attributions,
ablations, head importance) goes through `run`:

- it waits in one first-come queue (its place is shown to the visitor), and at most
  ``ATTNVIZ_HEAVY_AT_ONCE`` run at once; a full queue (``ATTNVIZ_HEAVY_QUEUE`` waiting) is a
  clear "busy" message, not a longer wait;
- it runs in a worker process (`attnviz.jobs`; on Linux forked from the server's fork server,
  `ForkServer`, so that a worker replaced after a job overran starts in a fraction of a second),
  at a lower CPU priority than the server, so a cached page or the health check never waits for
  it; ``ATTNVIZ_HEAVY_IN=threads`` runs it in the visitor's own thread instead (same queue, no time
  bound), which the class benchmark compares;
- it is stopped after ``ATTNVIZ_HEAVY_SECONDS``, its worker killed and replaced, with a message
  that says so; and it waits in the queue at most ``ATTNVIZ_QUEUE_WAIT_SECONDS``, after which the
  visitor is told to come back.

Reading a long text (its tokens, the size of its maps, whether it looks outside the model's domain)
goes through a lane of its own (`TEXT`): one at a time in a worker process, never behind a heavy
job, so that a burst of long prompts neither holds the server's thread nor waits for a beam search.

``benchmarks/bench_class.py --heavy`` measures the server under 16 heavy sessions and 30 light ones.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from attnviz import jobs
from attnviz.errors import AttnvizError
from attnviz.settings import number_setting

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often a waiting visitor's notice and the time bound are looked at
HEAVY, TEXT = "heavy", "text"  # the lanes: heavy work, and reading a visitor's text (its own gate)
TEXT_AT_ONCE = 1  # texts read at once (tokenizing takes milliseconds: one worker keeps up with a class)
TEXT_QUEUE = 4  # the text lane lets four times ATTNVIZ_HEAVY_QUEUE wait: a burst of 80 prompts is not refused
SHOW_AFTER_S = 0.5  # a computation shorter than this shows no notice at all


class BusyError(AttnvizError):
    """The server's queue for heavy work is full, a computation passed its time bound, or its worker died."""


LOST = (
    "The computation stopped unexpectedly on the server (it may have run out of memory). "
    "Try a shorter text or fewer sentences."
)


MOST_AT_ONCE = 1024  # ATTNVIZ_HEAVY_AT_ONCE's bound: each is a worker process (a thread with ATTNVIZ_HEAVY_IN=threads)
MOST_WAITING = 100_000
A_DAY = 86_400.0  # the most any of the waits and bounds may be, in seconds


@dataclasses.dataclass(frozen=True)
class Limits:
    """The operator's bounds, from the environment (read when the first heavy job arrives)."""

    at_once: int  # ATTNVIZ_HEAVY_AT_ONCE: computations running at once (default: one core left free)
    queue: int  # ATTNVIZ_HEAVY_QUEUE: computations waiting, beyond which a visitor is told to come back
    seconds: float  # ATTNVIZ_HEAVY_SECONDS: a computation is stopped after this long
    in_processes: bool  # ATTNVIZ_HEAVY_IN: "processes" (default) or "threads"
    wait: float = 300  # ATTNVIZ_QUEUE_WAIT_SECONDS: a computation waits this long at most, then the visitor is told
    warm: bool = True  # ATTNVIZ_HEAVY_WARM: start the worker processes with the first model ("0": at the first job)

    @classmethod
    def from_environment(cls) -> Limits:
        return cls(
            at_once=number_setting("ATTNVIZ_HEAVY_AT_ONCE", max(1, (os.cpu_count() or 2) - 1), 1, MOST_AT_ONCE, True),
            queue=number_setting("ATTNVIZ_HEAVY_QUEUE", 64, 1, MOST_WAITING, whole=True),
            seconds=number_setting("ATTNVIZ_HEAVY_SECONDS", 120, 0.01, A_DAY),
            in_processes=os.environ.get("ATTNVIZ_HEAVY_IN", "processes").strip().lower() != "threads",
            wait=number_setting("ATTNVIZ_QUEUE_WAIT_SECONDS", 300, 0.01, A_DAY),
            warm=os.environ.get("ATTNVIZ_HEAVY_WARM", "1").strip() != "0",
        )


class Gate:
    """First come, first served: at most ``at_once`` inside, at most ``queue`` waiting."""

    def __init__(self, at_once: int, queue: int):
        self.at_once, self.queue = at_once, queue
        self._waiting: collections.deque[object] = collections.deque()
        self._inside = 0
        self._cond = threading.Condition()

    def join(self) -> object:
        """A ticket in the queue; `BusyError` when the queue is full."""
        with self._cond:
            if len(self._waiting) >= self.queue:
                raise BusyError(
                    f"The server is busy: {len(self._waiting)} long computations are already waiting. "
                    "Try again in a minute."
                )
            ticket = object()
            self._waiting.append(ticket)
            return ticket

    def wait(self, ticket: object, timeout: float) -> int:
        """0 once ``ticket`` is let in; else, after ``timeout`` s, how many are ahead of it."""
        with self._cond:
            deadline = time.monotonic() + timeout
            while not (self._waiting[0] is ticket and self._inside < self.at_once):
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._waiting.index(ticket) + self._inside
                self._cond.wait(left)
            self._waiting.popleft()
            self._inside += 1
            self._cond.notify_all()
            return 0

    def leave(self, ticket: object, admitted: bool) -> None:
        with self._cond:
            if admitted:
                self._inside -= 1
            else:
                self._waiting.remove(ticket)
            self._cond.notify_all()

    @property
    def load(self) -> tuple[int, int]:
        """(running, waiting) now."""
        with self._cond:
            return self._inside, len(self._waiting)


START_S = 120  # seconds a worker, or the fork server, may take to say it is ready


# The fork server's command; ``--live-training`` after it: it imports what a live training needs, once.
FORK_SERVER = (sys.executable, "-m", "attnviz.jobs", "--fork-server")


class ForkServerError(RuntimeError):
    """The fork server did not answer in time, or has ended (killed, or stopped with the server)."""


class ForkServer:
    """One ``python -m attnviz.jobs --fork-server FD`` (`attnviz.jobs.fork_server`): it forks this process's
    workers. Its requests and replies are one packet each on a SOCK_SEQPACKET pair, one at a time."""

    def __init__(self, command: tuple[str, ...] = FORK_SERVER):
        """``command``: what to start, its socket's descriptor appended (a test starts one with jobs of its own)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [*command, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self._control = ours
        self._control.settimeout(START_S)
        self._lock = threading.Lock()
        try:
            if self._ask(None) != ("ready",):
                raise ForkServerError("the fork server did not start")
        except BaseException:
            self.proc.kill()
            self.close()
            raise

    def _ask(self, request: tuple | None, fd: int | None = None) -> tuple:
        """Send ``request`` (with ``fd`` attached) and return the reply; only the reply when ``request`` is None."""
        with self._lock:
            try:
                if request is not None:
                    socket.send_fds(self._control, [pickle.dumps(request)], [] if fd is None else [fd])
                data = self._control.recv(jobs.PACKET)
            except OSError as e:  # a timeout, or the fork server gone
                raise ForkServerError(f"the fork server did not answer: {e}") from None
        if not data:
            raise ForkServerError(f"the fork server ended with status {self.proc.wait()}")
        return pickle.loads(data)

    def fork(self) -> Forked:
        """A new worker, serving jobs on the end of a socket pair that this process keeps."""
        ours, theirs = socket.socketpair()
        try:
            reply = self._ask(("fork", dict(os.environ), os.getcwd()), theirs.fileno())
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return Forked(self, reply[1], ours)

    def wait(self, pid: int) -> int | str:
        """Reap worker ``pid``, ended or killed: its status as Popen gives it ("unknown" when it cannot say)."""
        try:
            status = self._ask(("wait", pid))[1]
        except RuntimeError:
            return "unknown"
        return "unknown" if status is None else status

    def close(self) -> None:
        """Close its end: the fork server ends (its workers, each on its own socket, go on)."""
        self._control.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


class Forked:
    """A worker that a `ForkServer` forked, with what `Worker` uses of a `subprocess.Popen`: ``pid``,
    ``stdin`` and ``stdout`` (here one socket), ``poll``, ``kill``, ``wait`` and ``returncode``."""

    def __init__(self, forks: ForkServer, pid: int, conn: socket.socket):
        self.pid, self.returncode = pid, None
        self._forks, self._conn = forks, conn
        self.stdin, self.stdout = conn.makefile("wb"), conn

    def poll(self) -> int | str | None:
        """None while it runs; once its end of the socket has closed, its status (then it is reaped)."""
        if self.returncode is None:
            ready, _, _ = select.select([self._conn], [], [], 0)
            try:
                ended = ready and not self._conn.recv(1, socket.MSG_PEEK)
            except ConnectionResetError:  # it ended with a message of ours unread
                ended = True
            if ended:
                self.wait()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int | str:
        if self.returncode is None:
            self.returncode = self._forks.wait(self.pid)
            with contextlib.suppress(OSError):
                self.stdin.close()
            self._conn.close()
        return self.returncode


_FORKS: ForkServer | None = None
_FORKS_LOCK = threading.Lock()


def fork_server() -> ForkServer | None:
    """This process's fork server, started on first use and again if it has ended; None off Linux, where
    each worker is a fresh ``python -m attnviz.jobs``."""
    global _FORKS
    if not sys.platform.startswith("linux"):
        return None
    with _FORKS_LOCK:
        if _FORKS is None or _FORKS.proc.poll() is not None:
            if _FORKS is not None:
                _FORKS.close()
            from attnviz.app.live_runs import LiveSettings  # it runs on this module's workers

            live = ("--live-training",) if LiveSettings.from_environment().trainings > 0 else ()
            _FORKS = ForkServer((*FORK_SERVER, *live))
        return _FORKS


class Worker:
    """One worker process (`attnviz.jobs.serve`), started on first use, killed when a job overruns."""

    def __init__(self):
        self.proc: subprocess.Popen | Forked | None = None

    def _start(self) -> None:
        forks = fork_server()
        if forks is not None:
            self.proc = forks.fork()
        else:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "attnviz.jobs"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
        if self._next(deadline=time.monotonic() + START_S, tick=lambda: None) != ("ready",):
            raise RuntimeError("a worker process did not start")

    def _next(self, deadline: float, tick: Callable[[], None]) -> Any:
        """The worker's next message; ``tick()`` every POLL_S while none has come."""
        fd = self.proc.stdout.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:  # checked before every message: an atlas's progress must not keep it alive
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], min(POLL_S, left))
            if ready:  # read the pipe itself: a buffered reader could take the next message into its buffer,
                # where select() cannot see it
                try:
                    message = jobs.receive(lambda n: os.read(fd, n))
                except ConnectionResetError:  # a forked worker that ended with a message of ours unread
                    message = None
                if message is None:
                    status = self.proc.wait()
                    self.kill()
                    raise BusyError(f"a worker process ended with status {status} during a job", LOST)
                return message
            if self.proc.poll() is not None:
                status = self.proc.returncode
                self.kill()
                raise BusyError(f"a worker process ended with status {status} during a job", LOST)
            tick()

    def call(
        self,
        name: str,
        model: str,
        device: str,
        args: tuple,
        seconds: float,
        progress: Callable[[int, int], None] | None,
        tick: Callable[[], None],
    ) -> Any:
        settings = {k: v for k, v in os.environ.items() if k.startswith("ATTNVIZ_")}
        try:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            jobs.send(self.proc.stdin, ("job", name, model, device, args, settings))
            deadline = time.monotonic() + seconds
            while (message := self._next(deadline, tick))[0] == "progress":
                if progress is not None:
                    progress(*message[1:])  # a page's progress bar: a stopped script raises here
        except BaseException:
            self.kill()  # it hung starting, overran, died, or the visitor left: a fresh worker takes the next job
            raise
        if message[0] == "error":  # the job's own error, such as a text too long: the worker is fine
            raise message[1]
        return message[1]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class Pool:
    """The lanes' gates and the idle workers (the gates keep at most ``at_once`` + `TEXT_AT_ONCE` busy)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.gate = Gate(limits.at_once, limits.queue)
        self.gates = {HEAVY: self.gate, TEXT: Gate(TEXT_AT_ONCE, TEXT_QUEUE * limits.queue)}
        self._idle: list[Worker] = []
        self._lock = threading.Lock()

    def take(self) -> Worker:
        with self._lock:
            return self._idle.pop() if self._idle else Worker()

    def give_back(self, worker: Worker) -> None:
        with self._lock:
            if len(self._idle) < self.limits.at_once + TEXT_AT_ONCE:
                self._idle.append(worker)
                return
        worker.kill()

    def warm(self, model: str, device: str) -> None:
        """Start the workers and load ``model`` in each, in the background, before the first heavy job.

        Each costs a process start and a model load (about 1.4 CPU s); with ``ATTNVIZ_HEAVY_WARM=0`` the
        first heavy job starts its worker instead (a server that seldom computes, a test suite).
        """

        def start() -> None:
            # every worker taken before any is given back: taken one by one, each had been the one just warmed
            for worker in [self.take() for _ in range(self.limits.at_once)]:
                try:
                    worker.call("warm", model, device, (), 120, None, lambda: None)
                except BusyError as e:  # it ended (the server stopping kills it): said in one line, no traceback
                    log.warning("a worker process ended while it loaded %s: %s", model, e)
                    worker.kill()
                except ForkServerError as e:  # the same, before it was forked: the stop reached the fork server first
                    log.warning("a worker process could not be started to load %s: %s", model, e)
                    worker.kill()
                except Exception:  # noqa: BLE001 - a worker that fails to start is started again by a job
                    log.warning("a worker process could not load %s", model, exc_info=True)
                    worker.kill()
                self.give_back(worker)

        if self.limits.in_processes and self.limits.warm:
            threading.Thread(target=start, name="attnviz-warm-workers", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            for worker in self._idle:
                worker.kill()
            self._idle.clear()


_POOL: Pool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> Pool:
    """The process's pool, made with the environment's limits on first use."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = Pool(Limits.from_environment())
        return _POOL


def reset() -> None:
    """Forget the pool (its idle workers are stopped): the next job reads the limits again. For tests."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.close()
        _POOL = None


class Notice:
    """What a waiting visitor sees: the place in the queue, then the time so far. Nothing outside a page."""

    def __init__(self, what: str, limits: Limits):
        self.what, self.limits = what, limits
        self.start = time.monotonic()
        self._slot = None
        self._shown = ""

    def _show(self, text: str) -> None:
        if time.monotonic() - self.start < SHOW_AFTER_S:
            return
        from streamlit.runtime.scriptrunner import get_script_run_ctx

        if get_script_run_ctx(suppress_warning=True) is None:
            return
        import streamlit as st

        if self._slot is None:
            self._slot = st.empty()
        if text != self._shown:  # redrawn when it changes (a stopped script raises here, and its job ends)
            self._slot.info(text, icon=":material/hourglass_top:")
            self._shown = text

    def waiting(self, ahead: int) -> None:
        self._show(
            f"{self.what}: waiting for the server, {ahead} computation{'s' if ahead != 1 else ''} ahead of this one "
            f"(this server runs {self.limits.at_once} at once)."
        )

    def running(self) -> None:
        seconds = time.monotonic() - self.start
        bound = f"; this server stops a computation after {self.limits.seconds:g} s" if self.limits.in_processes else ""
        self._show(f"{self.what}: running, {seconds:.0f} s so far{bound}.")

    def clear(self) -> None:
        if self._slot is not None:
            self._slot.empty()


def run(
    name: str,
    model: str,
    device: str,
    args: tuple,
    bundle: Callable[[], Any],
    what: str = "Computing",
    progress: Callable[[int, int], None] | None = None,
    lane: str = HEAVY,
    *,
    seconds: float | None = None,
    tick: Callable[[], None] | None = None,
    in_worker: bool = False,
) -> Any:
    """Job ``name`` (`attnviz.jobs.JOBS`) on ``model`` with ``args``: queued in ``lane``, bounded, shown waiting.

    ``bundle()`` gives the server's own loaded model, used when the work runs in threads. Raises
    `BusyError` when the queue is full, the wait or the time bound is passed. ``seconds`` replaces
    ``ATTNVIZ_HEAVY_SECONDS`` for this job; ``tick()`` is called every `POLL_S` while it waits and runs
    (what it raises stops the job and kills its worker); ``in_worker`` runs it in a worker process even
    with ``ATTNVIZ_HEAVY_IN=threads`` (a live training is bounded by its process's CPU time).
    """
    current = pool()
    limits, gate = current.limits, current.gates[lane]
    if seconds is not None:
        limits = dataclasses.replace(limits, seconds=seconds)
    notice = Notice(what, dataclasses.replace(limits, at_once=gate.at_once))

    def running() -> None:
        notice.running()
        if tick is not None:
            tick()

    ticket = gate.join()
    admitted = False
    try:
        while ahead := gate.wait(ticket, min(POLL_S, max(0.0, notice.start + limits.wait - time.monotonic()))):
            if time.monotonic() - notice.start >= limits.wait:
                raise BusyError(
                    f"The server is busy: this computation ({what[:1].lower()}{what[1:]}) waited {limits.wait:g} s "
                    "in the queue, the longest this server lets one wait (ATTNVIZ_QUEUE_WAIT_SECONDS), with "
                    f"{ahead} still ahead of it. Try again in a few minutes."
                )
            notice.waiting(ahead)
            if tick is not None:
                tick()
        admitted = True
        if not (limits.in_processes or in_worker):
            notice.running()
            return jobs.run_job(bundle(), name, args, progress)
        worker = current.take()
        try:
            result = worker.call(name, model, device, args, limits.seconds, progress, running)
        except TimeoutError:
            raise BusyError(
                f"{what} was stopped after {limits.seconds:g} s, the longest this server lets one computation run "
                "(ATTNVIZ_HEAVY_SECONDS). Try a shorter text or fewer sentences."
            ) from None
        finally:
            current.give_back(worker)
        return result
    finally:
        gate.leave(ticket, admitted)
        notice.clear()
