"""A process's start (attnviz.startup): its imports frozen out of the garbage collector, and only its own.

Each check runs in a process of its own: a freeze lasts for the process's life, and this test process
froze its own collection already (tests/conftest.py).
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import textwrap

import pytest

from attnviz import cli


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, timeout=120)
    out = (done.stdout + done.stderr).decode(errors="replace")  # a worker writes its pickled replies to stdout
    assert done.returncode == 0, out
    return out


def test_imports_kept_freezes_what_is_alive_and_gives_the_collector_back_as_it_was():
    out = _python(
        """
        import gc
        from attnviz.startup import imports_kept

        for on in (True, False):
            gc.enable() if on else gc.disable()
            gc.collect()
            before = gc.get_freeze_count()
            with imports_kept():
                assert not gc.isenabled(), "collected inside"
                made = [[i] for i in range(5000)]  # tracked objects, as an import makes
                cycle = []
                cycle.append(cycle)
            assert gc.isenabled() is on, f"the collector was {on} and is {gc.isenabled()}"
            assert gc.get_freeze_count() >= before + 5000, (before, gc.get_freeze_count())
            del made, cycle
            assert gc.collect() == 0, "a frozen cycle was collected"
            loose = []
            loose.append(loose)
            del loose
            assert gc.collect() == 1, "a cycle made after the start was not collected"
        gc.enable()
        try:
            with imports_kept():
                raise ImportError("a module that is not there")
        except ImportError:
            pass
        assert gc.isenabled(), "an import that failed left the collector off"
        print("ok")
        """
    )
    assert out.strip() == "ok"


def test_the_command_line_freezes_only_as_its_own_process():
    """``attnviz ...`` (argv from the process) keeps its imports frozen; ``cli.main([...])`` called from
    Python leaves its caller's collector alone."""
    out = _python(
        """
        import gc, sys
        from attnviz import cli
        sys.argv = ["attnviz", "diff", "missing-a.npz", "missing-b.npz"]
        assert cli.main() == 2  # the files are not there: one line, exit 2
        print("frozen", gc.get_freeze_count())
        """
    )
    assert int(out.split("frozen ")[1].split()[0]) > 1000, out

    before = gc.get_freeze_count()
    assert cli.main(["diff", "missing-a.npz", "missing-b.npz"]) == 2
    # a frozen object may yet be freed by its count of references, never frozen afterwards but by a freeze
    assert gc.get_freeze_count() <= before, "a command called from Python froze its caller's objects"


@pytest.mark.slow  # imports torch and the API in a process of its own
def test_a_heavy_work_process_freezes_its_imports_and_a_server_importing_the_module_does_not():
    started = _python(
        """
        import gc, os, runpy
        runpy.run_module("attnviz.jobs", run_name="__main__")  # python -m attnviz.jobs: serves stdin to its end
        os.write(2, f"frozen {gc.get_freeze_count()}".encode())
        """
    )
    assert int(started.split("frozen ")[1].split()[0]) > 100_000, started  # torch and the API

    imported = _python("import gc, attnviz.jobs; print('frozen', gc.get_freeze_count())")
    assert imported.split() == ["frozen", "0"], imported


def test_freeze_once_freezes_the_first_time_only():
    out = _python(
        """
        import gc
        from attnviz.startup import freeze_once

        assert gc.get_freeze_count() == 0
        freeze_once()
        first = gc.get_freeze_count()
        made = [[i] for i in range(5000)]
        freeze_once()
        print("counts", first, gc.get_freeze_count())
        """
    )
    first, second = map(int, re.search(r"counts (\d+) (\d+)", out).groups())
    assert first > 1000 and second <= first, out


@pytest.mark.slow  # a process that imports Streamlit, torch and the API
def test_the_app_server_freezes_as_its_first_page_begins_and_not_again():
    out = _python(
        """
        import gc
        from streamlit.testing.v1 import AppTest

        app = AppTest.from_file("app.py", default_timeout=120)
        app.run()
        assert not app.exception, app.exception
        first = gc.get_freeze_count()
        app.run()
        print("counts", first, gc.get_freeze_count())
        """
    )
    first, second = map(int, re.search(r"counts (\d+) (\d+)", out).groups())
    assert first > 100_000 and second <= first, out  # torch's and Streamlit's objects; no second freeze
