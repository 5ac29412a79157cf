"""The shared sidebar every page draws first, and the session state kept across pages.

Widget state lives under fixed keys in ``st.session_state``. Streamlit drops the state of widgets
that a run does not draw, so on every page `keep_state` re-assigns each key to itself, which
keeps the choices of the other pages too. Keys starting with "_" are left alone: they belong to
widgets whose value Streamlit refuses to have set (buttons, downloads, data editors, tables).
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from attnviz import api
from attnviz.app import links, present, registry
from attnviz.app.cache import load_bundle, text_facts
from attnviz.app.text import escape_markdown
from attnviz.app.widgets import show_error
from attnviz.checkpoints.catalog import visitor_model
from attnviz.checkpoints.hub import ALLOW_DOWNLOADS, downloads_allowed, is_hub_id
from attnviz.devices import DEVICE_CHOICES, available_devices
from attnviz.errors import AttnvizError

CUSTOM_PATH = "A checkpoint directory…"


@dataclass(frozen=True)
class Choices:
    model: str  # a shipped model's name or a checkpoint directory
    src: str
    tgt: str | None
    device: str  # a concrete device: cpu, cuda or mps

    @property
    def out_of_domain(self) -> str | None:
        """Why the sentence looks outside what the model knows ([`attnviz.api.out_of_domain`][]), or None.

        Read with the text's other facts (`attnviz.app.cache.text_facts`), away from the server's thread
        when the text is long: the sidebar does not wait for it, the page that shows it does.
        """
        return text_facts(self.model, self.device, self.src, self.tgt).out_of_domain


# The pickers that open on the model's clearest head (attnviz.app.views.layer_and_head): a model
# chosen in the sidebar opens there too, not on the head the model before happened to show.
PER_MODEL_VIEW = ("kind", "layer", "head", "bw_kind", "bw_layer", "bw_head", "cmp_layer", "cmp_head", "wt_step")
EXAMPLE_PILLS = "_example"  # "_": a pill is a one-off action, cleared once its example is in the text box


def use_example() -> None:
    """A click on an example pill: its sentence becomes the source, with no target (runs before the rerun).

    A callback is the one place where the text box's state may be written: once the box is drawn in
    a run, Streamlit refuses any change to its key (StreamlitAPIException). The pill is then cleared,
    so that clicking the same example again, after editing the text, brings it back.
    """
    picked = st.session_state.get(EXAMPLE_PILLS)
    if picked:
        st.session_state["src"] = picked
        st.session_state["tgt"] = ""
        st.session_state[EXAMPLE_PILLS] = None


def keep_state() -> None:
    """Carry every kept widget value into this run, whichever page drew it."""
    for key in list(st.session_state.keys()):
        if not key.startswith(("_", "$$")):
            st.session_state[key] = st.session_state[key]


def sidebar() -> Choices | None:
    """Draw the shared sidebar and page links; the current choices, or None when they are unusable."""
    keep_state()
    links.start()
    with st.sidebar:
        for page in registry.PAGES:
            st.page_link(page.path, label=page.title, icon=page.icon)
        st.divider()
        model = model_choice()
        if model is None:
            return None
        present.toggle()
        device = device_choice()
        if not model:
            st.info("Type the path of a model folder.")
            return None
        try:
            bundle = load_bundle(model, device)
        except Exception as e:  # noqa: BLE001 - every failure must reach the user as a message
            show_error(e)
            return None
        sentence_inputs(bundle, model)
        model_caption(bundle, device)
    no_target = bundle.config.encoder_only or bundle.config.decoder_only
    tgt = None if no_target else st.session_state.get("tgt", "").strip() or None
    src = st.session_state.get("src", "")
    return Choices(model=model, src=src, tgt=tgt, device=device)


def model_choice() -> str | None:
    """The model picker: a shipped model's name, a typed folder or hub id ("" while none is typed), or
    None when the typed one is refused (the message is shown)."""
    models = api.list_models()
    options = [*models, CUSTOM_PATH]
    default = options.index(api.DEFAULT_MODEL) if api.DEFAULT_MODEL in models else 0
    choice = links.bound(
        st.selectbox,
        "Model",
        options,
        index=default,
        key="model",
        format_func=lambda m: "minilm: MiniLM, a real English encoder (BERT)" if m == api.MINILM else m,
    )
    if choice != CUSTOM_PATH:
        return choice
    hub = (
        "downloaded from the Hugging Face hub when this server has no copy"
        if downloads_allowed()
        else f"if this server already has it (its operator can allow downloads with {ALLOW_DOWNLOADS}=1)"
    )
    typed = links.bound(
        st.text_input,
        "Checkpoint directory or hub id",
        key="model_path",
        help="A folder under the model folders this server offers (ATTNVIZ_MODEL_ROOTS), by its path there; "
        f"or a Hugging Face hub id such as Helsinki-NLP/opus-mt-en-de, {hub}.",
    ).strip()
    try:
        if downloads_allowed() and is_hub_id(typed):  # a download may start: say so while it runs
            with st.spinner(f"Getting {typed} from the Hugging Face hub…"):
                return str(visitor_model(typed))
        return str(visitor_model(typed)) if typed else ""
    except AttnvizError as e:
        show_error(e)
        return None


def device_choice() -> str:
    """The device picker: a concrete device (auto: a GPU if any); the CPU when the one asked for is absent."""
    st.selectbox("Device", DEVICE_CHOICES, key="device", help="auto: a GPU when there is one, else the CPU")
    device = st.session_state.get("device", "auto")
    concrete = available_devices()
    if device == "auto":
        return concrete[1] if len(concrete) > 1 else "cpu"
    if device not in concrete:
        st.warning(f"No {device} device on this machine: running on the CPU instead.")
        return "cpu"
    return device


def sentence_inputs(bundle, model: str) -> None:
    """The source and target boxes and the example pills; a newly chosen model starts from its first example."""
    examples = bundle.info.get("examples") or []
    if "src_model" not in st.session_state and st.query_params.get("src"):
        st.session_state["src_model"] = model  # opened from a link: its sentence, not the model's example
    if st.session_state.get("src_model") != model:  # a new model: start from its first example
        if st.session_state.get("src_model") is not None:  # and from its own clearest head
            for key in PER_MODEL_VIEW:
                st.session_state.pop(key, None)
        st.session_state["src"] = examples[0] if examples else ""
        st.session_state["tgt"] = ""
        st.session_state["src_model"] = model
    lm = bundle.config.decoder_only  # a language model reads one text: its prompt, and has no target
    links.bound(st.text_area, "Prompt" if lm else "Source sentence", key="src", height=80)
    if examples:
        st.pills("Examples", examples, key=EXAMPLE_PILLS, on_change=use_example)
    if lm:
        return
    encoder_only = bundle.config.encoder_only
    links.bound(
        st.text_input,
        "Target sentence (optional)",
        key="tgt",
        disabled=encoder_only,
        help="Teacher forcing: the decoder reads this sentence instead of the model's own output."
        + (" This model is encoder-only: it has no decoder." if encoder_only else ""),
    )


def model_caption(bundle, device: str) -> None:
    """One line on the loaded model: its name and family, sizes, device and where it comes from."""
    family, cfg = bundle.info.get("family", "attnviz"), bundle.config
    layers = (
        f"{cfg.n_dec_layers} layers (decoder-only)"
        if cfg.decoder_only
        else f"{cfg.n_enc_layers}+{cfg.n_dec_layers} layers"
    )
    st.caption(
        f"{escape_markdown(bundle.name)} ({escape_markdown(family)}): "  # a folder's names: shown as text
        f"{layers}, "
        f"{bundle.config.n_heads} heads, d_model {bundle.config.d_model}, "
        f"vocabulary {bundle.config.src_vocab_size:,}, on {device}. "
        f"From: {escape_markdown(bundle.info.get('source', 'trained by attnviz train'))}."
    )
