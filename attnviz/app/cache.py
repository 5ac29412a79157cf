"""What the pages compute from a model, cached per process: a widget change never reruns the model.

``st.cache_resource`` hands every session the same model, which is therefore read-only. What is
computed from it (maps, decodings, figures) is kept in one `ByteBudget`
under ``ATTNVIZ_CACHE_MB``, keyed on strings and numbers only (models and tensors cannot be hashed),
and shared by every session as it is: read-only.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import streamlit as st

from attnviz import api, jobs
from attnviz.app import heavy
from attnviz.app.budget import ByteBudget
from attnviz.checkpoints import Bundle
from attnviz.checkpoints.catalog import checkpoint_stamp, visitor_path
from attnviz.errors import AtlasError, CheckpointError, InputError
from attnviz.settings import number_setting
from attnviz.training.history import HISTORY, History, load_history

ATLAS_MEMORY = 8  # atlases computed in the app, kept for every session (the oldest goes first)

log = logging.getLogger(__name__)
T = TypeVar("T")
RESULTS = ByteBudget()  # every session's computed results and figures, under ATTNVIZ_CACHE_MB


_STAMPS: dict[str, tuple] = {}  # model -> its folder's `checkpoint_stamp` when last loaded
_STAMPS_LOCK = threading.Lock()
# Every key of what is kept holds the epoch it was made in; a model folder that changes starts a new one. A result
# made from the old weights while that happened is kept under the old epoch, where nobody asks for it.
_EPOCH = [0]


def load_bundle(model: str, device: str) -> Bundle:
    """One loaded model per (model, device) and version of its folder for the whole process; never mutated.

    A folder rewritten on disk (a training resumed into it) is read again, and what was computed from
    the version before is dropped (`forget_model`); the heavy-work processes check the same.
    """
    stamp = checkpoint_stamp(model)
    with _STAMPS_LOCK:
        before = _STAMPS.get(model, stamp)
        _STAMPS[model] = stamp
    if before != stamp:
        forget_model(model)
    return _load_bundle(model, device, stamp)


@st.cache_resource(show_spinner="Loading the model…", max_entries=4)
def _load_bundle(model: str, device: str, stamp: tuple) -> Bundle:
    """`load_bundle`'s load; the heavy-work processes load it too, in the background, while the first page is read."""
    bundle = api.load(model, device)
    heavy.pool().warm(model, device)
    return bundle


def forget_model(model: str) -> None:
    """``model``'s folder changed: start a new epoch, so that nothing computed before is handed out again (results,
    figures, atlases and clearest heads of every model: a rare event, and the simplest rule that cannot miss one
    computed at that very moment), and drop what the old epochs kept."""
    log.info("the model folder %s changed: what was computed before is dropped, for every model", model)
    with _STAMPS_LOCK:
        _EPOCH[0] += 1
        epoch = _EPOCH[0]
    RESULTS.drop(lambda key: key[0] != epoch)
    memo, lock = _computed_atlases()
    with lock:
        for key in [key for key in memo if key[0] != epoch]:
            del memo[key]


def clearest_head(model: str, device: str) -> api.HeadChoice:
    """(kind, layer, head) the pages open on for ``model`` ([`attnviz.api.clearest_head`][]), once per process
    and version of its folder."""
    bundle = load_bundle(model, device)  # first: it starts a new epoch when the folder has changed
    return _clearest_head(model, device, _EPOCH[0], bundle)


@st.cache_resource(show_spinner="Finding the clearest head…", max_entries=8)
def _clearest_head(model: str, device: str, epoch: int, _bundle: Bundle) -> api.HeadChoice:
    return api.clearest_head(_bundle)


LIGHT_TOKENS = 64  # ATTNVIZ_LIGHT_TOKENS: one forward pass over at most this many tokens runs at once, in place
LIGHT_CHARS = 2000  # a text of at most this many characters is read in place (well under a millisecond)
MAX_TOKENS = 8192  # ATTNVIZ_MAX_TOKENS: the longest text this server takes (the model's own limit may be lower)
FULL_MAPS_MB = 256  # ATTNVIZ_FULL_MAPS_MB: a text whose maps take more is shown tile by tile (attnviz.tiles)


def _int_setting(name: str, default: int) -> int:
    """The operator's whole-number setting ``name`` (1 to a billion: `attnviz.settings`), else ``default``."""
    return number_setting(name, default, 1, 10**9, whole=True)


