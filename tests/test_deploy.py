"""Past one machine: deploy/serve.sh runs replicas behind nginx, keeps each browser on its replica, stops cleanly.

Everything listens on 127.0.0.1 and is stopped by process id. Locally the test skips without
nginx; under CI (CI=true) a missing nginx is a failure, so the check cannot silently vanish.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVE = ROOT / "deploy" / "serve.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_class import free_port, wait_healthy  # noqa: E402

pytestmark = pytest.mark.slow  # servers and browsers: the full suite, not the quick tier


def _in_use(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def served():
    if shutil.which("nginx") is None:
        if os.environ.get("CI"):
            pytest.fail("the deploy test must run in CI: apt-get install -y nginx")
        pytest.skip("nginx is not installed: apt-get install -y nginx")
    port = free_port()
    while any(_in_use(port + i) for i in (1, 2)):
        port = free_port()
    proc = subprocess.Popen(
        ["bash", str(SERVE), "--replicas", "2", "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_healthy(port, proc, timeout=180)
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


@contextlib.asynccontextmanager
async def _session(port: int, protocols: list[str], headers: dict[str, str]):
    """A session of the app through nginx, open while the block runs: its id, once its first run has finished."""
    import websockets
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    async with websockets.connect(
        f"ws://127.0.0.1:{port}/_stcore/stream", subprotocols=protocols, additional_headers=headers, max_size=None
    ) as ws:
        msg = BackMsg()
        msg.rerun_script.page_name = ""
        await ws.send(msg.SerializeToString())
        session = None
        async with asyncio.timeout(120):
            while True:
                reply = ForwardMsg()
                reply.ParseFromString(await ws.recv())
                if reply.WhichOneof("type") == "new_session":
                    session = reply.new_session.initialize.session_id or session
                if reply.WhichOneof("type") == "script_finished":
                    break
        yield session


async def _session_id(port: int, cookie: str, existing: str | None = None) -> str:
    """Open the app through nginx with a route cookie (resuming ``existing``); the session's id."""
    protocols = ["streamlit", "no-xsrf-token", *([existing] if existing else [])]  # as the browser sends them
    async with _session(port, protocols, {"Cookie": f"attnviz_route={cookie}"}) as session:
        return session


def test_the_page_is_served_with_a_route_cookie(served):
    port, _ = served
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as response:
        assert response.status == 200
        cookies = response.headers.get_all("Set-Cookie")
    assert any(c.startswith("attnviz_route=") and "HttpOnly" in c for c in cookies), cookies


def test_a_browser_keeps_its_session_on_its_replica(served):
    """A reconnecting browser resumes its session only on the replica that holds it: the cookie decides."""
    port, _ = served

    async def check() -> list[bool]:
        kept = []
        for cookie in ("route-a", "route-b", "route-c", "route-d", "route-e"):
            first = await _session_id(port, cookie)
            kept.append(await _session_id(port, cookie, existing=first) == first)
        return kept

    assert all(asyncio.run(check())), "with its cookie, a browser must come back to its own session"


def test_no_file_is_uploaded_though_a_session_is_open(served):
    """The app has no file uploader, and Streamlit's upload endpoint, which keeps every file it takes for an
    open session (200 MB each by default), refuses any file with content (server.maxUploadSize 0)."""
    import urllib.error

    port, _ = served
    token = f"2|00000000|{'ab' * 16}|{int(time.time())}"  # the form Streamlit's XSRF cookie takes
    cookie = f"attnviz_route=upload; _streamlit_xsrf={token}"
    boundary = "attnvizBoundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="x.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + b"\0" * 4096
        + f"\r\n--{boundary}--\r\n".encode()
    )

    async def upload() -> tuple[str, list[int]]:
        async with _session(port, ["streamlit", token], {"Cookie": cookie}) as session:
            statuses = []
            for name in ("a", "b"):
                request = urllib.request.Request(
                    f"http://127.0.0.1:{port}/_stcore/upload_file/{session}/{name}",
                    data=body,
                    method="PUT",
                    headers={
                        "Content-Type": f"multipart/form-data; boundary={boundary}",
                        "Cookie": cookie,
                        "X-Xsrftoken": token,
                    },
                )
                try:
                    with await asyncio.to_thread(urllib.request.urlopen, request, timeout=30) as response:
                        statuses.append(response.status)
                except urllib.error.HTTPError as e:
                    statuses.append(e.code)
            return session, statuses

    session, statuses = asyncio.run(upload())
    assert session and statuses == [413, 413], statuses


