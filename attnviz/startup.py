"""A process's start: its heavy imports kept out of Python's cyclic garbage collector.

Importing torch, pandas, plotly and the API makes about 200,000 objects that live as long as the
process. The collector runs after every 700 new objects, so it walks those already made again and
again while they are made (five full passes during one import), and every full pass after that walks
them all once more. Imported with the collector held and then frozen (`gc.freeze`: out of every
later pass), ``import torch, plotly.graph_objects, pandas, attnviz.api, attnviz.model`` and 300,000
objects made after it took 1.53-1.86 CPU s, against 2.16-2.92 with the collector running as usual,
and 2.25-2.89 held but not frozen: the passes only come after (2-core AMD EPYC with AVX-512,
Python 3.11, three runs each). The price is the little garbage the imports leave (7,417 objects
there), which frozen is never collected: under a megabyte, once.

Only a process's own start may freeze: what is alive then stays for the process's life. The command
line does it for its command's imports when it runs as its own process (`attnviz.cli`), as does a
heavy-work process (`attnviz.jobs`; its fork server again after what a live training needs, so that
its children's passes do not copy its pages). The app's server imports torch and the API in its first page's run, so it
freezes once, when that page's frame begins (`freeze_once`, from `attnviz.app.frame`): its imports
are done and the page's data is not made yet. The first visitor's session as it stands then (its
widget state) is kept for the server's life, a one-off of a few objects. Every full pass of the
server holds every session's run (one interpreter lock): with ten sessions rerunning the home page
and the explorer, a pass took 51-57 ms where it took 132-136 ms (the latencies and reruns per second
within the runs' spread), and with Streamlit's garbage collection after every run (the default,
which `.streamlit/config.toml` turns off) the server spent 0.9-1.0 CPU s in 122 passes where it spent
17.5-19.5 in 112-113 (2-core AMD EPYC with AVX-512, `bench_class.py --only class,b2b`, gc.callbacks;
two runs each).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imports_kept(own_process: bool = True) -> Iterator[None]:
    """Inside: the process's start imports, with no garbage collection. After: every object alive, the
    imported modules' included, is frozen out of later collections, and the collector is as it was.

    ``own_process=False`` (code imported or called by another program, which owns its start): nothing is done.
    """
    if not own_process:
        yield
        return
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()


_frozen = False


def freeze_once() -> None:
    """Freeze what is alive, the first time this process asks (the app's server, as its first page begins)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
