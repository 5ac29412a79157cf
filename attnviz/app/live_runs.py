"""Live training in class: a small model trained from scratch while a class watches, bounded and shared.

"Train a small model now", on the page "How attention forms", starts a `LiveRun`: the reverse or the
induction task, trained from scratch with a recipe small enough (`LIVE_RECIPES`) that a couple of
CPU minutes show its heads form. It is a heavy job (`attnviz.app.heavy`, job ``live_training`` of
`attnviz.jobs`): it waits in the same queue as every atlas and beam search and runs in a worker
process, never in the server's threads. It is bounded three ways:

- at most ``ATTNVIZ_LIVE_TRAININGS`` (default 1; 0 turns the button off; at most `MAX_TRAININGS`) run
  at once in a server process; a visitor who presses the button while they are taken is told so and
  may watch the one that runs (`Slots`);
- by the worker process's CPU time, ``ATTNVIZ_LIVE_TRAINING_CPU_SECONDS`` (default 120, at most
  `MAX_CPU_SECONDS`), not by wall time: a busy server makes it slower, never longer. It then stops
  and keeps what it recorded;
- by its visitor: the page's fragment calls `LiveRun.beat` every few seconds while the tab shows it.
  A run with no beat for `LEFT_AFTER_S` whose tab has closed (its session no longer connected, as
  `LiveRun.connected` tells), or with no beat for `LEFT_PAGE_S` at all (its visitor went to another
  page), is stopped (its worker killed), its folder deleted and its slot freed. A closed tab runs no
  fragment; Streamlit itself keeps a closed tab's session for two minutes, which is no sign of anyone
  watching. The connection is asked too because a busy server runs a fragment late: under load, beats
  alone stopped a watched run.

The worker writes the history (`attnviz.training.history`) into a temporary folder of its own, never
under ``pretrained/`` and never into a folder a visitor names; the page reads it every few seconds
(`LiveRun.snapshot`, read again only when a record was added). When the run ends its history is
read once into memory, the folder deleted, and the run kept among the last `FINISHED_KEPT` finished
ones, so that its visitor's session holds its id only.

Shared state (the slots and the runs) lives behind `Slots`, with one implementation: this server
process (`LocalSlots`). Replicas behind a load balancer each count their own live trainings.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from attnviz.app import heavy
from attnviz.errors import AttnvizError, InputError
from attnviz.settings import number_setting
from attnviz.training import History, Probe, load_history
from attnviz.training.history import HEADS, HISTORY, LOSSES, MANIFEST, MAPS, RECORDS, SITES

log = logging.getLogger(__name__)

# Small enough that 120 CPU seconds of one core show the heads form (docs/serving.md gives what they
# reach), large enough to look like the shipped models: 2 layers of 4 heads, d_model 64. Fields of
# `attnviz.training.Recipe`, given to `attnviz.training.train` as overrides with ``history_every``.
LIVE_RECIPES: dict[str, dict[str, int | float]] = {
    "reverse": {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256, "steps": 4000, "batch_size": 64,
                "warmup": 400, "spm_sentences": 2000},
    "induction": {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256, "steps": 4000, "batch_size": 64,
                  "warmup": 400},
}  # fmt: skip
HISTORY_EVERY = {"reverse": 50, "induction": 50}  # steps between records
LEFT_AFTER_S = 10.0  # a run whose page has not beaten for this long, and whose tab is closed, has lost its visitor
LEFT_PAGE_S = 120.0  # ... or, its tab still open, that has not beaten for this long (its visitor went to another page)
FINISHED_KEPT = 8  # finished runs kept in memory for their visitors (each a few MB at most)
# The wall-time bound of a run: a safety net, the CPU bound comes first. Generous: the worker runs at a lower
# priority than the server, and on 2 cores busy with other work 15 CPU seconds took over 180 s here.
WALL_FACTOR, WALL_EXTRA_S = 10, 300
QUEUED, RUNNING, DONE, LEFT, FAILED = "queued", "running", "done", "left", "failed"
# The most the operator's settings may ask; more is taken as this, with a warning. A setting that is no finite
# number falls back to its default: infinity had passed, and broke the page's section (int(inf)) and the
# worker's CPU timer (setitimer).
MAX_TRAININGS = 64  # live trainings at once: each is a worker process
MAX_CPU_SECONDS = 3600.0  # a run's CPU time: an hour, a long class


class SlotTaken(AttnvizError):
    """Every live-training slot of this server is taken."""


@dataclasses.dataclass(frozen=True)
class LiveSettings:
    """The operator's settings, from the environment."""

    trainings: int  # ATTNVIZ_LIVE_TRAININGS: live trainings at once per server process (0: none)
    cpu_seconds: float  # ATTNVIZ_LIVE_TRAINING_CPU_SECONDS: the worker's CPU time a run may spend
    # ATTNVIZ_LIVE_LEFT_AFTER_SECONDS: the silence after which a run whose tab has closed is stopped (1 to LEFT_PAGE_S)
    left_after: float = LEFT_AFTER_S

    @classmethod
    def from_environment(cls) -> LiveSettings:
        return cls(
            trainings=number_setting("ATTNVIZ_LIVE_TRAININGS", 1, 0, MAX_TRAININGS, whole=True),
            cpu_seconds=number_setting("ATTNVIZ_LIVE_TRAINING_CPU_SECONDS", 120, 1, MAX_CPU_SECONDS),
            left_after=number_setting("ATTNVIZ_LIVE_LEFT_AFTER_SECONDS", LEFT_AFTER_S, 1, LEFT_PAGE_S),
        )


