"""The app's shared sidebar, caches and error display: the one attnviz module that imports Streamlit.

Every page calls :func:`sidebar` first. Widget state lives under fixed keys in
``st.session_state`` and is re-assigned to itself on every run, so choices survive page changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import streamlit as st

from attnviz import api
from attnviz import positional as pe
from attnviz.checkpoint import Bundle
from attnviz.devices import DEVICE_CHOICES, available_devices
from attnviz.errors import AttnvizError

# Material icons ship with Streamlit, so they render offline and in any browser (emoji need fonts).
PAGES = (
    ("app.py", "Home", ":material/home:"),
    ("pages/explorer.py", "Attention explorer", ":material/grid_on:"),
    ("pages/decoding.py", "Decoding step by step", ":material/play_circle:"),
    ("pages/walkthrough.py", "Forward-pass walkthrough", ":material/route:"),
    ("pages/mechanics.py", "Mechanics of attention", ":material/calculate:"),
    ("pages/variants.py", "Attention variants", ":material/blur_on:"),
    ("pages/positional.py", "Positional encoding", ":material/waves:"),
    ("pages/linearity.py", "Relative positions are linear", ":material/rotate_right:"),
)
CUSTOM_PATH = "A checkpoint directory…"
# Widget keys kept across pages (Streamlit drops the state of widgets a page does not draw).
# Buttons, data editors and charts are left out: Streamlit refuses writes to their state.
KEYS = (
    "model",
    "model_path",
    "src",
    "tgt",
    "device",
    "src_model",
    "picked_example",
    "kind",
    "layer",
    "head",
    "view",
    "scores",
    "lines_heads",
    "aggregate",
    "image_format",
    "beam",
    "step",
    "teacher",
    "playing",
    "mech_d_model",
    "mech_dk_max",
    "mech_h",
    "mech_lr_d_model",
    "mech_lr_steps",
    "mech_lr_warmup",
    "mech_mask_kind",
    "mech_mask_n",
    "mech_mask_row",
    "mech_n",
    "mech_n_keys",
    "mech_pad_len",
    "mech_perm_head",
    "mech_perm_layer",
    "mech_perm_order",
    "mech_perm_seed",
    "mech_scale",
    "mech_seed",
    "var_causal",
    "var_cx_d",
    "var_cx_k",
    "var_cx_n",
    "var_cx_r",
    "var_head",
    "var_k",
    "var_layer",
    "var_model_k",
    "var_n",
    "var_pattern",
    "var_syn_d",
    "var_syn_n",
    "var_syn_seed",
    "var_syn_token",
    "var_time_d",
    "pe_base",
    "pe_cosine",
    "pe_d_model",
    "pe_dims",
    "pe_layout",
    "pe_length",
    "lin_base",
    "lin_d_model",
    "lin_dim",
    "lin_k",
    "lin_k_max",
    "lin_layout",
    "lin_length",
    "lin_pair",
    "lin_precision",
    "wt_stage",
    "wt_layer",
    "wt_head",
    "wt_step",
    "wt_k",
    "lin_start",
)


@dataclass(frozen=True)
class Choices:
    model: str  # a shipped model's name or a checkpoint directory
    src: str
    tgt: str | None
    device: str  # a concrete device: cpu, cuda or mps


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
def run_walkthrough(model: str, device: str, src: str, tgt: str | None) -> api.Walkthrough:
    """Every intermediate tensor of one forward pass, cached: moving between stages does not rerun it."""
    return api.walkthrough(load_bundle(model, device), src, tgt)


@st.cache_data(show_spinner="Decoding…", max_entries=32)
def run_decoding(model: str, device: str, src: str, beam: int, tgt: str | None, top_k: int = 8):
    """The step-through of one decoding (greedy, beam search or teacher-forced), cached."""
    return api.step_through(load_bundle(model, device), src, beam=beam, top_k=top_k, target=tgt)


def show_error(e: Exception) -> None:
    """A clear message for the people using the app, never a traceback."""
    st.error(str(e) if isinstance(e, AttnvizError) else f"Something went wrong: {type(e).__name__}: {e}")


def clamp_state(key: str, options) -> None:
    """Reset a widget's stored value when it is no longer an option (e.g. a model with fewer layers)."""
    options = list(options)
    if key in st.session_state and st.session_state[key] not in options:
        st.session_state[key] = options[0]


def keep_in_range(key: str, default: int, low: int, high: int) -> None:
    """Keep a slider's value, moved into [low, high], when its range changes.

    Streamlit gives a slider whose bounds changed a fresh state (its minimum); setting the value
    through session_state before the slider is drawn carries it over.
    """
    st.session_state[key] = min(max(st.session_state.get(key, default), low), high)


SINUSOID_D_MODELS = [16, 32, 64, 128, 256, 512, 1024]
LAYOUT_NAMES = {"interleaved": "interleaved (paper)", "concat": "concatenated (sin | cos)"}