def text_facts(model: str, device: str, src: str, tgt: str | None = None) -> jobs.TextFacts:
    """Its tokens, the size of its maps and its out-of-domain notice ([`attnviz.jobs.TextFacts`][]): read
    once per text for every session (`RESULTS`).

    A text of over `LIGHT_CHARS` characters is read in a worker process, in the queue's lane for texts
    (`attnviz.app.heavy.TEXT`): tokenizing a burst of long prompts in the server's own threads held
    its event loop (the health check) for seconds, and a tokenizer that aborts takes only a worker down.
    """

    def make() -> jobs.TextFacts:
        light = len(src) + len(tgt or "") <= LIGHT_CHARS
        return compute("text_facts", "Reading the text", model, device, (src, tgt), light, lane=heavy.TEXT)

    return RESULTS.get((_EPOCH[0], "text", model, device, src, tgt), make)


def within_limit(model: str, device: str, src: str, tgt: str | None = None) -> jobs.TextFacts:
    """The text's `text_facts`; an InputError when it is over ``ATTNVIZ_MAX_TOKENS``, on every path."""
    facts = text_facts(model, device, src, tgt)
    most = _int_setting("ATTNVIZ_MAX_TOKENS", MAX_TOKENS)
    if facts.tokens > most:
        raise InputError(
            f"the text is {facts.tokens:,} tokens long; this server takes at most {most:,} (ATTNVIZ_MAX_TOKENS): "
            "shorten it"
        )
    return facts


def is_light(model: str, device: str, src: str, tgt: str | None = None) -> bool:
    """Whether one forward pass over ``src`` (and ``tgt``) is quick enough to run in the visitor's thread.

    A text over ``ATTNVIZ_MAX_TOKENS`` is refused here, before any work is queued.
    """
    facts = within_limit(model, device, src, tgt)
    if facts.refused:
        return True  # the model refuses it at once, with its own message
    return facts.tokens <= _int_setting("ATTNVIZ_LIGHT_TOKENS", LIGHT_TOKENS)


def maps_bytes(model: str, device: str, src: str, tgt: str | None = None) -> tuple[int, int]:
    """(tokens, bytes) of the text's maps ([`attnviz.api.maps_size`][]); (0, 0) for a text the model
    refuses (the page that runs it says why)."""
    facts = text_facts(model, device, src, tgt)
    return facts.source_tokens, facts.maps_bytes


def is_long(model: str, device: str, src: str, tgt: str | None = None) -> bool:
    """Whether the text's maps take more than ``ATTNVIZ_FULL_MAPS_MB``: the explorer then shows it tile by tile.

    A text over ``ATTNVIZ_MAX_TOKENS`` is refused here (an InputError), before either way of showing it.
    """
    facts = within_limit(model, device, src, tgt)
    return facts.maps_bytes > _int_setting("ATTNVIZ_FULL_MAPS_MB", FULL_MAPS_MB) * 2**20


def size_text(n_bytes: float) -> str:
    """'67.5 GB', '576 MB': a size for people, in binary units (2**30 and 2**20 bytes), as every limit is."""
    return f"{n_bytes / 2**30:,.1f} GB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:,.0f} MB"


def long_text(model: str, device: str, src: str, tgt: str | None = None) -> str:
    """'This text is 8,192 tokens long: all its attention maps would take 2.0 GB, more than this server
    makes at once (ATTNVIZ_FULL_MAPS_MB, 256 MB).': what every page says first of a long text."""
    n, size = maps_bytes(model, device, src, tgt)
    limit = _int_setting("ATTNVIZ_FULL_MAPS_MB", FULL_MAPS_MB)
    return (
        f"This text is {n:,} tokens long: all its attention maps would take {size_text(size)}, more than this "
        f"server makes at once (ATTNVIZ_FULL_MAPS_MB, {limit:,} MB)."
    )


def long_text_error(model: str, device: str, src: str, tgt: str | None = None) -> InputError:
    """What a page that needs every map at once says of a text whose maps are too large for it."""
    first = long_text(model, device, src, tgt)
    return InputError(
        f"{first[0].lower()}{first[1:-1]}. The Attention explorer shows every head of it tile by tile (one head "
        "at full resolution, all heads max-pooled, the head statistics); this part of the page needs every map "
        "at once: shorten the text for it"
    )


