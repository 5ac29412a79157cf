"""attnviz: the home page. Run with `streamlit run app.py`."""

import streamlit as st

from attnviz.app import domain_notice, truncation_notice, viewport, views
from attnviz.app.cache import long_text
from attnviz.app.follow import map_chart
from attnviz.app.frame import Context, frame
from attnviz.app.present import presenting
from attnviz.app.registry import PAGES
from attnviz.app.widgets import escape_markdown, guarded
from attnviz.figures.common import export_config
from attnviz.kinds import TITLES, allowed

# What the home page says of the model in front of the visitor: a translation model (and no model
# yet), a language model, an encoder alone. Each: what attnviz shows, then how its maps read.
ABOUT = {
    "encoder-decoder": (
        "attnviz shows the attention of the encoder-decoder Transformer of *Attention Is All You Need* "
        "(Vaswani et al., 2017), per layer and per head, for a sentence you choose, with models that really "
        "were trained (see each model's card in `pretrained/`).",
        "Cross-attention maps are *target rows by source columns*: the decoder, about to write its next token, "
        "looks at the source, so each of its rows is named by the token it reads and the token it writes "
        '("a → b").',
    ),
    "language model": (
        "attnviz shows the attention of the model chosen in the sidebar, a language model: the Transformer of "
        "*Attention Is All You Need* (Vaswani et al., 2017) without its encoder, one stack of masked "
        "self-attention that reads a prompt and predicts each next token; per layer and per head, for a prompt "
        "you choose (see each model's card in `pretrained/`).",
        "Its maps are *prompt rows by prompt columns*: each token looks at itself and the tokens before it, "
        "never ahead, while the model predicts the token after it. It has no encoder, so no cross-attention.",
    ),
    "encoder": (
        "attnviz shows the attention of the model chosen in the sidebar, an encoder: the Transformer of "
        "*Attention Is All You Need* (Vaswani et al., 2017) without its decoder, per layer and per head, for a "
        "sentence you choose.",
        "Its maps are *sentence rows by sentence columns*: every token may look at every other, before and "
        "after it. It has no decoder, so no cross-attention.",
    ),
}

PROSE = """
{about}

**How to read a map.** Each row is a *query* position, each column a *key* position; a row holds
the weights with which that query mixes the keys' values, and sums to 1. {reading}
Grey cells are masked: the model could not look there (a future position, or padding).

**Attention is not explanation.** A large weight says that a value vector was mixed in, not that
it caused the output: values differ in size, residual connections carry information around
attention, and other heads and layers can undo what one head does (Jain & Wallace, 2019;
Wiegreffe & Pinter, 2019). Read maps as what the model computed, not as why it decided.
"""


def show_teaser(ctx: Context) -> None:
    """The first screen: the model's clearest head for the sidebar's sentence, with one line on how to read it.

    Cross-attention (where the decoder looks) when the model has a decoder, else the encoder's
    self-attention; the words and contrast controls sit below the map.
    """
    if ctx.long:  # every map at once would not fit: the explorer shows it tile by tile
        st.info(long_text(*ctx.key) + " The Attention explorer shows every head of it, tile by tile.")
        explorer = next(page for page in PAGES if page.path == "pages/explorer.py")
        st.page_link(explorer.path, label=f"Open it in the {explorer.title}", icon=explorer.icon)
        return
    # on a phone or a projector the map comes right under the title, what it shows below it
    phone = viewport.picture_area()
    if phone is None and presenting():
        phone = st.container()
    heading = st.container()
    picture = phone if phone is not None else st.container()
    words_column, contrast_column = st.columns([1, 3])
    words, contrast = views.words_and_contrast(words_column, contrast_column)
    export, chosen, bundle = ctx.export(words), ctx.clearest_head(), ctx.bundle
    kind, layer, head = chosen
    with heading:
        truncation_notice(export)
        domain_notice(ctx.choices)
        source = escape_markdown(ctx.choices.src)
        if kind == "cross":
            output = escape_markdown(bundle.tokenizer.decode(export.tgt_ids[1:].tolist())) or "(nothing)"
            st.markdown(f"**{source}** → **{output}**")
            st.caption(
                'Each row is the decoder writing one token of the output, named "reads → writes"; each column '
                "is a source token. The darker a cell, the more that row looks at that source token while writing. "
                f"Layer {layer}, head {head}: this model's clearest cross-attention head."
            )
        elif kind == "decoder":  # a language model: its prompt, causal
            st.markdown(f"**{source}**")
            which = (
                f"the {chosen.named} head that this model's card names"
                if chosen.named
                else "this model's clearest head"
            )
            st.caption(
                "A language model: each row is a token of the prompt looking back at the tokens before it "
                "(columns), never ahead; the darker a cell, the more it looks. "
                f"Layer {layer}, head {head}: {which}. It has no encoder, so no cross-attention."
            )
        else:
            st.markdown(f"**{source}**")
            st.caption(
                "Each row is a token looking at the others (columns); the darker a cell, the more it looks. "
                f"Layer {layer}, head {head}: this model's clearest head. It has no decoder, so no cross-attention."
            )
    title = f"{TITLES[kind]}, layer {layer}, head {head}"
    matrix = getattr(export, kind)[layer - 1, head - 1]
    shown = ("home", *ctx.key, words)  # what the map depends on
    mask = allowed(kind, *matrix.shape)
    rows, columns = views.row_labels(export, kind), export.tokens(kind)[1]
    fig = views.one_head(shown, matrix, rows, columns, kind, contrast, mask, title)
    name = f"{ctx.file_stem}-{kind}" + ("-words" if words else "") + f"-L{layer}H{head}"
    map_chart(picture, fig, "_home_map", config=export_config(name, "png"))


def model_kind(ctx: Context) -> str:
    """Which of `ABOUT`'s texts fits the model in the sidebar (a translation model's when there is none)."""
    if not ctx.ready:
        return "encoder-decoder"
    config = ctx.bundle.config
    return "language model" if config.decoder_only else "encoder" if config.encoder_only else "encoder-decoder"


def body(ctx: Context) -> None:
    """The teaser when a model is chosen, then how to read a map and the pages."""
    if ctx.ready:
        guarded(lambda: show_teaser(ctx))  # a failing teaser leaves the rest of the page standing
    about, reading = ABOUT[model_kind(ctx)]
    st.markdown(PROSE.format(about=about, reading=reading))
    st.subheader("Pages")
    for page in PAGES[1:]:
        st.page_link(page.path, label=page.title, icon=page.icon)
        st.caption(page.description)


frame(body, needs_model=False)
