"""How many threads numpy's own BLAS may use: one, in the processes that share the cores with others.

numpy's wheels bundle OpenBLAS, which runs a large enough product or decomposition on a thread
per core and spins while it waits for them. Where the cores are busy already (the app's server
with a class on it, its heavy-work workers, a test suite's two workers), those threads wait on
each other, and the work takes many times as long as on one thread. Measured with
``benchmarks/bench_blas.py`` on a 2-core AMD EPYC: a thin SVD of a (1024, 512) float64 matrix
took 0.11 s on one thread, alone or beside a second process doing the same, and from 0.28 s to
10.5 s on two threads beside it (two runs). Alone, the second thread made products up to 2x and
SVDs up to 1.4x as fast.

So the app's processes (`attnviz.app.frame`, `attnviz.jobs`) ask for one thread, as they already
do of torch, unless the operator chose with ``OPENBLAS_NUM_THREADS`` or ``OMP_NUM_THREADS``.
The CLI and the Python API keep numpy's default: there a person's machine is theirs.
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
