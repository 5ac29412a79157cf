"""The computations a server runs away from its visitors' threads, by name, and the worker that runs them.

A Streamlit server runs every session's script in threads of one process, under one GIL. A few
atlases, beam searches or head-importance runs at once held it for tens of seconds: every other
visitor's page, and the health check, waited. `attnviz.app.heavy` admits such work in order
and hands it to worker processes, each reading jobs on its end of a pipe or socket and writing
results on it.

On Linux a server's workers are forked from its fork server (`fork_server`, ``python -m attnviz.jobs
--fork-server FD``): one process that imports torch and the API once, so that a worker, and a worker
replaced after a job overran or died, starts in a fraction of a second where a fresh interpreter
spent seconds importing. Elsewhere each worker is its own ``python -m attnviz.jobs``, reading jobs on
its standard input and writing results on its standard output.

A job is a name in `JOBS` with its arguments (strings, numbers, tuples): a worker runs
nothing else, and loads models itself, by the name or folder the server already accepted. The
pipe carries pickles between a server and the workers it started from this very code; it is
never opened to anything else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import signal
import socket
import struct
import sys
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import IO, Any

from attnviz.settings import number_setting
from attnviz.startup import imports_kept

if __name__ == "__main__" and hasattr(os, "nice"):  # a process of its own: a fork server or a worker
    # Below the server's own threads, a cached page and the health check first; before torch's import, which
    # had run at the server's priority for its first CPU seconds, while a class's first pages were drawn.
    os.nice(10)

# Run as a process of its own (``python -m attnviz.jobs``), these imports are its start's, kept out of the
# garbage collector's passes (attnviz.startup); imported by a server, they are the server's, and left be.
with imports_kept(own_process=__name__ == "__main__"):
    from attnviz import api
    from attnviz.atlas.engine import head_map
    from attnviz.checkpoints.catalog import checkpoint_stamp
    from attnviz.errors import AttnvizError
    from attnviz.lessons import mechanics, rotary, variants

HEADER = struct.Struct("<Q")  # each message: its length, then its pickle
MODELS_KEPT = 2  # models a worker keeps loaded (a class mostly uses one)


@dataclasses.dataclass(frozen=True)
class TextFacts:
    """What a page needs to know of a visitor's text before it computes anything from it."""

    source_tokens: int  # the source's (or prompt's) tokens
    tokens: int  # the longest side's tokens: the source's, or the target's when longer
    maps_bytes: int  # every attention map of it, in float32 ([`attnviz.api.maps_size`][])
    out_of_domain: str | None  # why it looks outside what the model knows ([`attnviz.api.out_of_domain`][])
    refused: str | None = None  # the model's own refusal (empty, too long for it): the page that runs it says so


def text_facts(bundle, src: str, tgt: str | None) -> TextFacts:
    """The `TextFacts` of ``src`` (and ``tgt``): reading it means tokenizing it, which a long text makes slow."""
    cfg = bundle.config
    try:
        source, size = api.maps_size(bundle, src, tgt)
        target, unread = 0, ()
        if tgt is not None and not (cfg.decoder_only or cfg.encoder_only):
            decoder_input = bundle.tokenizer.encode_target(tgt)[0]
            target = len(decoder_input.ids)
            unread = tuple(i for i in decoder_input.ids if i == bundle.tokenizer.unk_id)
        notice = api.out_of_domain(bundle, src)
        if unread:  # the target is the model's input too: the command line refuses it, the app says so
            n = f"{len(unread)} piece{'s' if len(unread) > 1 else ''}"
            said = f"The target has {n} the model cannot read (characters it never saw), read as its unknown token."
            notice = f"{notice} {said}" if notice else said
    except AttnvizError as e:
        return TextFacts(0, 0, 0, None, refused=str(e))
    return TextFacts(source, max(source, target), size, notice)


def _decoding(bundle, src: str, beam: int, tgt: str | None, top_k: int = 8):
    top_k = min(top_k, bundle.config.tgt_vocab_size)  # a model of fewer tokens shows them all
    return api.step_through(bundle, src, beam=beam, top_k=top_k, target=tgt)


def _ablation(bundle, src: str, tgt: str | None, ablate: str, mode: str, words: bool):
    return api.compare_ablation(bundle, src, api.Ablation.parse(ablate, mode), tgt, words=words)


def _importance(bundle, sentences: tuple[str, ...], references: tuple[str, ...] | None):
    return api.head_importance(bundle, list(sentences), None if references is None else list(references))


def _atlas(bundle, sentences: tuple[str, ...], progress=None):
    return api.compute_atlas(bundle, list(sentences), progress=progress)