def _replica_pid(port: int) -> int | None:
    """The process id of the Streamlit server listening on ``port`` (serve.sh's replica), or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # it ended meanwhile
            continue
        if b"streamlit" in args and b"--server.port" in args and str(port).encode() in args:
            return int(entry.name)
    return None


# deploy/serve.sh starts again a replica that ran at least this long (its own setting, read from it)
RESTART_AFTER_S = int(re.search(r"^RESTART_AFTER_S=(\d+)$", SERVE.read_text(), re.M)[1])


def _age_s(pid: int) -> float:
    """Seconds since process ``pid`` started (/proc/PID/stat's start time, in clock ticks since boot)."""
    ticks = int((Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


def test_a_replica_that_dies_is_started_again(served):
    """kill -9 of one replica: serve.sh starts it again on its port, and nginx keeps serving."""
    port, proc = served
    replica = port + 1
    first = _replica_pid(replica)
    assert first is not None, "serve.sh's replica 1 runs Streamlit on its port"
    time.sleep(max(0.0, RESTART_AFTER_S + 1 - _age_s(first)))  # a replica that dies sooner is broken, not crashed
    os.kill(first, signal.SIGKILL)
    deadline = time.time() + 120
    while time.time() < deadline:
        again = _replica_pid(replica)
        if again not in (None, first) and _in_use(replica):
            break
        assert proc.poll() is None, "serve.sh stopped when one replica died"
        time.sleep(0.5)
    else:
        pytest.fail("the killed replica was not started again within 120 s")
    wait_healthy(replica, proc, timeout=120)
    for _ in range(4):  # nginx answers whichever replica a request lands on
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=30) as response:
            assert response.status == 200
    assert proc.poll() is None


def test_sigterm_stops_every_process_it_started(served):
    port, proc = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    deadline = time.time() + 10
    while time.time() < deadline and any(_in_use(p) for p in (port, port + 1, port + 2)):
        time.sleep(0.2)
    assert not any(_in_use(p) for p in (port, port + 1, port + 2)), "nginx or a replica outlived serve.sh"


def test_ctrl_c_stops_every_process_it_started_and_says_nothing_went_wrong(tmp_path):
    """A Ctrl-C reaches the terminal's whole process group: nginx and the replicas had taken it and ended first,
    serve.sh had said "a process ended" and exited 1, and a second Ctrl-C while it stopped had left its folder."""
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed: apt-get install -y nginx")
    port = free_port()
    while _in_use(port + 1):
        port = free_port()
    proc = subprocess.Popen(
        ["bash", str(SERVE), "--replicas", "1", "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job
        # with SIGINT as a terminal's shell leaves it: a test worker (pytest-xdist) ignores it, and a shell that
        # starts with a signal ignored cannot trap it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        said = proc.stderr.readline()
        assert f"behind nginx at http://127.0.0.1:{port}" in said, said + proc.stderr.read()
        replica = _replica_pid(port + 1)
        assert replica is not None and list(tmp_path.glob("attnviz-serve.*"))
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)  # a second Ctrl-C while it stops
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert "a process ended" not in proc.stderr.read()
    finally:
        if proc.poll() is None:  # its SIGTERM stops what it started; nginx and the replicas are in other groups
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    deadline = time.time() + 10
    while time.time() < deadline and (_in_use(port) or _in_use(port + 1) or os.path.exists(f"/proc/{replica}")):
        time.sleep(0.2)
    assert not _in_use(port) and not _in_use(port + 1) and not os.path.exists(f"/proc/{replica}")
    assert not list(tmp_path.glob("attnviz-serve.*")), "its folder, with nginx.conf and the logs, removed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "0"], "between 1 and 64"),
        (["--replicas", "two"], "whole number"),
        (["--port", "80"], "--port must leave room"),
        (["--workers", "2"], "unknown argument"),
        (["--replicas", "2", "--port"], "--port needs a value"),  # had ended with status 1 and nothing said
        (["--replicas"], "--replicas needs a value"),
        # read in decimal: 0010 replicas are 10 (bash had read 8), and a port of 018770 had failed as octal
        (["--replicas", "0010", "--port", "65530"], "room for 10 replica ports above it (1024..65525)"),
        (["--replicas", "1", "--port", "0000065535"], "must be at most 64 and 65535"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, message):
    result = subprocess.run(["bash", str(SERVE), *args], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed: apt-get install -y nginx")
def test_a_port_taken_is_one_line_before_anything_starts():
    """nginx had failed to bind only after the replicas had started and been visited (about 25 s), and after
    serve.sh had said it was serving."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        result = subprocess.run(
            ["bash", str(SERVE), "--replicas", "1", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"serve.sh: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "behind nginx at" not in result.stderr and time.monotonic() - start < 20


# A fresh interpreter: the first visit's module and the protocol it speaks, then what they imported.
VISIT_PROBE = """
import sys
import attnviz.app.visit
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
print(sorted({"torch", "numpy", "pandas", "attnviz.app.cache", "attnviz.app.views"} & set(sys.modules)))
"""


def test_the_first_visit_imports_none_of_the_apps_computation():
    """serve.sh pays each replica a first visit before it lets a class in: a websocket client needs
    neither torch nor the app's pages (attnviz.app imports its names on first use): 0.5-0.7 CPU s a
    visit where importing them made it 2.6-3.1 (a 2-core AMD EPYC with AVX-512)."""
    done = subprocess.run([sys.executable, "-c", VISIT_PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--port", "0"], "--port: must be a port from 1 to 65535, got '0'"),  # had visited port 80
        (["--port", "99999"], "--port: must be a port from 1 to 65535"),  # had been a ValueError's traceback
        (["--port", "8501", "--timeout", "-1"], "--timeout: must be a number of seconds above 0, got '-1'"),
        (["--port", "8501", "--timeout", "nan"], "--timeout: must be a number of seconds above 0"),
    ],
)
def test_the_first_visit_refuses_a_bad_argument_in_one_line(capsys, args, message):
    from attnviz.app import visit

    with pytest.raises(SystemExit) as done:
        visit.main(args)
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and message in err and "\n" not in err, err


def test_the_first_visit_without_a_server_exits_2_with_one_line(capsys):
    import socket

    from attnviz.app import visit

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert visit.main(["--port", str(port), "--timeout", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"attnviz: could not open the app on port {port}: ") and "\n" not in err
    assert err.split(": ", 2)[2].strip(), "a reason, not nothing: the error's own text or its name"
