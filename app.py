"""attnviz: the home page. Run with `streamlit run app.py`."""

import streamlit as st

from attnviz.app import footer, registry, run_attention, shared, show_error, sidebar, truncation_notice
from attnviz.figures.attention import attention_heatmap

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


def show_teaser(export) -> None:
    """One map that needs no choices: where the decoder looks, or, encoder-only, the encoder."""
    if export.cross is None:  # an encoder-only model: its self-attention is all there is
        L, H = export.encoder.shape[:2]
        st.subheader("How the encoder's tokens look at each other")
        st.caption(
            f"Encoder self-attention of the last layer ({L}), averaged over its {H} heads. This model has no "
            "decoder, so there is no cross-attention; the attention explorer shows every layer and head."
        )
        build = lambda: attention_heatmap(  # noqa: E731 - built once per sentence, shared (attnviz.app.shared)
            export.encoder[-1].mean(0),
            export.src_tokens,
            export.src_tokens,
            "encoder",
            title=f"Encoder self-attention, layer {L}, mean of {H} heads",
        )
    else:
        L, H = export.cross.shape[:2]
        output = "".join(export.tgt_tokens[1:]).replace("▁", " ").strip()
        st.subheader("Where the decoder looks")
        st.markdown(f"**Source:** {choices.src}  \n**Decoder input:** {output or '(empty)'}")
        st.caption(
            f"Cross-attention of the last layer ({L}), averaged over its {H} heads. "
            "The attention explorer shows every layer and head."
        )
        build = lambda: attention_heatmap(  # noqa: E731 - built once per sentence, shared (attnviz.app.shared)
            export.cross[-1].mean(0),
            export.tgt_tokens,
            export.src_tokens,
            "cross",
            title=f"Cross-attention, layer {L}, mean of {H} heads",
        )
    st.plotly_chart(
        shared("home-teaser", (choices.model, choices.device, choices.src, choices.tgt), build), width="stretch"
    )


if choices is not None:
    try:
        export = run_attention(choices.model, choices.device, choices.src, choices.tgt)
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e)
    else:
        truncation_notice(export)
        show_teaser(export)
footer()
