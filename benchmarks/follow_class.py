"""``bench_class.py --follow``: one presenter and a class of followers on replicas behind nginx (issue 34).

The presenter and the followers are websocket sessions (`attnviz.app.visit.Session`'s protocol),
without a browser. The presenter opens the explorer, presses "Open a room" and, every ``every``
seconds, picks another head (a widget change, as a click sends it). Each follower opens the room's
link (``?follow=CODE``) and, as a browser does for the page's polling fragment, asks the server
for a fragment run every 0.5 s (`attnviz.app.follow.POLL_S`, the interval the server sends). A
follower's page is updated when the server has sent it the presenter's parameters
(``page_info_changed``) and has finished the run that draws the page with them: the latency is
measured from the moment the presenter's change was sent. A detached student (its own session,
"Explore on my own" pressed) changes a head about once a second meanwhile: its reruns are timed.
Each session sends, as a browser does, the hash of the page it shows with every rerun: without it
Streamlit takes a fragment's run for a change of page and drops the page's parameters from the
address bar (the follower's link would hold ``follow=`` alone).

The replicas' CPU time is read too: per poll while nothing changes (a poll should cost one read of
the room), and per update shown (a follower's page drawn anew with the presenter's view).

The replicas share the SQLite room store in a temporary folder (``ATTNVIZ_ROOMS_DIR``); the
benchmark reads the room there too, to know which parameters each change publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlencode

from attnviz.app.follow import FOLLOW, OWN_PARAMS, PAGE_KEY, POINT_KEY

ROOT = Path(__file__).resolve().parents[1]
HEADS = (1, 2, 3, 4)  # the presenter's choices (en-de has 4 heads a layer: a head it has not would be no change)


class Tab:
    """A browser tab that keeps its widgets' ids and values, and runs its page's polling fragment."""

    def __init__(self, port: int, page: str, query: str = ""):
        self.url = f"ws://127.0.0.1:{port}/_stcore/stream"
        self.page, self.query = page, query
        self.page_hash = ""  # the page's script hash, from the server: a browser sends it with every rerun
        self.ws = None
        self.ids: dict[str, str] = {}  # user key -> widget id, from the elements the server sent
        self.fragments: dict[str, float] = {}  # fragment id -> interval (s), from auto_rerun
        self.errors: list[str] = []
        self.params: dict[str, list[str]] = {}  # the address bar's parameters, as the server last set them
        self.finished = asyncio.Event()
        self.full_runs = 0
        self.room = ""  # the room code the presenter's sidebar shows

    async def __aenter__(self) -> Tab:
        import websockets

        self.ws = await websockets.connect(
            self.url, subprotocols=["streamlit"], max_size=None, open_timeout=60, ping_interval=None
        )
        self.reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc) -> None:
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader
        await self.ws.close()

    async def _read(self) -> None:
        from streamlit.proto.Alert_pb2 import Alert
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        while True:
            msg = ForwardMsg()
            msg.ParseFromString(await self.ws.recv())
            kind = msg.WhichOneof("type")
            if kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
                element = msg.delta.new_element
                which = element.WhichOneof("type")
                widget = getattr(element, which, None)
                wid = getattr(widget, "id", "") if widget is not None else ""
                if isinstance(wid, str) and wid.startswith("$$ID"):
                    self.ids[wid.rsplit("-", 1)[-1]] = wid
                if which == "markdown" and element.markdown.body.startswith("**Room "):
                    self.room = element.markdown.body.strip("*").split()[-1]
                if which == "exception":
                    self.errors.append(f"{element.exception.type}: {element.exception.message}")
                elif which == "alert" and element.alert.format in (Alert.ERROR, Alert.WARNING):
                    self.errors.append(element.alert.body)
            elif kind == "auto_rerun":
                self.fragments.pop(msg.auto_rerun.fragment_id, None)  # the latest last
                self.fragments[msg.auto_rerun.fragment_id] = msg.auto_rerun.interval
            elif kind == "stop_auto_rerun":
                for fragment in msg.stop_auto_rerun.fragment_ids:
                    if len(self.fragments) > 1:
                        self.fragments.pop(fragment, None)
            elif kind == "page_info_changed":
                self.params = parse_qs(msg.page_info_changed.query_string)
                self.query = msg.page_info_changed.query_string
            elif kind == "new_session":
                page = msg.new_session.page_script_hash
                for entry in msg.new_session.app_pages:
                    if entry.page_script_hash == page:
                        self.page = entry.url_pathname
            elif kind == "navigation":  # the page this run drew (a page of the pages/ folder)
                self.page_hash = msg.navigation.page_script_hash
                for entry in msg.navigation.app_pages:
                    if entry.page_script_hash == self.page_hash:
                        self.page = entry.url_pathname
            elif kind == "script_finished":
                if msg.script_finished == ForwardMsg.FINISHED_SUCCESSFULLY:
                    self.full_runs += 1
                if msg.script_finished != ForwardMsg.FINISHED_EARLY_FOR_RERUN:  # a rerun follows: wait for it
                    self.finished.set()

    async def run(self, widgets=None, fragment: str = "", timeout: float = 60) -> float:
        """Send one rerun (with ``widgets``, a list of WidgetState, or of ``fragment`` alone); seconds to its end."""
        from streamlit.proto.BackMsg_pb2 import BackMsg

        msg = BackMsg()
        msg.rerun_script.page_name = self.page
        # as a browser does: without the page's hash a fragment's run counts as a change of page, for which
        # Streamlit drops the parameters of the page's widgets from the address bar
        msg.rerun_script.page_script_hash = self.page_hash
        msg.rerun_script.query_string = self.query
        if fragment:
            msg.rerun_script.fragment_id = fragment
            msg.rerun_script.is_auto_rerun = True
        for state in widgets or ():
            msg.rerun_script.widget_states.widgets.append(state)
        self.finished.clear()
        start = time.perf_counter()
        await self.ws.send(msg.SerializeToString())
        async with asyncio.timeout(timeout):
            await self.finished.wait()
        return time.perf_counter() - start

    def widget(self, key: str, **value):
        """A WidgetState for the widget whose user key is ``key`` (``trigger_value=True``, ``string_value=...``)."""
        from streamlit.proto.WidgetStates_pb2 import WidgetState

        state = WidgetState(id=self.ids[key])
        for field, v in value.items():
            setattr(state, field, v)
        return state


def wanted_params(state: dict) -> dict[str, list[str]]:
    """The link parameters a room's state gives its followers (without the room's page and point)."""
    out = {}
    for key, value in state.items():
        if key in (PAGE_KEY, POINT_KEY) or key in OWN_PARAMS or value is None:
            continue
        out[key] = value if isinstance(value, list) else [value]
    return out


@contextlib.contextmanager
def served(replicas: int, rooms_dir: str) -> Iterator[tuple[int, int]]:
    """deploy/serve.sh with ``replicas`` replicas sharing the room store in ``rooms_dir``: (port, its pid)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_class import serve_sh

    env = {**os.environ, "ATTNVIZ_ROOMS_DIR": rooms_dir}
    env.pop("ATTNVIZ_ROOMS_URL", None)
    with serve_sh(replicas, env) as port_and_pid:
        yield port_and_pid


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    from bench_class import descendants

    return [pid, *descendants(pid)]