def _pattern(bundle, src: str, name: str | None, k: int):
    """Source tokens, the pattern's mask (None: the model as trained), the run, and its translation."""
    enc = bundle.tokenizer.encode_source(src)
    mask = None if name is None else variants.pattern(name, len(enc.ids), k)
    run = variants.encode_with_pattern(bundle.model, enc.ids, mask)
    text = None if run.output_ids is None else bundle.tokenizer.decode(run.output_ids)
    return enc.tokens, mask, run, text


def _permutation(bundle, src: str, order: str, seed: int):
    """Tokens, the order, and the check without and with positional encoding."""
    enc = bundle.tokenizer.encode_source(src)
    n = len(enc.ids)
    perm = tuple(range(n - 1, -1, -1)) if order == "reverse" else mechanics.shuffled_order(n, seed)
    checks = {up: mechanics.permutation_check(bundle.model, enc.ids, perm, up) for up in (False, True)}
    return enc.tokens, perm, checks


def torch_ids(bundle, src: str):
    """A prompt's ids (1, T) on the model's device."""
    import torch

    return torch.tensor([bundle.tokenizer.encode_source(src).ids], device=bundle.device)


def _rotary(bundle, src: str, tgt, layer: int, max_offset: int):
    """(the shift check, the score by offset) of a rotary language model's layer, on the prompt ``src``."""
    ids = torch_ids(bundle, src)
    # the last token's query, the first word's key: after the start token where the tokenizer adds one (Llama),
    # the prompt's first token where it adds none (GPT-2, Qwen2)
    starts = ids.shape[1] > 1 and int(ids[0, 0]) == bundle.tokenizer.bos_id
    last, first = ids.shape[1] - 1, 1 if starts else 0
    return rotary.shift_check(bundle, ids, layer), rotary.score_by_offset(bundle, ids, layer, last, first, max_offset)


_TILED: OrderedDict[tuple, Any] = OrderedDict()  # the last texts' queries and keys, for their next layers
TILED_KEPT = 1  # a long text is read in one forward pass; its layers are then fetched one by one
_TILED_LOCK = threading.Lock()  # jobs run in threads too (ATTNVIZ_HEAVY_IN=threads, short texts)


def _tiled_layer(bundle, src: str, tgt: str | None, kind: str, layer: int, thumbnail: int = 96):
    """One layer of a long text's maps, tile by tile ([`attnviz.tiles.TiledAttention.layer_tiles`][]).

    The text's queries and keys are kept for the next layer a page asks for: reading them is one
    forward pass over the whole text, and a page asks for one layer at a time.
    """
    key = (id(bundle), src, tgt)  # the entry holds the bundle too, so its id cannot be another's
    with _TILED_LOCK:
        kept = _TILED.get(key)
    tiled = kept[1] if kept else api.tiled_attention(bundle, src, tgt)
    with _TILED_LOCK:
        _TILED[key] = (bundle, tiled)
        _TILED.move_to_end(key)
        while len(_TILED) > TILED_KEPT:
            _TILED.popitem(last=False)
    return tiled.layer_tiles(kind, layer, thumbnail)


CPU_REPEAT_S = 0.05  # once a live training's CPU time is spent, its signal repeats this often (of CPU time)


class CpuSpent(BaseException):
    """A live training's CPU seconds are spent. A BaseException, as KeyboardInterrupt: no ``except Exception``
    in the training loop can swallow it."""