def compute(
    name: str,
    what: str,
    model: str | None,
    device: str,
    args: tuple,
    light: bool = False,
    progress=None,
    lane: str = heavy.HEAVY,
):
    """Job ``name`` (`attnviz.jobs.JOBS`) on ``model`` (None: a job that takes none).

    In place when ``light``; else through `attnviz.app.heavy.run`: queued in ``lane``, bounded and
    run in a worker process, with ``what`` in the visitor's notice while it waits.
    """
    bundle = (lambda: None) if model is None else (lambda: load_bundle(model, device))
    if light:
        return jobs.run_job(bundle(), name, args, progress)
    return heavy.run(name, model, device, args, bundle, what, progress, lane)


def _queued(model: str, device: str, src: str, tgt: str | None = None) -> bool:
    """Always queued, but a text over ATTNVIZ_MAX_TOKENS is refused first (`is_light`)."""
    is_light(model, device, src, tgt)
    return False


def _short_ids(model: str, device: str, src_ids: tuple, tgt_ids: tuple | None, *_) -> bool:
    return max(len(src_ids), len(tgt_ids or ())) <= _int_setting("ATTNVIZ_LIGHT_TOKENS", LIGHT_TOKENS)


# Each job of attnviz.jobs.JOBS the pages compute: what the visitor reads while it runs, and when it
# runs in place (a rule on the job's arguments) instead of through the queue (None: always queued).
JOB_RULES: dict[str, tuple[str, Callable[..., bool] | None]] = {
    "attention": ("Running the model", lambda m, d, src, tgt, words: is_light(m, d, src, tgt)),
    "scores": ("Computing the scores", is_light),
    "queries_keys": ("Recording queries and keys", lambda m, d, src, tgt, *_: is_light(m, d, src, tgt)),
    "forward_pass": ("Running the model", is_light),
    "decoding": ("Decoding", lambda m, d, src, beam, tgt, top_k: beam == 1 and is_light(m, d, src, tgt)),
    "attribution": ("Computing the contributions", lambda m, d, src, tgt, *_: _queued(m, d, src, tgt)),
    "ablation": ("Running the model with those heads switched off", lambda m, d, src, tgt, *_: _queued(m, d, src, tgt)),
    "importance": ("Switching every head off in turn", None),
    "head_map": ("Computing the map", _short_ids),
    "pattern": ("Running the encoder with the pattern, then decoding", lambda m, d, src, *_: is_light(m, d, src)),
    "permutation": ("Shuffling the sentence and running the encoder", lambda m, d, src, *_: is_light(m, d, src)),
    "timing": ("Timing self-attention and a GRU", None),
    "rotary": ("Rotating the queries and keys again", lambda m, d, src, tgt, *_: is_light(m, d, src, tgt)),
    "position_kinds": ("Measuring three kinds of positions", is_light),
    "tiled_layer": ("Reading the queries and keys of a long text, then one layer's heads", None),
}
# The jobs whose result holds, or is built from, every map of the sidebar's text at once: a text
# whose maps are over ATTNVIZ_FULL_MAPS_MB is refused there with a message (the explorer shows it
# tile by tile instead). Each gives where its (src, tgt) are among its arguments.
MAP_JOBS: dict[str, Callable[[tuple], tuple[str, str | None]]] = {
    "attention": lambda a: (a[0], a[1]),
    "scores": lambda a: (a[0], a[1]),
    "queries_keys": lambda a: (a[0], a[1]),  # the Q-K view compares its picture with the head's map
    "forward_pass": lambda a: (a[0], a[1]),
    "decoding": lambda a: (a[0], a[2]),
    "attribution": lambda a: (a[0], a[1]),
    "ablation": lambda a: (a[0], a[1]),
    "rotary": lambda a: (a[0], a[1]),
    "position_kinds": lambda a: (a[0], a[1]),
}
# Every job on the sidebar's text: each is refused over ATTNVIZ_MAX_TOKENS, the tiled ones included.
TEXT_JOBS = {**MAP_JOBS, "tiled_layer": lambda a: (a[0], a[1])}


def _canonical(name: str, args: tuple) -> tuple:
    """``args`` with the job's defaults filled in: one cache key however a page spells the call."""
    bound = inspect.signature(jobs.JOBS[name]).bind(None, *args)
    bound.apply_defaults()
    return tuple(bound.arguments.values())[1:]