class Slots(Protocol):
    """Where the live trainings of a server are counted and found: the one interface pages go through."""

    def take(self, run: LiveRun, limit: int) -> bool:
        """Hold a slot for ``run``: False when ``limit`` runs hold one already."""

    def release(self, run: LiveRun) -> None:
        """Free ``run``'s slot and keep it among the finished runs."""

    def running(self) -> list[LiveRun]:
        """The runs holding a slot, oldest first."""

    def find(self, run_id: str) -> LiveRun | None:
        """The run of that id, running or among the last finished; None when it is gone."""


class LocalSlots:
    """`Slots` in this server process: every session of the process sees the same runs."""

    def __init__(self, kept: int = FINISHED_KEPT):
        self._lock = threading.Lock()
        self._running: dict[str, LiveRun] = {}
        self._finished: collections.OrderedDict[str, LiveRun] = collections.OrderedDict()
        self._kept = kept

    def take(self, run: LiveRun, limit: int) -> bool:
        with self._lock:
            if len(self._running) >= limit:
                return False
            self._running[run.id] = run
            return True

    def release(self, run: LiveRun) -> None:
        with self._lock:
            self._running.pop(run.id, None)
            self._finished[run.id] = run
            while len(self._finished) > self._kept:
                self._finished.popitem(last=False)

    def running(self) -> list[LiveRun]:
        with self._lock:
            return list(self._running.values())

    def find(self, run_id: str) -> LiveRun | None:
        with self._lock:
            return self._running.get(run_id) or self._finished.get(run_id)


_SLOTS: Slots = LocalSlots()


def slots() -> Slots:
    """This server's slots."""
    return _SLOTS


def reset(new: Slots | None = None) -> None:
    """Stop every running live training and start again with ``new`` slots (default: empty ones). For tests."""
    global _SLOTS
    for run in _SLOTS.running():
        run.stop("the server's live trainings were reset")
        run.join(30)
    _SLOTS = new if new is not None else LocalSlots()


