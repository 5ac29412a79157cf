"""A browser tab as a Streamlit server sees it, and the first visit that warms a fresh server.

A fresh server imports torch, loads the model and computes the first page when its first visitor
arrives: about 4 s on 2 cores, while a class that opens the link at once waits behind it.
``python -m attnviz.app.visit --port P`` opens the home page and the explorer once, as a teacher
would before class; ``deploy/serve.sh`` runs it on each replica before it lets visitors in, and
``benchmarks/bench_class.py`` drives its sessions with `Session`.

A session speaks Streamlit's own websocket protocol (``/_stcore/stream``, the BackMsg and
ForwardMsg protobufs that ship with Streamlit): it sends ``rerun_script`` and reads until the
server's ``script_finished``. It only ever connects to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from typing import NoReturn

WARM_PAGES = ("", "explorer")  # Streamlit's page names (the URL paths): the home page and the explorer


class Session:
    """One browser tab on a server on this machine: a websocket, and reruns of one page."""

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
        return (await self.rerun_and_read(timeout))[0]

    async def rerun_and_read(self, timeout: float = 120) -> tuple[float, list[str], list[str]]:
        """Rerun the page: (seconds until the script finished, its error messages, its exceptions)."""
        from streamlit.proto.Alert_pb2 import Alert
        from streamlit.proto.BackMsg_pb2 import BackMsg
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        msg = BackMsg()
        msg.rerun_script.page_name = self.page
        msg.rerun_script.query_string = self.query
        errors, exceptions = [], []
        start = time.perf_counter()
        await self.ws.send(msg.SerializeToString())
        async with asyncio.timeout(timeout):
            while True:
                reply = ForwardMsg()
                reply.ParseFromString(await self.ws.recv())
                kind = reply.WhichOneof("type")
                if kind == "script_finished":
                    return time.perf_counter() - start, errors, exceptions
                if kind == "delta" and reply.delta.WhichOneof("type") == "new_element":
                    element = reply.delta.new_element
                    if element.WhichOneof("type") == "exception":
                        exceptions.append(f"{element.exception.type}: {element.exception.message}")
                    elif element.WhichOneof("type") == "alert" and element.alert.format == Alert.ERROR:
                        errors.append(element.alert.body)


async def warm(port: int, pages: tuple[str, ...] = WARM_PAGES, timeout: float = 300) -> list[str]:
    """Open each of ``pages`` once; the problems seen (error messages, exceptions), none when all is well."""
    problems = []
    for page in pages:
        async with Session(port, page) as s:
            _, errors, exceptions = await s.rerun_and_read(timeout)
            problems += [f"{page or 'home'}: {p}" for p in errors + exceptions]
    return problems


class _OneLine(argparse.ArgumentParser):
    """argparse, its errors one line (no usage block), exit status 2: as attnviz's own command line."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _port(text: str) -> int:
    """A TCP port, 1 to 65535 (0 had reached port 80, 99999 a ValueError's traceback)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, got {text!r}")
    return port


def _seconds(text: str) -> float:
    """A finite number of seconds above 0 (-1 or nan had failed at once with no reason given)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = _OneLine(
        prog="python -m attnviz.app.visit", description="Open the home page and the explorer once on a local server."
    )
    parser.add_argument("--port", type=_port, required=True, help="the server's port on 127.0.0.1")
    parser.add_argument("--timeout", type=_seconds, default=300, help="seconds to wait for each page")
    args = parser.parse_args(argv)
    try:
        problems = asyncio.run(warm(args.port, timeout=args.timeout))
    except (OSError, TimeoutError) as e:
        print(f"attnviz: could not open the app on port {args.port}: {str(e) or type(e).__name__}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"attnviz: the first visit showed: {problem}", file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
