"""A process's start: its heavy imports kept out of Python's cyclic garbage collector.

Importing torch, pandas, plotly and the API makes about 200,000 objects that live as long as the
process. The collector runs after every 700 new objects, so it walks those already made again and
again while they are made (five full passes during one import), and every full pass after that walks
them all once more. Imported with the collector held and then frozen (`gc.freeze`: out of every
later pass), ``import torch, plotly.graph_objects, pandas, attnviz.api, attnviz.model`` and 300,000
objects made after it took 1.53-1.86 CPU s, against 2.16-2.92 with the collector running as usual,
and 2.25-2.89 held but not frozen: the passes only come after (2-core AMD EPYC with AVX-512,
Python 3.11, three runs each). The price is the little garbage the imports leave (7,417 objects
there), which frozen is never collected: a few hundred kilobytes, once.

Only a process's own start may freeze: what is alive then stays for the process's life. The command
line does it for its command's imports when it runs as its own process (`attnviz.cli`), as do a
heavy-work process (`attnviz.jobs`: its fork server froze already, so that its children's passes
do not copy its pages) and an atlas actor on Ray (`attnviz.atlas.ray_engine`). The app's server
does not: its first page's imports run in its first visitor's session, whose objects a freeze would
keep after the visitor has gone.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imports_kept() -> Iterator[None]:
    """Inside: the process's start imports, with no garbage collection. After: every object alive, the
    imported modules' included, is frozen out of later collections, and the collector is as it was."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()
