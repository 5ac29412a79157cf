"""What the pages compute from a model, cached per process: a widget change never reruns the model.

``st.cache_resource`` hands every session the same model, which is therefore read-only. What is
computed from it (maps, decodings, figures) is kept in one :class:`~attnviz.app.budget.ByteBudget`
under ``ATTNVIZ_CACHE_MB``, keyed on strings and numbers only (models and tensors cannot be hashed),
and shared by every session as it is: read-only.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import streamlit as st

from attnviz import api, jobs
from attnviz.app import heavy
from attnviz.app.budget import ByteBudget
from attnviz.checkpoints import Bundle
from attnviz.checkpoints.catalog import visitor_path
from attnviz.errors import AtlasError, AttnvizError, CheckpointError, InputError

ATLAS_MEMORY = 8  # atlases computed in the app, kept for every session (the oldest goes first)

T = TypeVar("T")
RESULTS = ByteBudget()  # every session's computed results and figures, under ATTNVIZ_CACHE_MB


def budgeted(spinner: str | bool):
    """``@st.cache_data`` by bytes: the decorated function's result per arguments, kept in :data:`RESULTS`.

    ``spinner``: the text shown while it is computed (False: none). The arguments must be strings,
    numbers, None and tuples of them.
    """

    def decorate(function):
        # Pages run as scripts: two of them may define functions of the same name, so the file is in the key.
        name = f"{function.__code__.co_filename}:{function.__qualname__}"

        @functools.wraps(function)
        def cached(*args, **kwargs):
            def make():
                if not spinner:
                    return function(*args, **kwargs)
                with st.spinner(spinner):
                    return function(*args, **kwargs)

            return RESULTS.get((name, args, tuple(sorted(kwargs.items()))), make)

        cached.clear = lambda: RESULTS.drop(lambda key: key[0] == name)  # as st.cache_data's .clear()
        return cached

    return decorate


@st.cache_resource(show_spinner="Loading the model…", max_entries=4)
def load_bundle(model: str, device: str) -> Bundle:
    """One loaded model per (model, device) for the whole process; never mutated.

    The heavy-work processes load it too, in the background, while the first page is read.
    """
    bundle = api.load(model, device)
    heavy.pool().warm(model, device)
    return bundle


@st.cache_resource(show_spinner="Finding the clearest head…", max_entries=8)
def clearest_head(model: str, device: str) -> tuple[str, int, int]:
    """(kind, layer, head) the pages open on for ``model`` (:func:`attnviz.api.clearest_head`), once per process."""
    return api.clearest_head(load_bundle(model, device))


LIGHT_TOKENS = 64  # ATTNVIZ_LIGHT_TOKENS: one forward pass over at most this many tokens runs at once, in place
MAX_TOKENS = 4096  # ATTNVIZ_MAX_TOKENS: the longest text this server takes (the model's own limit may be lower)


def _tokens_setting(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, default)))
    except ValueError:
        return default


def is_light(model: str, device: str, src: str, tgt: str | None = None) -> bool:
    """Whether one forward pass over ``src`` (and ``tgt``) is quick enough to run in the visitor's thread.

    A text over ``ATTNVIZ_MAX_TOKENS`` is refused here, before any work is queued.
    """
    tok = load_bundle(model, device).tokenizer
    try:
        n = len(tok.encode_source(src).ids)
        if tgt is not None:
            n = max(n, len(tok.encode_target(tgt)[0].ids))
    except AttnvizError:
        return True  # the model refuses it at once, with its own message
    most = _tokens_setting("ATTNVIZ_MAX_TOKENS", MAX_TOKENS)
    if n > most:
        raise InputError(f"the text is {n:,} tokens long; this server takes at most {most:,} (ATTNVIZ_MAX_TOKENS)")
    return n <= _tokens_setting("ATTNVIZ_LIGHT_TOKENS", LIGHT_TOKENS)


def compute(name: str, what: str, model: str | None, device: str, args: tuple, light: bool = False, progress=None):
    """Job ``name`` (:data:`attnviz.jobs.JOBS`) on ``model`` (None: a job that takes none).

    In place when ``light``; else through :func:`attnviz.app.heavy.run`: queued, bounded and run in
    a worker process, with ``what`` in the visitor's notice while it waits.
    """
    bundle = (lambda: None) if model is None else (lambda: load_bundle(model, device))
    if light:
        return jobs.run_job(bundle(), name, args, progress)
    return heavy.run(name, model, device, args, bundle, what, progress)


def run_attention(model: str, device: str, src: str, tgt: str | None, words: bool = False) -> api.AttentionExport:
    """Every attention map for a sentence (over words with ``words``), cached: changing layer, head
    or view does not rerun it."""
    return _run_attention(model, device, src, tgt, bool(words))  # every argument given: one cache key per run


@budgeted("Running the model…")
def _run_attention(model: str, device: str, src: str, tgt: str | None, words: bool) -> api.AttentionExport:
    light = is_light(model, device, src, tgt)
    return compute("attention", "Running the model", model, device, (src, tgt, words), light)


@budgeted("Recording queries and keys…")
def run_queries_keys(model: str, device: str, src: str, tgt: str | None) -> dict:
    """Every head's query and key vectors, per kind (L, H, n, d_k); cached like the maps."""
    light = is_light(model, device, src, tgt)
    return compute("queries_keys", "Recording queries and keys", model, device, (src, tgt), light)