def live_training(_, task: str, out: str, cpu_seconds: float, history_every: int, recipe: tuple) -> dict:
    """Train ``task`` from scratch into ``out`` (its history every ``history_every`` steps) until this process
    has spent ``cpu_seconds`` of CPU time on it: {"stopped_by": "cpu" or "steps", "cpu_seconds": spent}.

    The bound is the process's own CPU time (user and system, every thread: ``ITIMER_PROF``), not wall
    time, so a busy server makes it slower but no longer: the timer's signal stops the loop where it is,
    and the history keeps every record written before (each is renamed into place whole). Once due, the
    signal comes again every `CPU_REPEAT_S` of CPU time until the loop has stopped: Python drops an
    exception raised while it runs a finaliser or a garbage collector's callback ("Exception ignored
    in ..."), and a one-shot timer whose only signal landed there once let a training run to its last
    step, 340 s on a loaded machine against its 8 CPU seconds. ``recipe``:
    (field, value) pairs that override the task's recipe (`attnviz.training.RECIPES`). Runs in a worker's
    main thread only (Python runs signal handlers there).

    A server that ends (stopped, or killed) while its training runs leaves nobody to read it or delete
    ``out``: the worker notices that its parent has changed, stops the training, deletes ``out`` and exits.
    """
    import shutil
    import signal
    import time

    from attnviz.training.loop import train

    armed = True
    server, orphaned, finished = os.getppid(), threading.Event(), threading.Event()

    def spent(signum, frame) -> None:
        if armed:
            raise CpuSpent

    def watch_server() -> None:
        while not finished.wait(1.0):
            if os.getppid() != server:
                orphaned.set()
                signal.setitimer(signal.ITIMER_PROF, 1e-6, CPU_REPEAT_S)  # the main thread stops as at its bound
                return

    start = time.process_time()
    previous = signal.signal(signal.SIGPROF, spent)
    signal.setitimer(signal.ITIMER_PROF, cpu_seconds, CPU_REPEAT_S)
    threading.Thread(target=watch_server, name="attnviz-live-watch", daemon=True).start()
    stopped_by = "steps"
    try:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):  # its progress bar: not the log
            train(task, out, device="cpu", eval_n=100, history_every=history_every, **dict(recipe))
    except CpuSpent:
        stopped_by = "cpu"
    finally:
        armed = False
        finished.set()
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    if orphaned.is_set():
        shutil.rmtree(out, ignore_errors=True)
        os._exit(0)
    return {"stopped_by": stopped_by, "cpu_seconds": time.process_time() - start}


# name -> function(bundle, *args[, progress]); only ``atlas`` reports progress; ``timing`` takes no model
JOBS: dict[str, Callable[..., Any]] = {
    "attention": lambda b, src, tgt, words=False: api.attention(b, src, tgt, words=words),
    "scores": lambda b, src, tgt: api.attention_scores(b, src, tgt),
    "queries_keys": lambda b, src, tgt, rotated=True: api.queries_keys(b, src, tgt, rotated),
    "forward_pass": lambda b, src, tgt: api.forward_pass(b, src, tgt),
    "decoding": _decoding,
    "attribution": lambda b, src, tgt, method, position, words: api.attribute(
        b, src, tgt, method=method, position=position, words=words
    ),
    "ablation": _ablation,
    "importance": _importance,
    "atlas": _atlas,
    "head_map": head_map,
    "pattern": _pattern,
    "permutation": _permutation,
    "timing": lambda _, d: variants.time_self_attention_vs_gru(d=d, repeats=5),
    "rotary": _rotary,
    "position_kinds": lambda b, src, tgt: rotary.kinds_table(b, torch_ids(b, src) if b.config.decoder_only else None),
    "tiled_layer": _tiled_layer,
    "text_facts": text_facts,
    "warm": lambda b: None,  # load the model before the first visitor needs it
    "live_training": live_training,  # takes no model: it trains one (attnviz.app.live_runs)
}
REPORTS_PROGRESS = {"atlas"}


def run_job(bundle, name: str, args: tuple, progress: Callable[[int, int], None] | None = None) -> Any:
    """Job ``name`` on ``bundle`` with ``args``, where it is called: in a worker or in the server's thread."""
    if name in REPORTS_PROGRESS:
        return JOBS[name](bundle, *args, progress=progress)
    return JOBS[name](bundle, *args)


# ---------------------------------------------------------------------------------------------
# The pipe


def send(out: IO[bytes], message: Any) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(HEADER.pack(len(body)) + body)
    out.flush()


