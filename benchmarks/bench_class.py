"""A class of students on one attnviz server: latency under load, throughput, rerun cost and memory.

Run it from the repository root (it starts its own servers on 127.0.0.1 and stops them):

    python benchmarks/bench_class.py                       # every measure of issue 11, about 6 minutes
    python benchmarks/bench_class.py --only class,replicas # some of them
    python benchmarks/bench_class.py --quick               # a smoke run (what the test suite does)

The simulated browsers speak Streamlit's own websocket protocol (``/_stcore/stream``, the
BackMsg/ForwardMsg protobufs that ship with Streamlit): a session sends ``rerun_script`` and the
latency of a rerun is the time until the server's ``script_finished``. Everything stays on
loopback; every loop is bounded in count and time, and every server started is stopped by its
process id, also on errors.

  class     N sessions (30) that each rerun a page R times (10) with about 1 s of thinking in
            between (uniform 0.5-1.5 s): p50, p95 and max latency per page, for the settings
            attnviz ships (.streamlit/config.toml) and for Streamlit's default postScriptGC,
            side by side. Targets on the home page and the explorer: p50 <= 300 ms, p95 <= 1 s.
  b2b       the same sessions with no thinking at all for T seconds: reruns per second.
  widgets   per page, the server time of a rerun after one widget change with every result
            already cached (AppTest, median of several alternations). Target: <= 50 ms.
  memory    the server's resident memory after 100 sessions, each with its own sentence.
            Target: <= 1 GB.
  replicas  back to back through deploy/serve.sh (nginx in front) with 1 and with 2 replicas:
            reruns per second and their ratio. Target: 2 replicas >= 1.6x one on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"home": "", "explorer": "explorer"}  # page name -> Streamlit's page_name (the URL path)
TARGETS = {"p50": 0.300, "p95": 1.0, "widget": 0.050, "rss_mb": 1024, "replicas": 1.6}
SENTENCES = ["Thursday, July 2, 1998", "twenty-one", "$1,234.50", "3:45 PM", "7/2/98"]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"no server answered on port {port} within {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """Stop a process we started, by its id: SIGTERM, then SIGKILL after 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def app_server(*flags: str) -> Iterator[tuple[int, int]]:
    """One `streamlit run app.py` on 127.0.0.1 with the repository's config and ``flags``: (port, pid)."""
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true"]
    cmd += ["--server.address", "127.0.0.1", "--server.port", str(port), *flags]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(port, proc)
        yield port, proc.pid
    finally:
        stop(proc)