@budgeted("Computing the scores…")
def run_scores(model: str, device: str, src: str, tgt: str | None) -> dict:
    """Scaled scores before the softmax, per kind (L, H, Q, K); cached like the maps."""
    light = is_light(model, device, src, tgt)
    return compute("scores", "Computing the scores", model, device, (src, tgt), light)


@budgeted("Running the model…")
def run_forward_pass(model: str, device: str, src: str, tgt: str | None) -> api.ForwardPass:
    """Every intermediate tensor of one forward pass, cached: moving between stages does not rerun it."""
    light = is_light(model, device, src, tgt)
    return compute("forward_pass", "Running the model", model, device, (src, tgt), light)


@budgeted("Decoding…")
def run_decoding(model: str, device: str, src: str, beam: int, tgt: str | None, top_k: int = 8):
    """The step-through of one decoding (greedy, beam search or teacher-forced), cached. Beam search is heavy."""
    light = is_light(model, device, src, tgt) and beam == 1
    return compute("decoding", "Decoding", model, device, (src, beam, tgt, top_k), light)


@budgeted("Computing the contributions…")
def run_attribution(
    model: str, device: str, src: str, tgt: str | None, method: str, position: int | None, words: bool
) -> api.AttentionExport:
    """A contribution method's arrays for a sentence (``attnviz.attribute``), cached per method, position and units."""
    is_light(model, device, src, tgt)  # the size bound
    args = (src, tgt, method, position, words)
    return compute("attribution", "Computing the contributions", model, device, args)


@budgeted("Running the model with those heads switched off…")
def run_ablation(
    model: str, device: str, src: str, tgt: str | None, ablate: str, mode: str, words: bool
) -> api.AblationComparison:
    """Intact and ablated model side by side; ``ablate`` in text form (``cross:1.2,...``), cached."""
    is_light(model, device, src, tgt)
    args = (src, tgt, ablate, mode, words)
    return compute("ablation", "Running the model with those heads switched off", model, device, args)


@budgeted("Switching every head off in turn…")
def run_importance(
    model: str, device: str, sentences: tuple[str, ...], references: tuple[str, ...] | None
) -> api.HeadImportance:
    """Every head's importance over the sentences (and references), cached on the texts."""
    args = (tuple(sentences), None if references is None else tuple(references))
    return compute("importance", "Switching every head off in turn", model, device, args)


def shared(kind: str, key: tuple, build: Callable[[], T]) -> T:
    """``build()``, made once per (``kind``, ``key``) in the process and shared by every session.

    For what a page draws from its choices (a figure, a formatted table): ``key`` must hold every
    choice the result depends on, as strings, numbers and tuples of them. Nothing is copied on a
    hit, which is what makes a rerun cheap; so the result is read-only (st.plotly_chart and st.table
    only read it). Bounded with the computed results, by bytes (:data:`RESULTS`).
    """
    return RESULTS.get(("shared", kind, key), build)


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
    key = (model, device, sentences)
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


@budgeted(False)
def run_head_map(
    model: str, device: str, src_ids: tuple[int, ...], tgt_ids: tuple[int, ...] | None, kind: str, layer: int, head: int
) -> np.ndarray:
    """One head's map for one sentence's exact inputs (Q, K), cached."""
    light = max(len(src_ids), len(tgt_ids or ())) <= _tokens_setting("ATTNVIZ_LIGHT_TOKENS", LIGHT_TOKENS)
    return compute("head_map", "Computing the map", model, device, (src_ids, tgt_ids, kind, layer, head), light)