def read_exactly(read: Callable[[int], bytes], n: int) -> bytes | None:
    """``n`` bytes from ``read``, or None at the end of the stream."""
    chunks, left = [], n
    while left:
        chunk = read(min(left, 1 << 24))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(read: Callable[[int], bytes]) -> Any:
    """The next message, or None when the other end has gone."""
    header = read_exactly(read, HEADER.size)
    if header is None:
        return None
    body = read_exactly(read, HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def sendable(error: BaseException) -> BaseException:
    """``error`` if it survives a pickle round trip, else a RuntimeError that says what it was."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any error that cannot travel is described instead
        return RuntimeError(f"{type(error).__name__}: {error}")


def _apply_settings(settings: dict[str, str]) -> None:
    """The server's ATTNVIZ_* settings as they are now (a test or an operator may change them)."""
    for name in [k for k in os.environ if k.startswith("ATTNVIZ_")]:
        if name not in settings:
            del os.environ[name]
    os.environ.update(settings)


def serve(read: Callable[[int], bytes], out: IO[bytes], watch: int | None = None) -> None:
    """Answer jobs until the server closes the pipe: ``("job", name, model, device, args, settings)``.

    ``watch``, the pipe's or socket's file descriptor, is watched while a job runs: the server ends this worker
    by closing its end, and a worker had computed on, for as long as its job took, after its server had died
    (a replica crashed, or killed), beside the replica started in its place.

    Replies: ``("progress", done, total)`` while an atlas runs, then ``("done", result)`` or ``("error", e)``.
    A server that has ended with a message of this worker's unread resets the connection, and one that ends
    while a reply is written breaks it: either way nobody is left to tell, and the worker ends quietly (a
    Ctrl-C in the server's terminal once printed a worker's ConnectionResetError there).
    """
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        _answer(read, out, watch)


WATCH_S = 0.5  # how often a worker looks, while a job runs, whether its server has gone
WATCH_THEIR_SERVER = {"live_training"}  # jobs that watch their server themselves: it deletes its folder first


def _end_when_closed(fd: int, finished: threading.Event) -> None:
    """Until ``finished``: end this process when the other end of ``fd`` has closed. The server writes nothing
    while a job runs, so anything to read on ``fd`` then is its end: a hang-up, or a socket that reads empty."""
    import select

    copy = os.dup(fd)
    try:
        sock = socket.socket(fileno=copy)
    except OSError:  # a pipe: its reader sees a hang-up when the writer closes
        os.close(copy)
        sock = None
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    with contextlib.closing(sock) if sock is not None else contextlib.nullcontext():
        while not finished.is_set():
            for _, events in poller.poll(WATCH_S * 1000):
                if events & (select.POLLHUP | select.POLLERR):
                    os._exit(0)
                if sock is not None and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    os._exit(0)
                finished.wait(WATCH_S)


def _answer(read: Callable[[int], bytes], out: IO[bytes], watch: int | None = None) -> None:
    models: OrderedDict[tuple[str, str, tuple], Any] = OrderedDict()
    send(out, ("ready",))
    while (message := receive(read)) is not None:
        _, name, model, device, args, settings = message
        try:
            _apply_settings(settings)
            if name not in JOBS:
                raise ValueError(f"no job named {name!r}")
            key = (model, device, checkpoint_stamp(model) if model is not None else ())  # a rewritten folder: again
            if model is not None and key not in models:
                models[key] = api.load(model, device)
                while len(models) > MODELS_KEPT:
                    models.popitem(last=False)
            if model is not None:
                models.move_to_end(key)
            bundle = models.get(key)  # None for a job that takes no model
            finished = threading.Event()
            if watch is not None and name not in WATCH_THEIR_SERVER:
                threading.Thread(target=_end_when_closed, args=(watch, finished), daemon=True).start()
            try:
                result = run_job(bundle, name, args, lambda done, total: send(out, ("progress", done, total)))
            finally:
                finished.set()
            reply = ("done", result)
        except Exception as e:  # noqa: BLE001 - the server shows the visitor what went wrong
            reply = ("error", sendable(e))
        send(out, reply)


# ---------------------------------------------------------------------------------------------
# The fork server

PACKET = 1 << 20  # the longest request a fork server reads: a pickled environment is a few kB


def fork_server(control: socket.socket, live_training: bool = False) -> None:
    """Fork a worker for each request on ``control`` (a SOCK_SEQPACKET socket: one message a packet), until the
    server's end closes; then return, and the process ends.

    - ``("fork", environ, cwd)``, with the worker's end of a socket pair attached (SCM_RIGHTS): a child of
      this process takes the server's environment and folder as they are now and serves jobs on that
      socket (`serve`); answered ``("forked", pid)``.
    - ``("wait", pid)``: the worker is reaped (the server asks once it has ended, or after killing it);
      answered ``("status", returncode)``, as `subprocess.Popen.returncode` gives it (None: not a child).

    ``live_training``: its server allows live trainings, so it imports what they need
    (`preload_live_training`) before its first fork.

    A worker started as a fresh interpreter spent 4.1 CPU s before its first job on a 2-core AMD EPYC with
    AVX2 only, most of it importing torch, pandas and the API (docs/suite-time.md); forked from here,
    it has them already. The fork is taken from this process's main thread while it holds no lock of its
    own; the threads of its libraries (OpenBLAS's, jemalloc's) restart in the child through their own
    fork handlers. A server that ends closes its end of ``control``: this process then ends, and its
    workers find that their parent has changed (a live training checks, `live_training`).
    """
    # Ready once torch and the API are in (each of the server's waits, for this and for a fork, is bounded
    # by heavy.START_S, and at nice 10 on busy cores imports take many times their quiet CPU); then what a
    # live training needs, before the first fork.
    if not _tell(control, ("ready",)):
        return  # the server ended while this process started (stopped at once, or killed)
    # What is imported stays out of the children's collections, whose passes would write to (and so copy)
    # its pages: a worker's first two jobs 0.43-0.46 CPU s against 0.46-0.50 without (2-core Xeon).
    with imports_kept():
        if live_training:
            preload_live_training()
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, PACKET, 1)
        except ConnectionResetError:  # the server ended with a reply of ours unread: it has ended all the same
            return
        if not data:
            return
        message = pickle.loads(data)
        if message[0] == "fork" and len(fds) == 1:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _forked_worker(control, fds[0], *message[1:])  # never returns
            os.close(fds[0])
            reply = ("forked", pid)
        elif message[0] == "wait":
            try:
                reply = ("status", os.waitstatus_to_exitcode(os.waitpid(message[1], 0)[1]))
            except ChildProcessError:
                reply = ("status", None)
        else:
            for fd in fds:
                os.close(fd)
            reply = ("error", f"not a request: {message[0]!r}")
        if not _tell(control, reply):
            return