class GrowingHistory:
    """A history that a running training writes, read record by record: each record once.

    `load_history` reads every record again on each call (about 10 ms a record here): for a page
    that redraws every few seconds while records arrive, that grows to most of a server's time. The
    worker that writes this folder was started by this server and the folder is its own, so the
    records are read without `load_history`'s checks; the finished history is read with them.
    """

    def __init__(self, out: Path):
        self.folder = out / HISTORY
        self.manifest: dict | None = None
        self.records: dict[str, tuple[pd.DataFrame, pd.DataFrame, dict[str, np.ndarray]]] = {}

    def names(self) -> list[str]:
        """The records written so far, by step (a record's folder appears whole, renamed into place)."""
        try:
            return sorted((n for n in os.listdir(self.folder / RECORDS) if n.isdigit()), key=int)
        except OSError:
            return []

    def read(self) -> History | None:
        """The history so far, with the records added since the last call read; None before the first record."""
        names = self.names()
        if not names:
            return None
        if self.manifest is None:
            self.manifest = json.loads((self.folder / MANIFEST).read_text(encoding="utf-8"))
        for name in names:
            if name not in self.records:
                record = self.folder / RECORDS / name
                with np.load(record / MAPS, allow_pickle=False) as maps:
                    arrays = {key: maps[key] for key in maps.files}
                self.records[name] = (pd.read_parquet(record / LOSSES), pd.read_parquet(record / HEADS), arrays)
        rows = [self.records[name] for name in names]
        losses = pd.concat([r[0] for r in rows], ignore_index=True)
        kind = self.manifest["kind"]
        probes = [
            Probe(
                text=probe["text"],
                target=probe["target"],
                src_tokens=probe["src_tokens"],
                tgt_tokens=probe["tgt_tokens"],
                maps={site: np.stack([r[2][f"p{p}_{site}"] for r in rows]) for site in SITES[kind]},
            )
            for p, probe in enumerate(self.manifest["probes"])
        ]
        return History(
            folder=self.folder,
            kind=kind,
            task=self.manifest["task"],
            step=losses["step"].to_numpy(np.int64),
            train_loss=losses["train_loss"].to_numpy(np.float64),
            heldout_loss=losses["heldout_loss"].to_numpy(np.float64),
            lr=losses["lr"].to_numpy(np.float64),
            heads=pd.concat([r[1] for r in rows], ignore_index=True),
            probes=probes,
            manifest=self.manifest,
        )


class _Left(Exception):
    """The run's visitor has gone: no beat for `LiveSettings.left_after` seconds."""


class _Stopped(Exception):
    """The run's visitor pressed Stop."""


