"""attnviz: the home page. Run with `streamlit run app.py`."""

import streamlit as st

from attnviz.app import footer, registry, run_attention, show_error, sidebar, truncation_notice, views

st.set_page_config(page_title="attnviz", page_icon="🔍", layout="wide")
choices = sidebar()

st.title("attnviz: attention in the Transformer")
st.markdown(
    """
attnviz shows the attention of the encoder-decoder Transformer of *Attention Is All You Need*
(Vaswani et al., 2017), per layer and per head, for a sentence you choose, with models that really
were trained (see each model's card in `pretrained/`).

**How to read a map.** Each row is a *query* position, each column a *key* position; a row holds
the weights with which that query mixes the keys' values, and sums to 1. Cross-attention maps are
*target rows by source columns*: the decoder, about to write its next token, looks at the source.
Grey cells are masked: the model could not look there (a future position, or padding).

**Attention is not explanation.** A large weight says that a value vector was mixed in, not that
it caused the output: values differ in size, residual connections carry information around
attention, and other heads and layers can undo what one head does (Jain & Wallace, 2019;
Wiegreffe & Pinter, 2019). Read maps as what the model computed, not as why it decided.
"""
)

st.subheader("Pages")
for page in registry.PAGES[1:]:
    st.page_link(page.path, label=page.title, icon=page.icon)
    st.caption(page.description)


def show_teaser(heading, export, words: bool, contrast: str) -> None:
    """One map that needs no choices (``heading``: the container above the controls): where the decoder
    looks, or, encoder-only, the encoder."""
    if export.cross is None:  # an encoder-only model: its self-attention is all there is
        L, H = export.encoder.shape[:2]
        heading.subheader("How the encoder's tokens look at each other")
        heading.caption(
            f"Encoder self-attention of the last layer ({L}), averaged over its {H} heads. This model has no "
            "decoder, so there is no cross-attention; the attention explorer shows every layer and head."
        )
        kind, matrix, queries = "encoder", export.encoder[-1].mean(0), export.src_tokens
        title = f"Encoder self-attention, layer {L}, mean of {H} heads"
    else:
        L, H = export.cross.shape[:2]
        output = (" ".join if words else "".join)(export.tgt_tokens[1:]).replace("▁", " ").strip()
        heading.subheader("Where the decoder looks")
        heading.markdown(f"**Source:** {choices.src}  \n**Decoder input:** {output or '(empty)'}")
        heading.caption(
            f"Cross-attention of the last layer ({L}), averaged over its {H} heads. "
            "The attention explorer shows every layer and head."
        )
        kind, matrix, queries = "cross", export.cross[-1].mean(0), export.tgt_tokens
        title = f"Cross-attention, layer {L}, mean of {H} heads"
    shown = ("home", choices.model, choices.device, choices.src, choices.tgt, words)  # what the map depends on
    fig = views.one_head(shown, matrix, queries, export.src_tokens, kind, contrast, None, title)
    st.plotly_chart(fig, width="stretch")


if choices is not None:
    heading = st.container()  # filled once the map is known; the controls sit between it and the map
    words_column, contrast_column = st.columns([1, 3])
    words, contrast = views.words_and_contrast(words_column, contrast_column)
    try:
        export = run_attention(choices.model, choices.device, choices.src, choices.tgt, words)
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e)
    else:
        truncation_notice(export)
        show_teaser(heading, export, words, contrast)
footer()