def computed(name: str, model: str | None, device: str, *args) -> Any:
    """Job ``name`` of `attnviz.jobs.JOBS` on ``model`` with ``args``: what every page computes.

    Kept for every session under the byte budget (`RESULTS`), keyed on the strings and
    numbers given, so a widget change never reruns the model. A short input runs in place; the
    rest is queued, bounded and run in a worker process (`compute`). The result is shared
    and read-only. ``model`` is None for a job that takes none (``timing``).
    """
    args = _canonical(name, args)
    what, rule = JOB_RULES[name]
    if name in TEXT_JOBS and model is not None:
        text = TEXT_JOBS[name](args)
        if is_long(model, device, *text) and name in MAP_JOBS:
            raise long_text_error(model, device, *text)

    def make() -> Any:
        with st.spinner(f"{what}…"):
            light = rule is not None and model is not None and rule(model, device, *args)
            return compute(name, what, model, device, args, light)

    return RESULTS.get((_EPOCH[0], "computed", name, model, device, args), make)


def forget(name: str) -> None:
    """Drop every kept result of job ``name`` (the timing lesson's "Measure again")."""
    RESULTS.drop(lambda key: key[1:3] == ("computed", name))


def shared(kind: str, key: tuple, build: Callable[[], T]) -> T:
    """``build()``, made once per (``kind``, ``key``) in the process and shared by every session.

    For what a page draws from its choices (a figure, a formatted table): ``key`` must hold every
    choice the result depends on, as strings, numbers and tuples of them. Nothing is copied on a
    hit, which is what makes a rerun cheap; so the result is read-only (st.plotly_chart and st.table
    only read it). Bounded with the computed results, by bytes (`RESULTS`).
    """
    return RESULTS.get((_EPOCH[0], "shared", kind, key), build)


@st.cache_resource
def _computed_atlases() -> tuple[dict, threading.Lock]:
    return {}, threading.Lock()


def computed_atlas(
    model: str, device: str, sentences: tuple[str, ...], progress: Callable[[int, int], None] | None = None
) -> api.Atlas:
    """The atlas of ``sentences``, computed once per process, with ``progress(done, total)`` while it runs.

    Not an ``st.cache_data`` function: the progress bar is drawn by the page while the work runs,
    and Streamlit would replay a cached function's drawing on every later hit. The atlas is shared
    by every session and must be treated as read-only.
    """
    memo, lock = _computed_atlases()
    key = (_EPOCH[0], model, device, sentences)
    with lock:
        if key in memo:
            return memo[key]
    atlas = compute("atlas", "Computing the atlas", model, device, (tuple(sentences),), progress=progress)
    with lock:
        memo[key] = atlas
        while len(memo) > ATLAS_MEMORY:
            memo.pop(next(iter(memo)))
    return atlas


@st.cache_resource(show_spinner="Reading the atlas…", max_entries=4)
def _read_atlas(folder: str, written: float) -> api.Atlas:
    return api.load_atlas(folder)


@st.cache_resource(show_spinner="Reading the training history…", max_entries=4)
def _read_history(folder: str, written: tuple) -> History:
    return load_history(folder)


def model_history(model_dir: str | Path) -> History | None:
    """The training history recorded in a model's folder (``history/``), or None when it has none.

    Read once per folder and version (its manifest and the names of its records: a training that is
    still recording adds records); shared by every session, read-only.
    """
    folder = Path(model_dir) / HISTORY
    manifest, records = folder / "manifest.json", folder / "records"
    if not manifest.is_file() or not records.is_dir():
        return None
    written = (manifest.stat().st_mtime, tuple(sorted(p.name for p in records.iterdir())))
    return _read_history(str(folder), written)


def open_atlas(typed: str) -> api.Atlas:
    """The atlas in the folder a visitor typed, only under the server's model roots (``visitor_path``).

    Read once per folder and version of its manifest; shared by every session, read-only.
    """
    try:
        folder = visitor_path(typed)
    except CheckpointError:
        raise AtlasError(
            f"{typed.strip()!r} is not an atlas folder this server lets visitors open; atlases are read from "
            "under the server's model folders (ATTNVIZ_MODEL_ROOTS)"
        ) from None
    manifest = folder / "manifest.json"
    return _read_atlas(str(folder), manifest.stat().st_mtime if manifest.is_file() else 0.0)