def process_rss(pid: int) -> list[tuple[str, float]]:
    """(name, RSS in MB) of ``pid`` and every process below it."""
    from bench_class import rss_mb

    rows = []
    for p in tree(pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            name = " ".join(part.decode(errors="replace") for part in cmd[:6] if part)
            rows.append((f"{p} {name[:70]}", rss_mb(p)))
        except OSError:
            continue
    return rows


def server_cpu(pid: int) -> float:
    """CPU seconds (user and system) the Streamlit processes at or below ``pid`` have used so far."""
    total = 0.0
    for p in tree(pid):
        try:
            if b"streamlit" not in Path(f"/proc/{p}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def follow_class(port: int, followers: int, seconds: float, every: float, rooms_dir: str, pid: int) -> dict:
    """One presenter changing the head every ``every`` s for ``seconds``, ``followers`` following, one detached.

    The replicas' CPU time (``pid``: deploy/serve.sh) is read over a quiet window, when every follower
    polls and nothing changes, and over the changes: the cost of a poll, and of a change shown.
    """
    os.environ["ATTNVIZ_ROOMS_DIR"] = rooms_dir  # this process reads the same store
    os.environ.pop("ATTNVIZ_ROOMS_URL", None)
    from attnviz.app import rooms

    latencies: list[float] = []
    errors: list[str] = []
    light: list[float] = []
    async with Tab(port, "explorer") as teacher:
        await teacher.run(timeout=300)
        await teacher.run([teacher.widget("_room_open", trigger_value=True)])
        code = teacher.room
        if not code:
            raise RuntimeError("the presenter's room did not open")
        teacher_link = wanted_params(rooms.read(code).state)  # the presenter's address bar: the view it opened on
        done = asyncio.Event()
        changes: list[tuple[float, dict]] = []  # (when sent, the parameters the room then holds)
        skipped = [0]
        published: list[float] = []  # seconds from each change sent to the room's new version
        polls = [0]  # fragment runs the followers asked for
        joined = [0]  # followers whose page polls

        async def follower(i: int) -> None:
            await asyncio.sleep(random.uniform(0, 2))
            async with Tab(port, "", f"{FOLLOW}={code}") as tab:
                await tab.run(timeout=300)
                seen = 0  # changes already caught up with
                while not tab.fragments and not done.is_set():
                    await tab.run(timeout=300)
                joined[0] += 1
                while not done.is_set() or seen < len(changes):
                    fragment, interval = list(tab.fragments.items())[-1]  # the page's own: it changes with the page
                    started = time.perf_counter()
                    polls[0] += 1
                    try:
                        await tab.run(fragment=fragment, timeout=30)
                    except TimeoutError:
                        tab.errors.append("no answer within 30 s")
                        break
                    now = time.perf_counter()
                    shown = {k: v for k, v in tab.params.items() if k not in OWN_PARAMS}
                    for k in range(len(changes) - 1, seen - 1, -1):  # the latest change the page shows
                        sent, params = changes[k]
                        if shown == params:
                            latencies.append(now - sent)
                            skipped[0] += k - seen  # changes overtaken by a later one before this page showed them
                            seen = k + 1
                            break
                    if done.is_set() and time.perf_counter() > end_at + 10:
                        tab.errors.append(f"{len(changes) - seen} changes never arrived")
                        break
                    await asyncio.sleep(max(0.0, interval - (time.perf_counter() - started)))
                errors.extend(f"follower {i}: {e}" for e in tab.errors)

        async def detached() -> None:
            async with Tab(port, "", f"{FOLLOW}={code}") as tab:
                await tab.run(timeout=300)
                await tab.run([tab.widget("_follow_detach", trigger_value=True)])
                rng = random.Random(7)
                while not done.is_set():
                    await asyncio.sleep(rng.uniform(0.5, 1.5))
                    if "head" in tab.ids:
                        light.append(await tab.run([tab.widget("head", string_value=str(rng.choice(HEADS)))]))
                errors.extend(f"detached: {e}" for e in tab.errors)

        tasks = [asyncio.create_task(follower(i)) for i in range(followers)] + [asyncio.create_task(detached())]
        deadline = time.perf_counter() + 120
        while joined[0] < followers and time.perf_counter() < deadline:  # the class opens the link
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)
        quiet = (server_cpu(pid), polls[0], time.perf_counter())
        await asyncio.sleep(5)  # every follower polls, nothing changes: the cost of a poll alone
        quiet = (server_cpu(pid) - quiet[0], polls[0] - quiet[1], time.perf_counter() - quiet[2])
        busy = (server_cpu(pid), polls[0], len(latencies))
        end_at = time.perf_counter() + seconds
        version = rooms.read(code).version
        i = 0
        while time.perf_counter() < end_at:
            head = HEADS[i % len(HEADS)]
            i += 1
            sent = time.perf_counter()
            # as a browser sends it: the widget's new value, and the address bar that its binding wrote
            teacher.query = urlencode({**teacher_link, "head": str(head)}, doseq=True)
            await teacher.run([teacher.widget("head", string_value=str(head))])
            # the room's new view (a change right after another is written up to 0.1 s later: coalesced)
            deadline = time.perf_counter() + 2
            while rooms.read(code).version == version and time.perf_counter() < deadline:
                await asyncio.sleep(0.02)
            seen_now = rooms.read(code)
            if seen_now.version == version:  # a change that never reached the room: no follower could show it
                errors.append(f"presenter: the change to head {head} did not reach the room within 2 s")
            version = seen_now.version
            published.append(time.perf_counter() - sent)
            changes.append((sent, wanted_params(seen_now.state)))
            await asyncio.sleep(max(0.0, every - (time.perf_counter() - sent)))
        done.set()
        await asyncio.gather(*tasks)
        busy = (server_cpu(pid) - busy[0], polls[0] - busy[1], len(latencies) - busy[2])
        errors.extend(f"presenter: {e}" for e in teacher.errors)
        counted = rooms.read(code).followers
    return {
        "latencies": latencies,
        "errors": errors,
        "light": light,
        "changes": len(changes),
        "counted": counted,
        "skipped": skipped[0],
        "published": published,
        "quiet": quiet,  # (CPU s, polls, wall s) with nothing changing
        "busy": busy,  # (CPU s, polls, updates shown) from the first change to the last follower's end
    }


def follow_measure(followers: int, seconds: float, every: float, replicas: int = 2) -> int:
    """``--follow``: print the measures and, last, ``follow_p50_ms=<x> follow_p95_ms=<y> errors=<n>``."""
    from bench_class import cpu_name, percentile, verdict

    print(
        f"\nfollow: 1 presenter and {followers} followers on {replicas} replicas (deploy/serve.sh, nginx); "
        f"the presenter changes the head every {every:g} s for {seconds:g} s; one student detached"
    )
    with tempfile.TemporaryDirectory() as rooms_dir, served(replicas, rooms_dir) as (port, pid):
        own = (time.process_time(), time.perf_counter())
        result = asyncio.run(follow_class(port, followers, seconds, every, rooms_dir, pid))
        own = (time.process_time() - own[0]) / (time.perf_counter() - own[1])
        memory = process_rss(pid)
    lat, light, errors = result["latencies"], result["light"], result["errors"]
    expected = result["changes"] * followers
    if len(lat) + result["skipped"] < expected:
        errors.append(f"{expected - len(lat) - result['skipped']} of {expected} updates not seen")
    p50 = percentile(lat, 0.5) * 1000 if lat else float("inf")
    p95 = percentile(lat, 0.95) * 1000 if lat else float("inf")
    print(f"  {result['changes']} changes x {followers} followers: {len(lat)} updates seen; room counted "
          f"{result['counted']} screens at the end; {result['skipped']} overtaken before shown")  # fmt: skip
    print(f"  presenter's change to a follower's updated page: p50 {p50:.0f} ms, p95 {p95:.0f} ms, "
          f"max {max(lat, default=float('inf')) * 1000:.0f} ms  {verdict(p95 / 1000, 1.0)} (p95 <= 1000)")  # fmt: skip
    if result["published"]:
        pub = result["published"]
        print(f"  of which the presenter's change to the room's new version: p50 {percentile(pub, 0.5) * 1000:.0f} ms, "
              f"p95 {percentile(pub, 0.95) * 1000:.0f} ms")  # fmt: skip
    if light:
        print(f"  detached student's rerun: p50 {percentile(light, 0.5) * 1000:.0f} ms, p95 "
              f"{percentile(light, 0.95) * 1000:.0f} ms over {len(light)}  "
              f"{verdict(percentile(light, 0.95), 0.3)} (p95 <= 300)")  # fmt: skip
    cpu, polls, wall = result["quiet"]
    per_poll = cpu / polls if polls else float("nan")
    print(f"  the replicas' CPU per follower poll with nothing new: {per_poll * 1000:.1f} ms "
          f"({polls} polls in {wall:.0f} s: {cpu / wall * 100:.0f}% of one core)")  # fmt: skip
    cpu, polls, shown = result["busy"]
    if shown:
        print(f"  the replicas' CPU per update shown: {(cpu - polls * per_poll) / shown * 1000:.0f} ms "
              f"(a follower's page drawn anew; {shown} updates, the polls' share taken out)")  # fmt: skip
    print(f"  followers' errors: {len(errors)}  {verdict(len(errors), 0)} (0)")
    # the sessions' client is one Python process: near 100%, its own queue adds to the latencies
    print(f"  this benchmark's own CPU (the sessions' websocket client): {own * 100:.0f}% of one core")
    for problem in errors[:5]:
        print(f"    {problem[:160]}")
    print("  RSS of every process (MB):")
    for name, mb in memory:
        print(f"    {mb:7.0f}  {name}")
    print(f"  | {cpu_name()}, {os.cpu_count()} cores")
    print(f"follow_p50_ms={p50:.0f} follow_p95_ms={p95:.0f} errors={len(errors)}")
    return len(errors)
