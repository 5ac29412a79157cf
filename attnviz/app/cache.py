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


@st.cache_data(show_spinner="Running the model…", max_entries=64)
def run_attention(model: str, device: str, src: str, tgt: str | None) -> api.AttentionExport:
    """Every attention map for a sentence, cached: changing layer, head or view does not rerun it."""
    return api.attention(load_bundle(model, device), src, tgt)


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


@st.cache_data(show_spinner="Computing the contributions…", max_entries=32)
def run_attribution(
    model: str, device: str, src: str, tgt: str | None, method: str, position: int | None = None
) -> api.AttentionExport:
    """A contribution method's arrays for a sentence (``attnviz.attribute``), cached per method and position."""
    return api.attribute(load_bundle(model, device), src, tgt, method=method, position=position)


@st.cache_data(show_spinner="Running the model with those heads switched off…", max_entries=32)
def run_ablation(model: str, device: str, src: str, tgt: str | None, ablate: str, mode: str) -> api.AblationComparison:
    """Intact and ablated model side by side; ``ablate`` in text form (``cross:1.2,...``), cached."""
    return api.compare_ablation(load_bundle(model, device), src, api.Ablation.parse(ablate, mode), tgt)


@st.cache_data(show_spinner="Switching every head off in turn…", max_entries=16)
def run_importance(
    model: str, device: str, sentences: tuple[str, ...], references: tuple[str, ...] | None
) -> api.HeadImportance:
    """Every head's importance over the sentences (and references), cached on the texts."""
    refs = None if references is None else list(references)
    return api.head_importance(load_bundle(model, device), list(sentences), refs)


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
