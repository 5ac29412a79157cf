"""How many threads a process computes on: one, in the processes that share the cores with others.

torch's operations and numpy's BLAS (the OpenBLAS numpy's wheels bundle) each run a large enough
piece of work on a thread per core and spin while they wait for those threads. Where the cores are
busy already (the app's server with a class on it, its heavy-work workers, a test suite's two
workers), the threads of two processes wait on each other, and the work takes many times as long
as on one thread. Measured with ``benchmarks/bench_threads.py`` on a 2-core AMD EPYC: a thin SVD
of a (1024, 512) float64 matrix took 0.11 s on one thread, alone or beside a second process doing
the same, and from 0.28 s to 10.5 s on two threads beside it (two runs); a greedy translation of a
sentence by en-de took 7 ms on one thread either way, and over 600 ms on two where two processes
translated without pause. Alone, the second thread made numpy's products up to 2x and SVDs up to
1.4x as fast, and the translation no faster.

So the app's processes take one thread: the server (`share_the_cores`, from `attnviz.app.frame`)
and each heavy-work worker (`attnviz.jobs`, ``ATTNVIZ_WORKER_THREADS``), unless the operator chose
with ``OMP_NUM_THREADS`` (torch and OpenBLAS) or ``OPENBLAS_NUM_THREADS`` (OpenBLAS). The CLI and
the Python API keep the libraries' defaults: there a person's machine is theirs.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

# OpenBLAS's own setting and getting functions, under the names numpy's builds give them: numpy 2's
# scipy-openblas (64-bit integers, prefixed), then older builds' and a system OpenBLAS's.
_SET = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads")
_GET = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")
CHOSEN_BY = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")  # the operator's own choice, read by OpenBLAS at its start


@cache
def _openblas() -> ctypes.CDLL | None:
    """numpy's bundled OpenBLAS (already loaded by numpy: opening it again gives the same library), or None
    for a numpy built on another BLAS (Accelerate on a Mac, MKL in conda), whose threads are left alone."""
    import numpy as np

    root = Path(np.__file__).resolve().parent
    for folder in (root.parent / "numpy.libs", root / ".dylibs"):  # Linux and Windows wheels; macOS wheels
        for path in sorted(folder.glob("*openblas*")) if folder.is_dir() else []:
            try:
                library = ctypes.CDLL(str(path))
            except OSError:
                continue
            if any(hasattr(library, name) for name in _SET):
                return library
    return None


@cache
def _function(names: tuple[str, ...]):
    library = _openblas()
    return next((getattr(library, name) for name in names if hasattr(library, name)), None) if library else None


def numpy_blas_threads() -> int | None:
    """The threads numpy's OpenBLAS may use now, as OpenBLAS reports it; None when numpy has another BLAS."""
    get = _function(_GET)
    return None if get is None else int(get())


def limit_numpy_blas(threads: int = 1) -> bool:
    """Let numpy's OpenBLAS use at most ``threads`` threads from now on, in this process.

    False, and nothing changed, where the operator set ``OPENBLAS_NUM_THREADS`` or ``OMP_NUM_THREADS``
    or numpy has another BLAS.
    """
    if any(os.environ.get(name, "").strip() for name in CHOSEN_BY):
        return False
    set_threads = _function(_SET)
    if set_threads is None:
        return False
    set_threads(max(1, int(threads)))
    return True


def compute_on(threads: int) -> None:
    """torch's operations and numpy's BLAS on ``threads`` threads each, in this process (numpy's BLAS left
    as the operator set it: `limit_numpy_blas`). torch passes the number to each thread's first operation."""
    import torch

    torch.set_num_threads(threads)
    limit_numpy_blas(threads)


def share_the_cores() -> None:
    """`compute_on` one thread, for a process that shares the cores with others (the app's server); nothing
    where the operator set ``OMP_NUM_THREADS`` (torch and OpenBLAS read it), numpy's BLAS left alone where
    they set ``OPENBLAS_NUM_THREADS``."""
    if not os.environ.get("OMP_NUM_THREADS", "").strip():
        compute_on(1)
