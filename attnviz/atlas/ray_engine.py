"""The Ray engine: the atlas's batches as Ray Data batch inference, the model held by actors.

The driver reads and tokenises the corpus and cuts it into shards and batches exactly as the
local engine does (`attnviz.atlas.corpus.batch_plan`, padding kept small); Ray Data then
streams the batches, one dataset row each, through ``map_batches`` into a pool of
`AtlasWorker` actors, each loading the model once and running
`attnviz.atlas.engine.run_batch`, the very function of the local engine, on the very same
batches. Results come back as bytes (numpy arrays and JSON, no pickle) and the driver writes each
shard as soon as all its batches are in. The corpus comes chunk by chunk
(`attnviz.atlas.corpus.read_chunks`), one dataset per chunk, so the driver and the object store
hold one chunk's batches at a time.

Actors are sized from the nodes, never from the cluster's total: Ray places an actor only on a
node that holds everything it asks for (`plan_actors` says how).

Without ``RAY_ADDRESS`` in the environment a local Ray of its own is started (dashboard off, every
server on 127.0.0.1 only; never a cluster some earlier ``ray start`` left running) and stopped at the
end; with it, Ray joins that cluster (``auto`` or the head's ``HOST:PORT``, from a node of the
cluster: Ray Data does not run through Ray Client's ``ray://``), after checking that something
answers there. A Ray the caller has already started with ``ray.init`` is used as it is, and left
running. `connected` does all that, and plans the actors, before the caller reads any corpus or
writes anything. Every node must see the model folder at the same path (a shared file system), and
have attnviz and Ray installed: ``pip install "attnviz[ray]"``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import socket
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnviz.atlas.corpus import Sentence, batch_plan
from attnviz.atlas.engine import BatchResult, run_batch
from attnviz.checkpoints import load_checkpoint
from attnviz.errors import AtlasError, AttnvizError

CPUS_PER_ACTOR = 4  # torch threads per CPU actor: fewer, larger actors hold fewer copies of the model
LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# How long a run may go without a batch coming back before it stops with a line to act on: Ray Data's
# own default is 30 minutes, as long as a dataset whose actors no node has room for stays silent. Ray's
# own variable, where it is set, wins.
NO_PROGRESS_S = 600
NO_PROGRESS = "RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S"
REACH_S = 5  # seconds to wait for RAY_ADDRESS to answer before saying nothing does

log = logging.getLogger(__name__)


def _sentences_json(sentences: Sequence[Sentence]) -> str:
    return json.dumps(
        [[s.line, s.src, s.src_ids, s.src_tokens, s.tgt_ids, s.tgt_tokens] for s in sentences], ensure_ascii=False
    )


def _sentences_from_json(text: str) -> tuple[Sentence, ...]:
    def tuple_or_none(x):
        return None if x is None else tuple(x)

    return tuple(
        Sentence(int(line), str(src), tuple(ids), tuple(tokens), tuple_or_none(tgt_ids), tuple_or_none(tgt_tokens))
        for line, src, ids, tokens, tgt_ids, tgt_tokens in json.loads(text)
    )


def encode_result(result: BatchResult) -> bytes:
    """A BatchResult as .npz bytes: arrays, and the sentences as JSON. Never pickled."""
    arrays = {f"stats/{k}": v for k, v in result.stats.items()}
    arrays |= {f"divergences/{k}": v for k, v in result.divergences.items()}
    arrays["sentences"] = np.array(_sentences_json(result.sentences))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def decode_result(data: bytes) -> BatchResult:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        sentences = _sentences_from_json(str(z["sentences"]))
        stats = {name.split("/", 1)[1]: z[name] for name in z.files if name.startswith("stats/")}
        divergences = {name.split("/", 1)[1]: z[name] for name in z.files if name.startswith("divergences/")}
    return BatchResult(sentences, stats, divergences)


def _rows(shards: dict[int, Sequence[Sentence]], batch_size: int) -> list[dict]:
    """One dataset row per batch, with its shard's number and its own within the shard: the local
    engine's batches (run_local)."""
    return [
        {"shard": shard, "batch": number, "sentences": _sentences_json(batch)}
        for shard, sentences in shards.items()
        for number, batch in enumerate(batch_plan(sentences, batch_size))
    ]