class LiveRun:
    """One live training: its worker job, run from a thread of the server; its temporary folder; its result."""

    def __init__(self, task: str, settings: LiveSettings):
        if task not in LIVE_RECIPES:
            raise InputError(f"a live training trains {' or '.join(LIVE_RECIPES)}, not {task!r}")
        self.id = uuid.uuid4().hex[:16]
        self.task, self.settings = task, settings
        self.folder = Path(tempfile.mkdtemp(prefix="attnviz-live-"))  # the system's temporary folder: TMPDIR
        self.out = self.folder  # the training's --out, all of it the run's: its history goes to out/history
        self.state = QUEUED
        self.message = ""
        self.cpu_seconds: float | None = None  # the worker's CPU time, once finished
        self.stopped_by: str | None = None  # "cpu" (its bound), "steps" (its recipe's end), or what else stopped it
        self.started = time.monotonic()
        self.result: History | None = None
        self._beat = time.monotonic()
        self._stop: str | None = None
        self.connected: Callable[[], bool] | None = None  # whether its visitor's tab is connected; None: not known
        self._read_lock = threading.Lock()
        self._reader = GrowingHistory(self.out)
        self._seen = 0  # records in the snapshot
        self._snapshot: History | None = None
        self._thread = threading.Thread(target=self._run, name=f"attnviz-live-{self.id}", daemon=True)
        self._slots: Slots | None = None  # where it holds its slot, once started

    @property
    def finished(self) -> bool:
        return self.state in (DONE, LEFT, FAILED)

    def beat(self) -> None:
        """Its visitor is still there (the page's fragment calls this every few seconds)."""
        self._beat = time.monotonic()

    def stop(self, why: str = "stopped by its visitor") -> None:
        """Stop the training at once; what it recorded so far is kept."""
        self._stop = why

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the run's thread to end: True once it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _tick(self) -> None:
        """Called by `heavy.run` every `heavy.POLL_S` while the job waits and runs: what it raises stops the job."""
        if self._stop is not None:
            raise _Stopped(self._stop)
        quiet = time.monotonic() - self._beat
        if quiet > self.settings.left_after and (self.connected is None or quiet > LEFT_PAGE_S or not self.connected()):
            raise _Left
        if self.state == QUEUED and self._reader.names():
            self.state = RUNNING

    def _run(self) -> None:
        keep, message = True, ""
        args = (
            self.task,
            str(self.out),
            float(self.settings.cpu_seconds),
            HISTORY_EVERY[self.task],
            tuple(LIVE_RECIPES[self.task].items()),
        )
        try:
            outcome = heavy.run(
                "live_training",
                None,
                "cpu",
                args,
                bundle=lambda: None,
                what="A live training",
                seconds=self.settings.cpu_seconds * WALL_FACTOR + WALL_EXTRA_S,
                tick=self._tick,
                in_worker=True,
            )
            self.cpu_seconds, self.stopped_by = outcome["cpu_seconds"], outcome["stopped_by"]
        except _Left:
            keep, self.stopped_by = False, "left"
        except _Stopped as e:
            self.stopped_by, message = "visitor", str(e)
        except heavy.BusyError as e:  # the queue was full, the wait or the wall-time bound passed, the worker died
            self.stopped_by, message = "server", str(e)
            if "was stopped after" in message:  # heavy's own words name ATTNVIZ_HEAVY_SECONDS, which is not the bound
                wall = self.settings.cpu_seconds * WALL_FACTOR + WALL_EXTRA_S
                message = f"The server was too busy: it stopped the live training after {wall:g} s of wall time."
        except Exception as e:  # noqa: BLE001 - the visitor reads what went wrong; the server's log has the rest
            log.exception("a live training of %s failed", self.task)
            self.stopped_by, message = "error", f"The live training failed: {type(e).__name__}: {e}"
        finally:
            self._finish(keep, message)

    def _finish(self, keep: bool, message: str) -> None:
        result = None
        if keep:
            try:
                result = load_history(self.out)
            except (InputError, OSError):
                result = None  # nothing recorded yet
        self.result = result
        self.message = message
        if keep and result is None and not message:
            self.message = "The live training stopped before it recorded anything."
        self.state = LEFT if not keep else (DONE if result is not None else FAILED)  # watchers read the result now
        shutil.rmtree(self.folder, ignore_errors=True)
        if self._slots is not None:
            self._slots.release(self)

    def snapshot(self) -> History | None:
        """The history so far (`GrowingHistory`), the result once finished; None before the first record. Many
        sessions may call it at once: one reads the new records while the others get the last snapshot."""
        if self.finished:
            return self.result
        if not self._read_lock.acquire(blocking=False):
            return self._snapshot
        try:
            if len(self._reader.names()) > self._seen:
                try:
                    self._snapshot = self._reader.read() or self._snapshot
                    self._seen = len(self._snapshot.step) if self._snapshot is not None else 0
                except (OSError, ValueError, KeyError):  # the folder went away as the run ended: its result comes next
                    pass
            return self._snapshot
        finally:
            self._read_lock.release()


def start(task: str, settings: LiveSettings | None = None, connected: Callable[[], bool] | None = None) -> LiveRun:
    """A new live training of ``task``, started: `SlotTaken` when every slot is held, InputError for another task.

    ``connected()`` tells whether its visitor's tab is still connected (`LiveRun.connected`).
    """
    settings = settings or LiveSettings.from_environment()
    if settings.trainings < 1:
        raise SlotTaken("Live training is turned off on this server (ATTNVIZ_LIVE_TRAININGS=0).")
    run, where = LiveRun(task, settings), slots()
    if not where.take(run, settings.trainings):
        shutil.rmtree(run.folder, ignore_errors=True)
        raise SlotTaken(
            "A class model is training on this server already: watch it below, or try again when it has finished "
            f"(at most {settings.trainings} live training{'s' if settings.trainings != 1 else ''} at once, "
            "ATTNVIZ_LIVE_TRAININGS)."
        )
    run._slots, run.connected = where, connected
    run._thread.start()
    return run
