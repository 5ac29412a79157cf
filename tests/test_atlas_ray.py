"""The Ray engine gives the local engine's atlas, on a local 2-CPU Ray started and stopped here."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import attnviz
from attnviz.atlas import build_atlas, write_atlas
from attnviz.atlas.ray_engine import LOCAL_ONLY, NO_PROGRESS, connected
from attnviz.cli import main
from attnviz.errors import AtlasError

os.environ.setdefault(LOCAL_ONLY, "0")  # Ray's servers on 127.0.0.1 only; read when Ray is imported
ray = pytest.importorskip("ray", reason='the Ray engine needs Ray: pip install -e ".[ray]"')

LINES = ["twenty-one", "", "Thursday, July 2, 1998", "$1,234.50", "7/2/98", "3:45 PM", "one hundred"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _ray_pids() -> list[int]:
    node = ray._private.worker._global_node
    return [p.process.pid for procs in node.all_processes.values() for p in procs]


@pytest.fixture(scope="class")
def local_ray():
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    pids = _ray_pids()
    try:
        yield
    finally:
        ray.shutdown()
    left = [pid for pid in pids if _alive(pid)]
    assert not left, f"Ray left processes running: {left}"


@pytest.mark.slow
class TestOnALocalRay:
    """One local 2-CPU Ray, started and stopped here, for these tests in turn (each start costs seconds): the
    engine uses a Ray its caller started, and leaves it running. The test whose actors wait on held CPUs is last."""

    def test_the_ray_engine_equals_the_local_engine(self, local_ray, tmp_path):
        corpus = tmp_path / "corpus.txt"
        corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
        bundle = attnviz.load("en-de", device="cpu")
        kwargs = dict(batch_size=2, shard_size=3)
        local = build_atlas(bundle, corpus, tmp_path / "local", engine="local", **kwargs)
        remote = build_atlas(bundle, corpus, tmp_path / "ray", engine="ray", **kwargs)
        assert remote.manifest["engine"] == "ray" and remote.manifest["versions"]["ray"] == ray.__version__
        assert (
            remote.manifest["counts"]
            == local.manifest["counts"]
            == {
                "lines": 7,
                "sentences": 6,
                "skipped": {
                    "empty": 1,
                    "too_long": 0,
                    "not_utf8": 0,
                    "empty_target": 0,
                    "target_too_long": 0,
                    "unknown": 0,
                    "unknown_target": 0,
                },
            }
        )
        assert ray.is_initialized(), "a Ray the caller started is left running"
        for name in ("sentences", "heads", "distances", "mds", "inputs"):
            ours, theirs = getattr(local, name), getattr(remote, name)
            numbers = ours.select_dtypes("number").columns
            pd.testing.assert_frame_equal(ours.drop(columns=numbers), theirs.drop(columns=numbers), check_like=False)
            got, want = (frame[numbers].astype("float64").to_numpy() for frame in (theirs, ours))  # NA becomes NaN
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=name)

    def test_an_error_raised_in_an_actor_ends_the_run_with_its_own_line(self, local_ray, tmp_path):
        """A node that sees another model folder (its checkpoint's hash is not the driver's): the actor's own
        AtlasError, one line naming the node; not "the cluster gave up", and no traceback."""
        corpus = tmp_path / "corpus.txt"
        _reverse_corpus(corpus, 5)
        bundle = attnviz.load("reverse", device="cpu")
        elsewhere = dataclasses.replace(bundle, sha256="0" * 64)  # the driver's model is not the one the nodes load
        with pytest.raises(AtlasError) as caught:
            write_atlas(elsewhere, corpus, tmp_path / "out", engine="ray", batch_size=2)
        message = str(caught.value)
        assert "\n" not in message and "Traceback" not in message, message
        assert message.startswith("on node 127.0.0.1: the model folder ") and "is not the driver's" in message, message

    def test_device_cuda_on_a_cluster_without_gpus_is_refused_before_anything_is_written(
        self, local_ray, tmp_path, capsys
    ):
        """The driver needs no GPU of its own (the nodes run the model), and the plan comes before the folder."""
        corpus, out = tmp_path / "corpus.txt", tmp_path / "out"
        _reverse_corpus(corpus, 5)
        args = ["atlas", "--model", "reverse", "--device", "cuda", "--engine", "ray", "--corpus", str(corpus)]
        assert main([*args, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert (
            err.count("\n") == 1 and "no node of the Ray cluster has a GPU and a CPU (nodes: 2 CPUs and 0 GPUs)" in err
        )
        assert not out.exists()

    def test_a_cluster_whose_cpus_other_work_holds_stops_with_a_line_to_act_on(self, local_ray, tmp_path, monkeypatch):
        """Every CPU held by another job: the actors wait to be placed. The run stops once no batch came back
        for the set time (`NO_PROGRESS_S`, 10 minutes; Ray Data's own default is 30), saying what each actor
        asks for. Here 1 s: no batch can come whatever the wait (the test took 6.3 s with 5, 2.2 with 1)."""

        @ray.remote(num_cpus=2)
        class Holder:
            def ready(self) -> bool:
                return True

        holder = Holder.remote()
        ray.get(holder.ready.remote())
        corpus = tmp_path / "corpus.txt"
        _reverse_corpus(corpus, 5)
        monkeypatch.setenv(NO_PROGRESS, "1")
        try:
            with pytest.raises(AtlasError) as caught:
                write_atlas(attnviz.load("reverse", device="cpu"), corpus, tmp_path / "out", engine="ray")
        finally:
            ray.kill(holder)
        message = str(caught.value)
        assert "\n" not in message, message
        assert message.startswith("no batch came back from the Ray cluster for 1 s (ExecutionTimeoutError)"), message
        assert "each of 1 actors asks for 2 CPU" in message and message.endswith("run the same command again to resume")


def test_an_address_where_nothing_answers_is_one_line_without_waiting_on_ray(monkeypatch):
    """Ray itself would try to reach a GCS that is not there again and again."""
    from ray_cluster import free_port

    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    with pytest.raises(AtlasError, match=r"^nothing answers at RAY_ADDRESS=.*127\.0\.0\.1:\d+ \(Connection refused\)"):
        with connected("cpu"):
            pass
    assert not ray.is_initialized()


@pytest.fixture
def gone_cluster(monkeypatch):
    """The address a `ray start` on this machine wrote down, its cluster since stopped, in a Ray folder of
    this test's own (RAY_TMPDIR; short: Ray's socket paths must fit)."""
    from ray_cluster import free_port

    folder = Path(tempfile.mkdtemp(prefix="ray-"))
    gone = f"127.0.0.1:{free_port()}"
    (folder / "ray").mkdir()
    (folder / "ray" / "ray_current_cluster").write_text(gone)
    monkeypatch.setenv("RAY_TMPDIR", str(folder))
    yield gone
    shutil.rmtree(folder, ignore_errors=True)


def test_ray_address_auto_where_the_last_ray_start_is_gone_is_one_line_without_waiting_on_ray(
    gone_cluster, monkeypatch
):
    """What `ray start` wrote down on this machine, its cluster since stopped: Ray would wait on it for minutes."""
    monkeypatch.setenv("RAY_ADDRESS", " auto ")
    with pytest.raises(
        AtlasError, match=rf"^nothing answers at RAY_ADDRESS=auto \({gone_cluster}\) \(Connection refused\)"
    ):
        with connected("cpu"):
            pass
    assert not ray.is_initialized() and os.environ["RAY_ADDRESS"] == " auto ", "the environment as it was"


@pytest.mark.slow
@pytest.mark.parametrize("address", [None, "local"])
def test_without_ray_address_a_ray_of_its_own_starts_never_the_last_ray_starts(address, gone_cluster, monkeypatch):
    """ray.init() with no address joins the cluster the last `ray start` on the machine wrote down (or waits
    on it when it is gone): the engine starts a Ray of its own, and stops every process of it."""
    if address is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", address)  # Ray's own word for a Ray of its own
    monkeypatch.delenv(LOCAL_ONLY)  # set for the Ray this module imported; the engine sets it for its own
    with connected("cpu") as plan:
        assert ray.get_runtime_context().gcs_address != gone_cluster
        assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:"), "a Ray on 127.0.0.1 only"
        assert plan.device == "cpu" and plan.actors >= 1
        pids = _ray_pids()
    assert not ray.is_initialized()
    assert LOCAL_ONLY not in os.environ, "Ray's single-machine switch is not left to this process's children"
    assert os.environ.get("RAY_ADDRESS") == address
    assert not [pid for pid in pids if _alive(pid)], "the Ray it started is stopped"


def test_a_failed_ray_run_ends_with_one_line_that_says_what_to_do():
    from ray.data.exceptions import ExecutionTimeoutError

    from attnviz.atlas.ray_engine import one_line
    from attnviz.errors import AtlasError

    for lost in (ray.exceptions.ActorDiedError(), ray.exceptions.NodeDiedError("node gone"), ExecutionTimeoutError()):
        message = str(one_line(lost))
        assert "\n" not in message and message.endswith("run the same command again to resume"), message
        assert type(lost).__name__ in message
    theirs = AtlasError("the model folder m on this node is not the driver's (checkpoint hash differs)")
    wrapped = ray.exceptions.RayTaskError("AtlasWorker.__init__", "Traceback ...\nlong", theirs)
    assert str(one_line(wrapped)) == str(theirs), "an actor's own attnviz error keeps its message"
    both = wrapped.as_instanceof_cause()  # Ray's copy, an AtlasError too, whose text is the traceback
    assert isinstance(both, AtlasError) and str(one_line(both)) == str(theirs)
    padded = AtlasError("\n\x1b[31mthe real line\x1b[0m\nFailed to apply UDF transform after 1/1 attempts")
    assert str(one_line(ray.exceptions.RayTaskError("f", "tb", padded))) == "the real line"
    try:
        try:
            raise theirs
        except AtlasError as e:
            raise ray.exceptions.ActorDiedError() from e
    except ray.exceptions.RayError as died:
        assert str(one_line(died)) == str(theirs)


def test_an_actors_own_failure_that_is_not_attnviz_is_named_not_blamed_on_the_cluster():
    """Out of memory in a batch, or a node whose install is broken: the same run would fail again, so the
    line names what the actor raised (without Ray's colours) rather than "the cluster gave up ... resume"."""
    from attnviz.atlas.ray_engine import one_line

    oom = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    task = ray.exceptions.RayTaskError("\x1b[36mray::MapWorker.submit()\x1b[39m", "Traceback ...", oom, ip="10.0.0.7")
    for error, node in ((task, " on node 10.0.0.7"), (task.as_instanceof_cause(), "")):  # Ray's copy has no ip
        message = str(one_line(error))
        assert message.startswith(f"an actor failed{node} (RuntimeError: CUDA out of memory. Tried to"), message
        assert "\n" not in message and "\x1b" not in message and "once that is mended" in message, message
    traceback = (
        "\x1b[36mray::MapWorker.__init__()\x1b[39m (pid=1, ip=10.0.0.8)\nTraceback (most recent call last):\n"
        "  File \"worker.py\", line 3, in <module>\nModuleNotFoundError: No module named 'attnviz'"
    )
    died = ray.exceptions.ActorDiedError.from_task_error(ray.exceptions.RayTaskError("init", traceback, ImportError()))
    message = str(one_line(died))
    assert "an actor failed (ModuleNotFoundError: No module named 'attnviz'); " in message, message
    assert "\n" not in message and "\x1b" not in message, message


# ---------------------------------------------------------------------------------------------
# A real cluster: two nodes of one CPU each on 127.0.0.1, started with `ray start`, driven through the CLI


def _reverse_corpus(path, n: int) -> None:
    """``n`` lines of the `reverse` model's task (3 to 8 letters): every one usable, the model small and quick."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    path.write_text("".join(" ".join(rng.choice(letters, rng.integers(3, 9))) + "\n" for _ in range(n)))


N_LINES = 1100  # shards of 512: 512, 512, 76 (the CLI's shard size)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A head and a worker node, one CPU each, in their own Ray folder (short: Ray's socket paths must fit);
    every Ray process they started is stopped by id at the end, and none may be left."""
    from ray_cluster import RayCluster

    # Not under pytest's base folder: with parallel workers (…/popen-gw1/…) a Ray socket's path passed
    # the 107 bytes a Unix socket's name may have.
    folder = Path(tempfile.mkdtemp(prefix="ray-"))
    cluster = RayCluster(folder)
    try:
        cluster.add_node(cpus=1)
        cluster.add_node(cpus=1)
        yield cluster
    finally:
        # SIGKILL after 3 s: some process waited out the whole 10 s at every teardown, and no test needs a clean exit
        cluster.stop(timeout=3)
        shutil.rmtree(folder, ignore_errors=True)
    assert not cluster.pids()


@pytest.fixture(scope="module")
def reverse_local(tmp_path_factory):
    """The corpus and the local engine's atlas of it (the reference)."""
    root = tmp_path_factory.mktemp("atlas")
    corpus = root / "corpus.txt"
    _reverse_corpus(corpus, N_LINES)
    build_atlas(attnviz.load("reverse", device="cpu"), corpus, root / "local")
    return corpus, root / "local"


def _cli(corpus, out, address: str) -> list[str]:
    from ray_cluster import cluster_env

    command = [sys.executable, "-m", "attnviz.cli", "atlas", "--model", "reverse", "--device", "cpu"]
    return command + ["--corpus", str(corpus), "--out", str(out), "--engine", "ray"], cluster_env(address)


def _same_files(ours, theirs) -> None:
    """The two atlas folders hold the same files, table by table within the engines' tolerance (1e-5)."""
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
    for name in ("sentences", "heads", "distances", "mds", "inputs"):
        want, got = (pd.read_parquet(folder / f"{name}.parquet") for folder in (ours, theirs))
        numbers = want.select_dtypes("number").columns
        pd.testing.assert_frame_equal(want.drop(columns=numbers), got.drop(columns=numbers), obj=name)
        assert list(want.columns) == list(got.columns), name
        np.testing.assert_allclose(
            got[numbers].astype("float64").to_numpy(), want[numbers].astype("float64").to_numpy(), atol=1e-5, rtol=0
        )


@pytest.mark.slow
def test_the_cli_on_a_two_node_cluster_equals_the_local_engine(two_nodes, reverse_local, tmp_path):
    corpus, local = reverse_local
    command, env = _cli(corpus, tmp_path / "ray", two_nodes.address)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{N_LINES} sentences of {N_LINES} lines" in result.stdout
    # Ray Data's own plan, timings and progress-bar notice stay in its log files, not the command's output
    ray_data_lines = [line for line in result.stderr.splitlines() if "\tINFO " in line or "\tWARNING " in line]
    assert not ray_data_lines, result.stderr
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert manifest["engine"] == "ray" and manifest["shards"] == 3 and len(manifest["runs"]) == 1
    _same_files(local, tmp_path / "ray")


@pytest.mark.slow
def test_a_node_lost_mid_run_loses_no_shard_and_writes_none_twice(two_nodes, reverse_local, tmp_path):
    """Kill the worker node's raylet once the first shard is written. Runs after the test above, on its cluster."""
    corpus, local = reverse_local
    out = tmp_path / "ray"
    command, env = _cli(corpus, out, two_nodes.address)
    written: dict[str, set[int]] = {}  # shard file -> the inodes seen: a file written twice has two
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = False
    deadline = time.monotonic() + 900
    while run.poll() is None and time.monotonic() < deadline:
        for path in (out / "shards").glob("*.parquet") if (out / "shards").is_dir() else []:
            try:
                written.setdefault(path.name, set()).add(path.stat().st_ino)
            except FileNotFoundError:
                pass
        if not killed and any(name.endswith(".sentences.parquet") for name in written):
            os.kill(two_nodes.raylet(1), signal.SIGKILL)
            killed = True
        time.sleep(0.05)
    stdout, stderr = run.communicate(timeout=60)
    assert killed, f"the run ended before its first shard was seen: {stderr[-3000:]}"
    runs = 1
    if run.returncode != 0:  # stopped: one clear line, then the same command resumes
        ours = [line for line in stderr.splitlines() if line.startswith("attnviz: error:")]
        assert len(ours) == 1 and "run the same command again" in ours[0], (
            f"exit status {run.returncode}, standard output {stdout[-500:]!r}, standard error: {stderr[-3000:]}"
        )
        again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
        assert again.returncode == 0, again.stderr[-3000:]
        runs = 2
    print(f"node lost mid-run: the atlas finished in {runs} run(s)")  # which of the two outcomes (pytest -s)
    assert not [name for name, inodes in written.items() if len(inodes) > 1], f"written twice: {written}"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and len(manifest["runs"]) == runs
    _same_files(local, out)