@contextlib.contextmanager
def replicas(n: int) -> Iterator[int]:
    """deploy/serve.sh with ``n`` replicas behind nginx; its port."""
    port = free_port()
    while any(_in_use(port + i) for i in range(1, n + 1)):
        port = free_port()
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.Popen(
        ["bash", str(ROOT / "deploy" / "serve.sh"), "--replicas", str(n), "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(port, proc, timeout=180)
        yield port
    finally:
        stop(proc)


def _in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------------------------------------
# A browser session, as Streamlit's websocket sees it


class Session:
    """One browser tab: a websocket to the server, and reruns of one page."""

    def __init__(self, port: int, page: str, query: str = ""):
        self.url = f"ws://127.0.0.1:{port}/_stcore/stream"
        self.page, self.query = page, query
        self.ws = None

    async def __aenter__(self) -> Session:
        import websockets  # Streamlit's own dependency

        self.ws = await websockets.connect(
            self.url, subprotocols=["streamlit"], max_size=None, open_timeout=60, ping_interval=None
        )
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()

    async def rerun(self, timeout: float = 120) -> float:
        """Rerun the page; seconds until the server says the script finished."""
        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        msg = BackMsg()
        msg.rerun_script.page_name = self.page
        msg.rerun_script.query_string = self.query
        start = time.perf_counter()
        await self.ws.send(msg.SerializeToString())
        async with asyncio.timeout(timeout):
            while True:
                reply = ForwardMsg()
                reply.ParseFromString(await self.ws.recv())
                if reply.WhichOneof("type") == "script_finished":
                    return time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


async def class_run(port: int, page: str, sessions: int, reruns: int, think: float, seed: int = 0) -> list[float]:
    """Latencies (s) of ``reruns`` reruns in each of ``sessions`` concurrent sessions, thinking between."""
    rng = random.Random(seed)

    async def student(i: int) -> list[float]:
        await asyncio.sleep(rng.uniform(0, think))  # a class does not click in step
        async with Session(port, page) as s:
            await s.rerun()  # the first visit (its model and maps may be computed), not counted
            times = []
            for _ in range(reruns):
                await asyncio.sleep(rng.uniform(0.5 * think, 1.5 * think))
                times.append(await s.rerun())
            return times

    results = await asyncio.gather(*(student(i) for i in range(sessions)))
    return [t for r in results for t in r]


async def back_to_back(port: int, page: str, sessions: int, seconds: float) -> float:
    """Reruns per second of ``sessions`` sessions rerunning without a pause for ``seconds``."""
    async with contextlib.AsyncExitStack() as stack:
        tabs = [await stack.enter_async_context(Session(port, page)) for _ in range(sessions)]
        await asyncio.gather(*(t.rerun() for t in tabs))  # warm
        deadline = time.perf_counter() + seconds
        counts = [0] * sessions

        async def loop(i: int) -> None:
            while time.perf_counter() < deadline:
                await tabs[i].rerun()
                counts[i] += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop(i) for i in range(sessions)))
        return sum(counts) / (time.perf_counter() - start)


async def many_sessions(port: int, n: int, parallel: int = 10) -> None:
    """``n`` sessions, each with its own sentence (in its URL), each run twice; ``parallel`` at a time."""
    from urllib.parse import urlencode

    async def one(i: int) -> None:
        src = f"{SENTENCES[i % len(SENTENCES)]} {i}"
        async with Session(port, "explorer", urlencode({"src": src})) as s:
            await s.rerun()
            await s.rerun()

    for start in range(0, n, parallel):
        await asyncio.gather(*(one(i) for i in range(start, min(n, start + parallel))))


# ---------------------------------------------------------------------------------------------
# Server time of a rerun after one widget change (AppTest)

# page -> (widget kind, key, two values) changed back and forth
WIDGET_CHANGES = {
    "app.py": ("text_area", "src", ("twenty-one", "Thursday, July 2, 1998")),
    "pages/explorer.py": ("selectbox", "layer", (1, 2)),
    "pages/compare.py": ("selectbox", "cmp_layer", (1, 2)),
    "pages/decoding.py": ("slider", "step", (1, 2)),
    "pages/beyond.py": ("selectbox", "bw_layer", (1, 2)),
    "pages/atlas.py": ("selectbox", "at_layer", (1, 2)),
    "pages/walkthrough.py": ("selectbox", "wt_stage", ("enc_scores", "enc_qkv")),
    "pages/mechanics.py": ("toggle", "mech_scale", (False, True)),
    "pages/variants.py": ("slider", "var_k", (2, 3)),
    "pages/positional.py": ("slider", "pe_length", (64, 96)),
    "pages/linearity.py": ("slider", "lin_k", (3, 5)),
}


def widget_rerun_ms(page: str, alternations: int) -> float:
    from streamlit.testing.v1 import AppTest

    kind, key, values = WIDGET_CHANGES[page]
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.run()
    if page != "app.py":
        at.switch_page(page).run()
    root = at.sidebar if key == "src" else at
    times = []
    for i in range(2 * alternations + 4):
        widget = getattr(root, kind)(key=key).set_value(values[i % 2])
        start = time.perf_counter()
        widget.run()
        if at.exception:
            raise RuntimeError(f"{page}: {at.exception[0].value}")
        if i >= 4:  # both values seen twice: every result is cached now
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


# ---------------------------------------------------------------------------------------------