def _node_address() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - only a name for the message
        return "?"


class AtlasWorker:
    """A Ray actor holding one copy of the model; called by ``map_batches`` with rows that are batches."""

    def __init__(self, checkpoint: str, sha256: str, device: str, precision: str, threads: int):
        # An error here is kept and raised by the first call: raised in the constructor it reaches the
        # driver as the actor's death, its message lost in a traceback's text (Ray 2.60), where a call's
        # error comes back as it is (raise_original_map_exception).
        self.error = None
        try:
            torch.set_num_threads(threads)
            self.bundle = load_checkpoint(checkpoint, device)
            if self.bundle.sha256 != sha256:
                raise AtlasError(
                    f"the model folder {checkpoint} on this node is not the driver's (checkpoint hash differs): "
                    "every node must see the same model"
                )
        except AttnvizError as e:
            self.error = f"on node {_node_address()}: {_first_line(e, None)}"
        except Exception as e:  # noqa: BLE001 - the node's own trouble (no GPU memory, a broken install): said as it is
            self.error = (
                f"on node {_node_address()}: the model could not be loaded ({type(e).__name__}: {_first_line(e)})"
            )
        self.precision = precision

    def __call__(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Each row's batch run as it is (``map_batches`` hands over one row at a time)."""
        if self.error is not None:
            raise AtlasError(self.error)
        results = [
            run_batch(self.bundle, _sentences_from_json(str(text)), self.precision) for text in rows["sentences"]
        ]
        payloads = [encode_result(r) for r in results]
        return pd.DataFrame({"shard": rows["shard"].to_numpy(), "batch": rows["batch"].to_numpy(), "payload": payloads})


@dataclass(frozen=True)
class ActorPlan:
    """How many actors of what size the atlas runs on a cluster."""

    resources: dict  # what each actor asks Ray for: num_cpus, and num_gpus on GPUs
    actors: int  # how many
    threads: int  # torch threads per actor
    device: str  # "cpu" or "cuda"


RAY_DEVICES = ("auto", "cpu", "cuda")  # where actors can run (`plan_actors`); `write_atlas` checks its ray_device


def plan_actors(nodes: Sequence[dict], device: str) -> ActorPlan:
    """The actors for live nodes whose resources are ``nodes`` (each ``{"CPU": n, "GPU": m}``, as
    ``ray.nodes()`` gives them), on ``device`` ("cpu", "cuda" or "auto"); AtlasError when none fits.

    On GPUs, one actor per GPU of any node with a CPU beside each (a node of 4 GPUs and 2 CPUs holds
    2). On CPUs every actor has the same size, the largest of at most `CPUS_PER_ACTOR` CPUs that
    leaves the fewest CPUs idle over all the nodes: nodes of 4 and 2 CPUs get 3 actors of 2, nodes of
    1 CPU one actor each, nodes of 3 and 4 CPUs 7 actors of 1 (each holds its own copy of the model:
    more copies, no CPU idle). Actors of one size fit the nodes exactly (each node takes its CPUs //
    size of them), which Ray Data's pool, of one size, needs.
    """
    if device not in RAY_DEVICES:  # the model's own device, when no other is asked for: "mps"
        raise AtlasError(
            f"the Ray engine runs its actors on CPUs or CUDA GPUs, not {device}: use --device cpu, cuda or auto"
        )
    cpus = [int(node.get("CPU", 0)) for node in nodes]
    gpus = [int(node.get("GPU", 0)) for node in nodes]
    shapes = ", ".join(f"{c} CPUs and {g} GPUs" for c, g in zip(cpus, gpus, strict=True)) or "none"
    if device in ("cuda", "auto"):
        on_gpus = sum(min(c, g) for c, g in zip(cpus, gpus, strict=True))  # each actor: a GPU and a CPU
        if on_gpus:
            return ActorPlan({"num_gpus": 1, "num_cpus": 1}, on_gpus, 1, "cuda")
        if device == "cuda":
            raise AtlasError(
                f"--device cuda was asked for but no node of the Ray cluster has a GPU and a CPU (nodes: {shapes}); "
                "use --device cpu or auto"
            )
    if not any(cpus):
        raise AtlasError(f"no node of the Ray cluster has a CPU for an actor (nodes: {shapes}); start nodes with CPUs")
    size = max(range(1, CPUS_PER_ACTOR + 1), key=lambda d: (sum(c // d * d for c in cpus), d))
    return ActorPlan({"num_cpus": size}, sum(c // size for c in cpus), size, "cpu")


def _live_nodes() -> list[dict]:
    """The resources of every live node of the cluster Ray is connected to."""
    import ray

    return [node["Resources"] for node in ray.nodes() if node.get("Alive")]


def _where(address: str) -> tuple[str, int] | None:
    """The host and port ``RAY_ADDRESS`` names, to check that something answers there; None for
    ``auto`` (Ray finds the cluster this machine is a node of). AtlasError for an address of no form
    Ray takes, and for Ray Client's ``ray://``, through which Ray Data does not run."""
    if address == "auto":
        return None
    if address.startswith("ray://"):
        # Ray 2.60's Ray Data stops at its first dataset ("'Worker' object has no attribute 'core_worker'"):
        # its executor needs the driver on a node (ray-project/ray#48682, a maintainer's answer)
        raise AtlasError(
            f"Ray Data does not run through Ray Client (RAY_ADDRESS={address}): run attnviz on a node of the "
            "cluster with RAY_ADDRESS=auto, or hand it to the cluster with ray job submit (docs/atlas.md)"
        )
    host, colon, port = address.rpartition(":")
    host = host.strip("[]")  # an IPv6 address in brackets
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in address:
        raise AtlasError(
            f"RAY_ADDRESS must be auto or HOST:PORT (the head node's, e.g. its 6379), on a node of the "
            f"cluster; got {address!r}"
        )
    return host, int(port)


def _resolved(address: str) -> tuple[str, tuple[str, int] | None]:
    """``RAY_ADDRESS`` and the host and port Ray will reach for it: for ``auto``, the cluster the last
    ``ray start`` on this machine wrote down, as Ray itself reads it (AtlasError where there is none)."""
    where = _where(address)
    if where is not None:
        return address, where
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die
    except ImportError:  # another Ray than the one this was written against: Ray finds it alone
        return address, None
    try:
        found = canonicalize_bootstrap_address_or_die("auto")
    except (ConnectionError, ValueError) as e:
        raise AtlasError(
            f"RAY_ADDRESS=auto finds no Ray cluster on this machine ({_first_line(e)}): run the command on a "
            "node of the cluster, or leave RAY_ADDRESS unset for a local Ray"
        ) from None
    return f"auto ({found})", _where(found)


def _check_reachable(resolved: tuple[str, tuple[str, int] | None]) -> None:
    """One line when nothing answers where ``RAY_ADDRESS`` leads: Ray itself would try again for minutes."""
    address, where = resolved
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=REACH_S).close()
    except OSError as e:
        raise AtlasError(
            f"nothing answers at RAY_ADDRESS={address} ({e.strerror or type(e).__name__}): start the cluster "
            "(ray start --head) or correct the address; without RAY_ADDRESS a local Ray is started"
        ) from None


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Ray colours the names in its messages


def _first_line(error: BaseException, limit: int | None = 300) -> str:
    """The first line of an error's text that says something, without colours, at most ``limit``
    characters (an attnviz error's own line whole: Ray Data adds lines below it, how often it tried)."""
    lines = [line.strip() for line in ANSI.sub("", str(error)).splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__)[:limit]


@contextmanager
def connected(device: str) -> Iterator[ActorPlan]:
    """Ray ready for the atlas (connected or started, as the module says) and the actors planned for
    its live nodes on ``device`` (`plan_actors`): AtlasError of one line for a Ray not installed, an
    address of no form Ray Data can use, one where nothing answers or that Ray refuses, or a cluster
    no actor fits. Ray Data's settings for the run (progress bars off, an actor's own errors raised
    as they are, `NO_PROGRESS_S`) hold inside only, as do the environment variables set for Ray; a
    Ray started here is stopped at the end."""
    no_progress = _no_progress_s()
    address = os.environ.get("RAY_ADDRESS", "").strip()
    address = "" if address == "local" else address  # Ray's own word for a Ray of its own
    environment = {name: os.environ.get(name) for name in ("RAY_ADDRESS", LOCAL_ONLY)}
    try:
        if address:
            os.environ["RAY_ADDRESS"] = address  # ray.init reads it again, spaces and all
        else:
            os.environ.pop("RAY_ADDRESS", None)
            # Ray's own switch for a single-machine Ray (meant for laptops): its node address becomes
            # 127.0.0.1 and every server it starts listens there only. Read when Ray is imported.
            os.environ.setdefault(LOCAL_ONLY, "0")
        with _ray_ready(address, device, no_progress) as plan:
            yield plan
    finally:
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _ray_ready(address: str, device: str, no_progress: float) -> Iterator[ActorPlan]:
    try:
        import ray
    except ImportError:
        raise AtlasError('the Ray engine needs Ray: pip install "attnviz[ray]" (or pip install ray)') from None
    started = not ray.is_initialized()
    if started:
        if address:
            _check_reachable(_resolved(address))
        # "local": a Ray of its own, never the cluster the last `ray start` on this machine wrote down
        # (ray.init() would join that one, or wait on it when it is gone); its node on 127.0.0.1 even
        # where Ray was imported before the switch above was set.
        local = {} if address else {"include_dashboard": False, "_node_ip_address": "127.0.0.1"}
        try:
            ray.init(address=address or "local", logging_level=logging.ERROR, log_to_driver=False, **local)
        except Exception as e:  # noqa: BLE001 - Ray's own refusals (ConnectionError, RuntimeError, ValueError, ...)
            where = f"the Ray cluster at RAY_ADDRESS={address}" if address else "a local Ray"
            raise AtlasError(f"could not start or join {where}: {_first_line(e)}") from None
    try:
        import ray.data  # first: importing it configures its logger, at DEBUG with a console handler

        # Ray Data's plan, timings and its own account of a failure (a traceback) to its log file only:
        # the failure reaches the caller as an exception, and the command prints one line of it
        consoles = [h for h in logging.getLogger("ray.data").handlers if isinstance(h, logging.StreamHandler)]
        levels = [h.level for h in consoles]
        for handler in consoles:
            handler.setLevel(logging.CRITICAL + 1)
        context = ray.data.DataContext.get_current()
        settings = {
            "enable_progress_bars": False,  # the CLI draws its own
            "raise_original_map_exception": True,  # an actor's AtlasError, not Ray's UserCodeException
            "execution_no_progress_timeout_s": no_progress,
        }
        before = {name: getattr(context, name) for name in settings}
        for name, value in settings.items():
            setattr(context, name, value)
        try:
            plan = plan_actors(_live_nodes(), device)
            log.info("Ray engine: %d actors of %s", plan.actors, plan.resources)
            yield plan
        finally:
            for name, value in before.items():
                setattr(context, name, value)
            for handler, level in zip(consoles, levels, strict=True):
                handler.setLevel(level)
    finally:
        if started:
            ray.shutdown()


def run_ray(
    plan: ActorPlan,
    checkpoint: Path,
    sha256: str,
    chunks: Iterable[dict[int, Sequence[Sentence]]],
    batch_size: int,
    precision: str,
    on_batch: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, list[BatchResult]]]:
    """(shard number, its batches' results) for every shard of ``chunks`` (per chunk of the corpus,
    its shards by number), as each one completes: one Ray dataset per chunk, chunks read one at a
    time, on the actors of ``plan`` (inside `connected`, which made it)."""
    import ray
    from ray.data.exceptions import ExecutionTimeoutError

    for shards in chunks:
        if shards:
            try:
                yield from _run_chunk(ray, plan, checkpoint, sha256, shards, batch_size, precision, on_batch)
            except (ray.exceptions.RayError, ExecutionTimeoutError) as e:  # an actor's error, a node lost, a stall
                raise one_line(e, plan) from None


def one_line(error: BaseException, plan: ActorPlan | None = None) -> AtlasError:
    """The one line a failed Ray run ends with: an attnviz error raised in an actor (a node that sees
    another model) with its own message; any other error of an actor's own code (out of memory, a
    broken install on a node) by its type and first line; no batch back for `NO_PROGRESS_S` as what
    to check; anything else (a node lost for good, a dataset Ray gave up on) as a failure of the
    cluster, whose written shards the same command resumes from."""
    import ray
    import ray.data
    from ray.data.exceptions import ExecutionTimeoutError

    resume = "the shards written are kept: run the same command again to resume"
    theirs = None  # the first exception of an actor's own code, not Ray's: "Type: first line"
    seen, todo = set(), [error]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        cause = getattr(e, "cause", None)  # a RayTaskError's: the actor's exception itself
        for candidate in (cause, e):
            if isinstance(candidate, AttnvizError) and not isinstance(candidate, ray.exceptions.RayError):
                return AtlasError(_first_line(candidate, None))  # not Ray's copy (both at once), which has a traceback
        if theirs is None and isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
            theirs = f"{type(cause).__name__}: {_first_line(cause)}"
        if theirs is None and getattr(e, "actor_init_failed", False):  # only the text of what it raised is kept
            theirs = _last_raised(str(e))
        todo += [cause, e.__cause__, e.__context__]
    if isinstance(error, ExecutionTimeoutError):
        asks = "" if plan is None else f" (each of {plan.actors} actors asks for {_asks(plan)})"
        seconds = ray.data.DataContext.get_current().execution_no_progress_timeout_s  # what the run waited
        return AtlasError(
            f"no batch came back from the Ray cluster for {seconds:g} s (ExecutionTimeoutError): "
            f"no node may have room for an actor{asks} while other work holds its CPUs, or a node stopped "
            f"answering (set {NO_PROGRESS} to wait longer); {resume}"
        )
    if theirs is not None:
        where = getattr(error, "ip", None)
        return AtlasError(
            f"an actor failed{f' on node {where}' if where else ''} ({theirs}); the shards written are kept: "
            "once that is mended, the same command resumes"
        )
    return AtlasError(f"the Ray cluster gave up on the work ({type(error).__name__}: {_first_line(error)}); {resume}")


RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): (.+)$")


def _last_raised(text: str) -> str | None:
    """ "Type: message" of the last exception a traceback's text names (an actor that died starting)."""
    for line in reversed(ANSI.sub("", text).splitlines()):
        found = RAISED.match(line.strip())
        if found:
            return f"{found[1].rsplit('.', 1)[-1]}: {found[2][:300]}"
    return None


def _no_progress_s() -> float:
    text = os.environ.get(NO_PROGRESS, "").strip()
    try:
        seconds = float(text) if text else float(NO_PROGRESS_S)
    except ValueError:
        seconds = float("nan")
    if not (seconds == -1 or 0 < seconds < float("inf")):
        raise AtlasError(f"{NO_PROGRESS} must be a number of seconds, or -1 for no limit; got {text[:40]!r}")
    return seconds


def _asks(plan: ActorPlan) -> str:
    return " and ".join(f"{n} {what.removeprefix('num_').upper()}" for what, n in plan.resources.items())


def _run_chunk(ray, plan: ActorPlan, checkpoint, sha256, shards, batch_size, precision, on_batch):
    """One chunk's shards through a pool of ``plan``'s actors; (shard, results) as each shard completes."""
    dataset = ray.data.from_items(_rows(shards, batch_size))
    results = dataset.map_batches(
        AtlasWorker,
        fn_constructor_kwargs={
            "checkpoint": str(checkpoint),
            "sha256": sha256,
            "device": plan.device,
            "precision": precision,
            "threads": plan.threads,
        },
        batch_size=1,  # a row is a batch already
        batch_format="pandas",
        compute=ray.data.ActorPoolStrategy(size=plan.actors),
        **plan.resources,
    )
    waiting = {shard: len(sentences) for shard, sentences in shards.items()}
    collected: dict[int, dict[int, BatchResult]] = defaultdict(dict)
    for part in results.iter_batches(batch_size=None, batch_format="pandas"):
        for shard, batch, payload in zip(part["shard"], part["batch"], part["payload"], strict=True):
            shard, batch = int(shard), int(batch)
            if shard not in waiting or batch in collected[shard]:  # a retried task's second answer: counted once
                log.warning("batch %d of shard %d came back twice: the second is ignored", batch, shard)
                continue
            result = decode_result(payload)
            collected[shard][batch] = result
            waiting[shard] -= len(result.sentences)
            if on_batch is not None:
                on_batch(len(result.sentences))
            if waiting[shard] == 0:
                del waiting[shard]
                done = collected.pop(shard)
                yield shard, [done[number] for number in sorted(done)]
