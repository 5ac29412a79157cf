"""A real Ray cluster of separate nodes on 127.0.0.1, started with Ray's own ``ray start`` and stopped by
process id (never ``ray stop``, which would stop every Ray on the machine).

Used by tests/test_atlas_ray.py and benchmarks/bench_atlas.py --cluster. Facts it relies on (Ray 2.60):
``ray start`` turns token authentication on unless ``RAY_AUTH_MODE=disabled``; the single-machine switch
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` must be unset for a second node to join; the head's and each
node's processes are daemons that outlive ``ray start``, so each node's are found as the processes
that appeared while it started, and their children (agents, workers, actors) by parent id.

On a loaded machine (CI, or many jobs on few cores) a node can take long to start. At a load of 27
on 2 cores we saw the raylet abort after about 15 s waiting for its agent (a Python process) to
write its port, and ``ray start`` give up after its own 30 s (fixed in Ray's code) waiting for the
node to register. So: the agents get fixed free ports (the raylet then waits for one port file
instead of three; that wait is not configurable), the agents' registration and Ray's requests to its
control store longer deadlines; a ``ray start`` that gives up while its raylet lives on is waited
for until the raylet's log says the node registered; and a start that fails for good is stopped
(its processes, by id) and tried again, up to `START_TRIES` times, the head on a fresh port. On a
machine that loaded all three tries can still fail; with cores to spare a node starts in seconds.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
START_TIMEOUT = 300  # seconds for one `ray start`: about 5 s on an idle machine, minutes at a load of 30 on 2 cores
START_TRIES = 3
REGISTERED = "Finished registering node info, status = OK"  # what a raylet logs once its node has joined

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_env(address: str | None = None) -> dict[str, str]:
    """The environment for ``ray start`` and for a driver: no token, several nodes allowed, ``RAY_ADDRESS``."""
    env = {k: v for k, v in os.environ.items() if k != LOCAL_ONLY}
    env["RAY_AUTH_MODE"] = "disabled"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.setdefault("RAY_gcs_server_request_timeout_seconds", "180")  # default 60: too short on a loaded machine
    env.setdefault("RAY_agent_register_timeout_ms", str(START_TIMEOUT * 1000))
    # A killed raylet is found dead after 5 failed health checks: one a second, not every 3 s (Ray 2.60's
    # default). A check that gets no answer still waits its 10 s, so a live node slowed by load is not lost.
    env.setdefault("RAY_health_check_period_ms", "1000")
    if address:
        env["RAY_ADDRESS"] = address
    return env


def _processes() -> dict[int, tuple[int, str]]:
    """Every live process (zombies left out): pid -> (parent pid, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
        if state != "Z":
            found[int(entry.name)] = (int(parent), cmd)
    return found


def _with_descendants(roots: set[int]) -> set[int]:
    procs, found = _processes(), set(roots)
    while True:
        more = {pid for pid, (parent, _) in procs.items() if parent in found} - found
        if not more:
            return found
        found |= more


def _end(pids, timeout: float) -> set[int]:
    """SIGTERM to every process ``pids()`` names, then SIGKILL to those left after ``timeout`` s; those left then."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
        for pid in pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not pids():
            return set()
    return pids()


class RayCluster:
    """Nodes of ``cpus`` CPUs each started on 127.0.0.1 with ``temp_dir`` as Ray's folder; `stop` ends
    every process they started by id. Use as a context manager: stopped even when the body fails."""

    def __init__(self, temp_dir: Path):
        self.temp_dir = Path(temp_dir)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[set[int]] = []  # per node, the pids of its own processes
        self.known: set[int] = set()  # every pid seen: a child whose parent died is reparented, not forgotten

    def _ray(self, *args: str) -> None:
        ray = Path(sys.executable).with_name("ray")
        # The agents' ports given, not left for the agents to choose and write to a file that the raylet
        # waits for (15 s at most, fixed in Ray 2.60's raylet: too short for a Python agent on a loaded machine).
        ports = (
            "--dashboard-agent-grpc-port",
            "--dashboard-agent-listen-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        )
        ports = [flag_or_port for flag in ports for flag_or_port in (flag, str(free_port()))]
        result = subprocess.run(
            [str(ray), "start", *args, *ports, "--node-ip-address", "127.0.0.1", "--temp-dir", str(self.temp_dir)],
            env=cluster_env(),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"ray start failed ({result.returncode}): {result.stderr[-2000:]}")

    def _registered(self) -> int:
        """How many times the raylets of this cluster's folder have logged that their node joined."""
        logs = {path.resolve() for path in self.temp_dir.glob("session_*/logs/raylet*.out")}
        return sum(path.read_text(errors="replace").count(REGISTERED) for path in logs)

    def _joined_late(self, mine: set[int], registered: int) -> bool:
        """Whether a node whose ``ray start`` gave up (processes ``mine``) joins all the same: its raylet
        alive and, within `START_TIMEOUT`, logging that it registered."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            procs = _processes()
            if not any(pid in procs and procs[pid][1].split(" ", 1)[0].endswith("raylet") for pid in mine):
                return False
            if self._registered() > registered:
                return True
            time.sleep(1)
        return False

    def add_node(self, cpus: int = 1) -> set[int]:
        """Start the head (first call) or one more node, trying again on failure; the pids of that node's
        processes. RuntimeError after `START_TRIES` failed starts (each one's processes stopped)."""
        head = not self.nodes
        for attempt in range(1, START_TRIES + 1):
            before, registered = set(_processes()), self._registered()
            try:
                if head:
                    self._ray("--head", "--port", str(self.port), "--num-cpus", str(cpus), "--include-dashboard=false")
                else:
                    self._ray("--address", self.address, "--num-cpus", str(cpus))
                failure = None
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failure = e
            except BaseException:  # interrupted: what did start is still stopped by `stop`
                self.known |= {pid for pid, (_, cmd) in _processes().items() if str(self.temp_dir) in cmd} - before
                raise
            mine = {pid for pid, (_, cmd) in _processes().items() if str(self.temp_dir) in cmd} - before
            mine -= set().union(*self.nodes) if self.nodes else set()
            if failure is None or self._joined_late(mine, registered):
                if failure is not None:
                    log.warning("ray start gave up, but its node joined the cluster later: %s", failure)
                self.nodes.append(mine)
                return mine
            started = _with_descendants(mine)
            left = _end(lambda started=started: started & set(_processes()), timeout=10)
            if left:  # not ours to lose track of: `stop` ends them with the rest
                self.known |= left
            log.warning("ray start failed (try %d of %d): %s", attempt, START_TRIES, failure)
            if head:
                self.port = free_port()
                self.address = f"127.0.0.1:{self.port}"
        raise RuntimeError(f"ray start failed {START_TRIES} times; the last: {failure}")

    def raylet(self, node: int) -> int:
        """The pid of node ``node``'s raylet (0 is the head)."""
        procs = _processes()
        (pid,) = [p for p in self.nodes[node] if p in procs and procs[p][1].split(" ", 1)[0].endswith("raylet")]
        return pid

    def pids(self) -> set[int]:
        """Every live process the cluster started: its nodes' and, by parent id, their children's."""
        self.known |= _with_descendants(set().union(*self.nodes) | self.known)
        alive = _processes()
        return {pid for pid in self.known if pid in alive}

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM to every process, then SIGKILL to those left after ``timeout`` s; RuntimeError if any survives."""
        left = _end(self.pids, timeout)
        if left:
            raise RuntimeError(f"Ray processes left running: {sorted(left)}")

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
