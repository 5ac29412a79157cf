"""A real redis-server for the rooms' tests: on 127.0.0.1 and a free port, no files kept, stopped by its PID.

Locally the tests that need it skip when Debian's ``redis-server`` is absent; under CI (CI=true)
its absence is a failure, so the Redis checks cannot silently vanish.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A ``redis-server`` child process: ``url`` to reach it, `stop` (by PID) to end it."""

    def __init__(self, folder: Path, port: int | None = None):
        binary = shutil.which("redis-server")
        if binary is None:
            if os.environ.get("CI"):
                pytest.fail("the rooms' Redis tests must run in CI: apt-get install -y redis-server")
            pytest.skip("redis-server is not installed (Debian: apt-get install -y redis-server)")
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(folder),
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Poll with a plain socket: a redis-py ping against a server not yet up retries for seconds.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server exited at once (status {self.proc.returncode})")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        self.stop()
        pytest.fail("redis-server did not listen within 10 s")

    def stop(self) -> None:
        """Kill the server (SIGKILL: as a crash or a machine that goes away) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