def verdict(value: float, target: float, smaller_is_better: bool = True) -> str:
    ok = value <= target if smaller_is_better else value >= target
    return "PASS" if ok else "MISS"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--reruns", type=int, default=10)
    parser.add_argument("--think", type=float, default=1.0, help="mean seconds between a session's reruns")
    parser.add_argument("--b2b-seconds", type=float, default=15)
    parser.add_argument("--b2b-sessions", type=int, default=8)
    parser.add_argument("--memory-sessions", type=int, default=100)
    parser.add_argument("--alternations", type=int, default=5)
    parser.add_argument("--only", default="class,b2b,widgets,memory,replicas")
    parser.add_argument("--quick", action="store_true", help="a few sessions and seconds: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.reruns, args.think, args.b2b_seconds, args.b2b_sessions = 2, 2, 0.1, 1.0, 2
        args.memory_sessions, args.alternations = 4, 1
    only = set(args.only.split(","))
    print(f"attnviz class benchmark | {cpu_name()}, {os.cpu_count()} cores | python {platform.python_version()}")

    if "class" in only or "b2b" in only:
        if "class" in only:
            print(
                f"\nclass: {args.sessions} sessions x {args.reruns} reruns, {args.think:g} s thinking on average; "
                "latency from rerun to script_finished, ms"
            )
            print(f"  {'page':10} {'settings':28} {'p50':>7} {'p95':>7} {'max':>7}  targets p50 <= 300, p95 <= 1000")
        settings = {"shipped (postScriptGC off)": (), "Streamlit default GC": ("--runner.postScriptGC", "true")}
        for label, flags in settings.items():
            if flags and ("class" not in only or args.quick):  # the comparison takes a server of its own
                continue
            with app_server(*flags) as (port, _):
                if "class" in only:
                    for page, name in PAGES.items():
                        t = asyncio.run(class_run(port, name, args.sessions, args.reruns, args.think))
                        p50, p95 = percentile(t, 0.5), percentile(t, 0.95)
                        print(
                            f"  {page:10} {label:28} {p50 * 1000:7.0f} {p95 * 1000:7.0f} {max(t) * 1000:7.0f}  "
                            f"{verdict(p50, TARGETS['p50'])} {verdict(p95, TARGETS['p95'])}"
                        )
                if "b2b" in only and not flags:
                    for page, name in PAGES.items():
                        rate = asyncio.run(back_to_back(port, name, args.b2b_sessions, args.b2b_seconds))
                        print(f"  b2b {page:6} {args.b2b_sessions} sessions, no thinking: {rate:6.1f} reruns/s")

    if "widgets" in only:
        print("\nwidgets: server time of a rerun after one widget change, everything cached (AppTest), ms")
        for page in WIDGET_CHANGES:
            ms = widget_rerun_ms(page, args.alternations)
            kind, key, _ = WIDGET_CHANGES[page]
            print(f"  {page:22} {kind} {key:12} {ms:6.1f}  {verdict(ms / 1000, TARGETS['widget'])} (<= 50)")

    if "memory" in only:
        with app_server() as (port, pid):
            before = rss_mb(pid)
            asyncio.run(many_sessions(port, args.memory_sessions))
            after = rss_mb(pid)
        print(
            f"\nmemory: server RSS {before:.0f} MB after start, {after:.0f} MB after {args.memory_sessions} sessions "
            f"with their own sentences  {verdict(after, TARGETS['rss_mb'])} (<= 1024 MB)"
        )

    if "replicas" in only:
        rates = {}
        for n in (1, 2):
            with replicas(n) as port:
                rates[n] = asyncio.run(back_to_back(port, "explorer", args.b2b_sessions, args.b2b_seconds))
        ratio = rates[2] / rates[1]
        print(
            f"\nreplicas (deploy/serve.sh, nginx, explorer, {args.b2b_sessions} sessions back to back): "
            f"1 replica {rates[1]:.1f} reruns/s, 2 replicas {rates[2]:.1f} reruns/s, ratio {ratio:.2f}  "
            f"{verdict(ratio, TARGETS['replicas'], smaller_is_better=False)} (>= 1.6)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