def _tell(control: socket.socket, message: tuple) -> bool:
    """Send ``message`` to the server on ``control``; False when the server's end is closed (it has ended).

    A server stopped while its fork server was still importing left a BrokenPipeError's traceback in its
    terminal; a server that has ended is this process's signal to end too. (One that ends with a reply
    unread resets the connection instead, which the next read in `fork_server` meets.)"""
    try:
        control.send(pickle.dumps(message))
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def preload_live_training() -> None:
    """Import what a live training's first step imports, so that its CPU bound goes to training.

    torch's first optimizer imports torch._dynamo (``Optimizer.add_param_group`` is wrapped by
    ``torch._compile._disable_dynamo``, which imports it on its first call): about 800 modules, sympy
    among them. Imported in a worker at nice 10 beside two busy processes, they took most of an 8 CPU s
    bound: 20 steps of reverse's live recipe cost 5.3 CPU s there, and 3.6 with torch._dynamo imported
    before (2.7 and 1.9 on a quiet machine; 2-core Intel Xeon), and such a training stopped before its
    first record. In the fork server it costs about 0.8 CPU s and 70 MB once, shared by every worker."""
    import torch._dynamo  # noqa: F401


def _forked_worker(control: socket.socket, fd: int, environ: dict[str, str], cwd: str) -> None:
    """A fork server's child: the server's environment and folder, then jobs on ``fd`` until it closes."""
    status = 0
    try:
        control.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the fork server ignores it; a worker does not
        os.environ.clear()
        os.environ.update(environ)
        import tempfile

        tempfile.tempdir = None  # TMPDIR as the server has it now, not as the fork server found it
        os.chdir(cwd)
        use_threads()
        serve(lambda n: os.read(fd, n), os.fdopen(os.dup(fd), "wb"), watch=fd)
    except KeyboardInterrupt:  # a Ctrl-C in the server's terminal: it stops the server too
        status = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - said on stderr; the server sees the worker end
        traceback.print_exc()
        status = 1
    finally:
        sys.stderr.flush()
        os._exit(status)  # never back into the fork server's loop, nor its exit handlers


def main() -> None:
    """``python -m attnviz.jobs``: serve jobs on stdin/stdout; ``--fork-server FD``: fork workers (`fork_server`).

    Anything else printed goes to stderr."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print cannot break the pipe's framing
    if sys.argv[1:2] == ["--fork-server"]:  # --fork-server [--live-training] FD
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C stops the server; the server's end closing stops this
        *flags, fd = sys.argv[2:]
        fork_server(socket.socket(fileno=int(fd)), live_training="--live-training" in flags)
        sys.stderr.flush()
        # At once: tearing down torch and the rest took over 10 s at nice 10 beside two busy processes.
        os._exit(0)
    use_threads()
    serve(sys.stdin.buffer.read, out, watch=sys.stdin.fileno())


def use_threads() -> int:
    """The threads this worker computes on, torch's and numpy's BLAS alike: ``ATTNVIZ_WORKER_THREADS``, 1 by
    default (the workers and the server share the cores: `attnviz.threads`). Returns the number."""
    from attnviz.threads import compute_on

    threads = number_setting("ATTNVIZ_WORKER_THREADS", 1, 1, 1024, whole=True)
    compute_on(threads)
    return threads


if (
    __name__ == "__main__"
):  # run as attnviz.jobs, not __main__: what its jobs return (TextFacts) unpickles in the server
    from attnviz.jobs import main as serve_jobs

    serve_jobs()
