"""The app's pages: one entry per page, read by the sidebar, the home page and the tests.

A new page is its file in ``pages/`` and one line here. Widget keys: give a page's widgets keys
with the page's own prefix; keys of widgets whose value Streamlit refuses to have set (buttons,
download buttons, data editors, selectable tables) start with "_" so that the sidebar does not
carry them across pages (`attnviz.app.session.keep_state`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Page:
    path: str  # the page's file, relative to app.py
    title: str
    icon: str  # a Material icon: they ship with Streamlit, so they render offline in any browser
    description: str  # one line on the home page
    heading: str = ""  # the title on the page itself, when it is not ``title``
    # The browser tab's icon. An emoji, drawn by the browser: a Material icon there would be fetched
    # from fonts.gstatic.com, a request off this server (the crafted-link browser test checks).
    favicon: str = "🔍"

    @property
    def url_path(self) -> str:
        """The page's address below the app's root ("" for the home page), as Streamlit derives it."""
        return "" if self.path == "app.py" else PurePosixPath(self.path).stem


PAGES = (
    Page(
        "app.py",
        "Home",
        ":material/home:",
        "what attnviz shows, how to read a map, and where the decoder looks.",
        heading="attnviz: attention in the Transformer",
    ),
    Page(
        "pages/explorer.py",
        "Attention explorer",
        ":material/grid_on:",
        "every map of every layer and head, over pieces or words: one head large (weights or the scores before "
        "the softmax; long inputs at full resolution with a zoom), all heads as a grid, BertViz-style lines, head "
        "averages and attention rollout, head statistics, and a head's queries and keys in one plane (Q-K "
        "embedding); each view exports as PNG/SVG, CSV and NPZ.",
    ),
    Page(
        "pages/compare.py",
        "Compare",
        ":material/compare:",
        "the same view for two sentences or two models, side by side, and their difference where the shapes "
        "match: a sentence with one word changed, two checkpoints of one model, two models on one sentence.",
    ),
    Page(
        "pages/decoding.py",
        "Decoding step by step",
        ":material/play_circle:",
        "greedy or beam search one token at a time: the top candidates, where every head of the decoder looks "
        "at each step, and the alignment growing row by row; teacher forcing with a target sentence.",
        heading="Decoding, step by step",
    ),
    Page(
        "pages/beyond.py",
        "Beyond the weights",
        ":material/science:",
        "what each head contributes and what the output does without it: norm-based attention, value zeroing, "
        "rollout through encoder and decoder, and gradient-weighted attention beside the weights; heads switched "
        "off with the translation and each step's probabilities side by side; and every head's importance.",
    ),
    Page(
        "pages/atlas.py",
        "Head atlas",
        ":material/travel_explore:",
        "every head's habits over many sentences (entropy, distance, the diagonal and neighbours, special tokens and "
        "punctuation, positional heads), heads on a map by how alike they attend, a sortable table, and each head's "
        "most and least typical sentences; for the model's examples, pasted sentences, or a corpus's atlas folder.",
        favicon="🗺️",
    ),
    Page(
        "pages/formation.py",
        "How attention forms",
        ":material/timeline:",
        "every head's story across training, replayed from the history recorded while the model trained: the losses, "
        "every head's statistic over the steps, a head's map at any step beside the final one, every head at that "
        "step, and a language model's induction head forming at the loss's sudden drop (the phase change).",
        favicon="🌱",
    ),
    Page(
        "pages/walkthrough.py",
        "Forward-pass walkthrough",
        ":material/route:",
        "one sentence through the whole model, stage by stage, with the loaded model's own numbers: tokens, "
        "embeddings and positions, each encoder layer's Q, K, V, scores, weights, heads, W_O, residuals, "
        "LayerNorms and feed-forward, the decoder's masked self- and cross-attention, and the output.",
    ),
    Page(
        "pages/mechanics.py",
        "Mechanics of attention",
        ":material/calculate:",
        "equation 1 by hand on a 3-token example you can edit, why the scores are divided by sqrt(d_k), the "
        "padding and subsequent masks, the shapes of multi-head attention, why self-attention without positions "
        "is a bag of tokens (shown on the loaded model), and the learning-rate schedule.",
        heading="The mechanics of attention",
        favicon="🧮",
    ),
    Page(
        "pages/variants.py",
        "Attention variants",
        ":material/blur_on:",
        "sparse attention patterns (local, dilated, strided) and their cost, the same patterns imposed on the "
        "loaded model's encoder, Synthesizer attention without token-to-token scores, and the complexity table "
        "of section 4 with timings measured on this machine.",
        favicon="🧩",
    ),
    Page(
        "pages/positional.py",
        "Positional encoding",
        ":material/waves:",
        "the sinusoidal encoding as a matrix and as curves, its wavelengths, how the dot product of two positions "
        "depends only on their offset, the interleaved and concatenated layouts, and the positions of the loaded "
        "model.",
        favicon="🌊",
    ),
    Page(
        "pages/linearity.py",
        "Relative positions are linear",
        ":material/rotate_right:",
        "section 3.5's claim that PE(pos + k) is a linear function (a rotation) of PE(pos): the matrix M_k, the "
        "angle-addition identities, least-squares fits for sinusoidal, random and learned tables, and where "
        "floating point makes it break.",
        heading="Relative positions are linear maps",
        favicon="🔄",
    ),
)