def sinusoid_inputs(columns, prefix: str, base_help: str, layout_help: str | None = None) -> tuple[int, float, str]:
    """The d_model, base and layout widgets of the two positional-encoding pages, in three containers.

    Keys are ``{prefix}_d_model``, ``{prefix}_base`` and ``{prefix}_layout``.
    """
    d_col, base_col, layout_col = columns
    d_model = d_col.selectbox("d_model", SINUSOID_D_MODELS, index=SINUSOID_D_MODELS.index(128), key=f"{prefix}_d_model")
    base = base_col.number_input(
        "Base",
        min_value=1.0,
        max_value=1e9,
        value=pe.PAPER_BASE,
        step=1000.0,
        format="%g",
        key=f"{prefix}_base",
        help=base_help,
    )
    layout = layout_col.radio(
        "Layout", pe.LAYOUTS, format_func=LAYOUT_NAMES.get, key=f"{prefix}_layout", help=layout_help
    )
    return d_model, float(base), layout


def download_buttons(
    make_table: Callable[[], pd.DataFrame],
    export: api.AttentionExport | None,
    image_format: str | None,
    name: str,
) -> None:
    """CSV of the matrix shown, NPZ of every tensor, and the image format of the figure's camera button.

    The files are built only when a button is clicked (a callable ``data``): a long form of every
    head of a 500-token sentence has millions of rows, too many to build on every rerun.
    """
    cols = st.columns(3)
    cols[0].download_button(
        "CSV of what is shown",
        lambda: make_table().to_csv(index=False).encode("utf-8"),
        f"{name}.csv",
        "text/csv",
        help="Long form: layer, head, query index and token, key index and token, value.",
    )
    if export is not None:
        cols[1].download_button(
            "NPZ of every map",
            export.to_bytes,
            f"{name.split('-')[0]}-attention.npz",
            "application/octet-stream",
            help="The same file as `attnviz attention`: encoder, decoder, cross, ids, tokens and a manifest.",
        )
    if image_format is not None:
        cols[2].radio(
            "Figure download (camera icon on the figure)",
            ["png", "svg"],
            key="image_format",
            horizontal=True,
        )


def _keep_state() -> None:
    for key in KEYS:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def sidebar() -> Choices | None:
    """Draw the shared sidebar and page links; the current choices, or None when they are unusable."""
    _keep_state()
    models = api.list_models()
    default = api.DEFAULT_MODEL if api.DEFAULT_MODEL in models else (models or [CUSTOM_PATH])[0]
    st.session_state.setdefault("model", default)
    with st.sidebar:
        for path, label, icon in PAGES:
            st.page_link(path, label=label, icon=icon)
        st.divider()
        choice = st.selectbox(
            "Model",
            [*models, CUSTOM_PATH],
            key="model",
            format_func=lambda m: "minilm: MiniLM, a real English encoder (BERT)" if m == api.MINILM else m,
        )
        model = choice
        if choice == CUSTOM_PATH:
            model = st.text_input("Checkpoint directory", key="model_path").strip()
        st.selectbox("Device", DEVICE_CHOICES, key="device", help="auto: a GPU when there is one, else the CPU")
        device = st.session_state.get("device", "auto")
        concrete = available_devices()
        if device == "auto":
            device = concrete[1] if len(concrete) > 1 else "cpu"
        elif device not in concrete:
            st.warning(f"No {device} device on this machine: running on the CPU instead.")
            device = "cpu"
        if not model:
            st.info("Type the path of a checkpoint directory.")
            return None
        try:
            bundle = load_bundle(model, device)
        except Exception as e:  # noqa: BLE001 - every failure must reach the user as a message
            show_error(e)
            return None
        examples = bundle.info.get("examples") or []
        if st.session_state.get("src_model") != model:  # a new model: start from its first example
            st.session_state["src"] = examples[0] if examples else ""
            st.session_state["tgt"] = ""
            st.session_state["src_model"] = model
        st.text_area("Source sentence", key="src", height=80)
        if examples:
            picked = st.pills("Examples", examples, key=f"examples::{model}")
            if picked and picked != st.session_state.get("picked_example"):
                st.session_state["picked_example"] = picked
                st.session_state["src"] = picked
                st.rerun()
        encoder_only = bundle.config.encoder_only
        st.text_input(
            "Target sentence (optional)",
            key="tgt",
            disabled=encoder_only,
            help="Teacher forcing: the decoder reads this sentence instead of the model's own output."
            + (" This model is encoder-only: it has no decoder." if encoder_only else ""),
        )
        family = bundle.info.get("family", "attnviz")
        st.caption(
            f"{bundle.name} ({family}): {bundle.config.n_enc_layers}+{bundle.config.n_dec_layers} layers, "
            f"{bundle.config.n_heads} heads, d_model {bundle.config.d_model}, "
            f"vocabulary {bundle.config.src_vocab_size:,}, on {device}. "
            f"From: {bundle.info.get('source', 'trained by attnviz train')} ({bundle.path})"
        )
    tgt = None if encoder_only else st.session_state.get("tgt", "").strip() or None
    return Choices(model=model, src=st.session_state.get("src", ""), tgt=tgt, device=device)
