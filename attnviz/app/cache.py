"""What the pages compute from a model, cached per process: a widget change never reruns the model.

``st.cache_resource`` hands every session the same model, which is therefore read-only;
``st.cache_data`` keys on strings and numbers only (models and tensors cannot be hashed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import streamlit as st

from attnviz import api
from attnviz.checkpoints import Bundle

T = TypeVar("T")


@st.cache_resource(show_spinner="Loading the model…", max_entries=4)
def load_bundle(model: str, device: str) -> Bundle:
    """One loaded model per (model, device) for the whole process; never mutated."""
    return api.load(model, device)


def run_attention(model: str, device: str, src: str, tgt: str | None, words: bool = False) -> api.AttentionExport:
    """Every attention map for a sentence (over words with ``words``), cached: changing layer, head
    or view does not rerun it."""
    return _run_attention(model, device, src, tgt, bool(words))  # every argument given: one cache key per run


@st.cache_data(show_spinner="Running the model…", max_entries=64)
def _run_attention(model: str, device: str, src: str, tgt: str | None, words: bool) -> api.AttentionExport:
    return api.attention(load_bundle(model, device), src, tgt, words=words)


@st.cache_data(show_spinner="Recording queries and keys…", max_entries=16)
def run_queries_keys(model: str, device: str, src: str, tgt: str | None) -> dict:
    """Every head's query and key vectors, per kind (L, H, n, d_k); cached like the maps."""
    return api.queries_keys(load_bundle(model, device), src, tgt)


@st.cache_data(show_spinner="Computing the scores…", max_entries=16)
def run_scores(model: str, device: str, src: str, tgt: str | None) -> dict:
    """Scaled scores before the softmax, per kind (L, H, Q, K); cached like the maps."""
    return api.attention_scores(load_bundle(model, device), src, tgt)


@st.cache_data(show_spinner="Running the model…", max_entries=16)
def run_forward_pass(model: str, device: str, src: str, tgt: str | None) -> api.ForwardPass:
    """Every intermediate tensor of one forward pass, cached: moving between stages does not rerun it."""
    return api.forward_pass(load_bundle(model, device), src, tgt)


@st.cache_data(show_spinner="Decoding…", max_entries=32)
def run_decoding(model: str, device: str, src: str, beam: int, tgt: str | None, top_k: int = 8):
    """The step-through of one decoding (greedy, beam search or teacher-forced), cached."""
    return api.step_through(load_bundle(model, device), src, beam=beam, top_k=top_k, target=tgt)


@st.cache_resource(show_spinner=False, max_entries=512, ttl=3600)
def _shared(kind: str, key: tuple, _build: Callable[[], Any]) -> Any:
    return _build()


def shared(kind: str, key: tuple, build: Callable[[], T]) -> T:
    """``build()``, made once per (``kind``, ``key``) in the process and shared by every session.

    For what a page draws from its choices (a figure, a formatted table): ``key`` must hold every
    choice the result depends on, as strings, numbers and tuples of them. Unlike st.cache_data
    nothing is copied on a hit, which is what makes a rerun cheap; so the result is read-only
    (st.plotly_chart and st.table only read it). Bounded: the 512 most recent, for an hour.
    """
    return _shared(kind, key, build)
