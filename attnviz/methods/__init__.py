"""Beyond the weights: what each head contributes, and what the output does without it.

The research methods' wing. Each contribution method is one module and one entry of
`METHODS`, keyed by its command-line name; the CLI (``attnviz attribute --method``), the
Python API ([`attnviz.attribute`][attnviz.api.attribute]) and the app's page read this registry and nothing else.
Ablation (`ablation`) and head importance (`importance`)
change the model's output rather than explain it, and have their own entry points.

Methods use the core (the model, its named points in `attnviz.hooks`, decoding, analysis),
never the app, the API or the checkpoint importers: they take a model and token ids, ``src`` (1, S)
and ``tgt`` (1, T) (the decoder input, or None for an encoder-only model), and return a
`Contributions`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnviz.methods import grad_attention, norm, rollout, value_zeroing
from attnviz.methods.common import Contributions


@dataclass(frozen=True)
class Method:
    """A contribution method as the CLI, the API and the app know it."""

    name: str  # the command-line name
    title: str  # for people
    function: Callable[..., Contributions]  # (model, src, tgt=None, position=None) -> Contributions
    paper: str  # the citation, with an arXiv number
    normalisation: str  # what the numbers are and how (if at all) rows are scaled
    per_head: bool  # arrays (L, H, Q, K) when True, else (L, Q, K)
    value_name: str  # what one number is, for colour bars and CSV columns
    shares: bool  # each number lies in 0..1 (so a colour scale can end at 1)
    explanation: str  # the formula and its caveats in two or three sentences, for the page
    needs_decoder: bool = False  # it explains a prediction, which an encoder-only model does not make
    uses_position: bool = False  # it explains the prediction at one decoder position
    extras: tuple[tuple[str, str], ...] = ()  # (name, meaning) of each further array it returns
    # (name, side) of each further array that has one number per token of a side ("source" or
    # "target"), which words sum over their pieces (attnviz.words.merge_export)
    token_extras: tuple[tuple[str, str], ...] = ()


METHODS: dict[str, Method] = {
    "norm": Method(
        name="norm",
        title="Norm-based attention",
        function=norm.norm_based,
        paper='Kobayashi, Kuribayashi, Yokoi and Inui (2020), "Attention is Not Only a Weight: Analyzing '
        'Transformers with Vector Norms", EMNLP, arXiv:2004.10102',
        normalisation="none: ||a_ij f_h(x_j)||_2 in the units of the model's hidden states, with "
        "f_h(x) = (x W_V^h + b_V^h) W_O^h; b_O left out; rows do not sum to 1",
        per_head=True,
        value_name="norm",
        shares=False,
        explanation=(
            "Each cell is ‖a_ij · f_h(x_j)‖: the weight times the length of what key j's value vector becomes "
            "after W_V and head h's part of W_O, so a large weight on a vector the head shrinks to nothing "
            "counts for little. It measures how much each key moves the head's output, not whether that "
            "helps the prediction; the residual connection and the other heads are left out."
        ),
    ),
    "value-zeroing": Method(
        name="value-zeroing",
        title="Value zeroing",
        function=value_zeroing.value_zeroing,
        paper='Mohebbi, Zuidema, Chrupała and Alishahi (2023), "Quantifying Context Mixing in Transformers", '
        "EACL, arXiv:2301.12971",
        normalisation="1 - cos(y_i, y_i without token j's values) per layer, each row divided by its sum "
        "(rows sum to 1, or 0 when nothing changes); keys a query cannot see are exactly 0",
        per_head=False,
        value_name="share",
        shares=True,
        explanation=(
            "Token j's value vectors are set to zero in every head of the layer, the whole layer (attention, "
            "residuals, LayerNorms, feed-forward) is recomputed, and cell (i, j) is how far the output at "
            "position i turns away: 1 − cos(y_i, y_i without j), each row scaled to sum to 1. It covers the "
            "residual path and the feed-forward network, but one layer at a time, and cosine distance ignores "
            "changes of length."
        ),
    ),
    "rollout": Method(
        name="rollout",
        title="Attention rollout (encoder and decoder)",
        function=rollout.rollout,
        paper='Abnar and Zuidema (2020), "Quantifying Attention Flow in Transformers", ACL, arXiv:2005.00928; '
        'decoder as in ALTI+, Ferrando, Gállego, Alastruey, Escolano and Costa-jussà (2022), "Towards Opening '
        'the Black Box of Neural Machine Translation: Source and Target Contributions to the Model", EMNLP, '
        "arXiv:2205.11631",
        normalisation="shares of the input tokens after each layer: encoder rows sum to 1; for the decoder, "
        "cross (source tokens) and decoder (target tokens) of the same row sum to 1 together",
        per_head=False,
        value_name="share",
        shares=True,
        explanation=(
            "Heads are averaged, the residual connection counts as 0.5·I, and layers are multiplied, so each "
            "row estimates how much of a position after layer l comes from each input token; in the decoder, "
            "cross-attention brings in the encoder's rollout, and a row's source part and target part sum to 1 "
            "together. It assumes information mixes linearly through the weights alone, ignoring values, W_O, "
            "the feed-forward networks and LayerNorm."
        ),
    ),
    "grad-attention": Method(
        name="grad-attention",
        title="Gradient-weighted attention",
        function=grad_attention.grad_attention,
        paper='Chefer, Gur and Wolf (2021), "Generic Attention-model Explainability for Interpreting Bi-Modal '
        'and Encoder-Decoder Transformers", ICCV, arXiv:2103.15679',
        normalisation="mean over heads of max(0, d logit / dA * A) for the logit of the predicted token at "
        "the chosen position, per layer (no scaling); relevance propagated by the paper's rules 6, 7 and 10",
        per_head=False,
        value_name="relevance",
        shares=False,
        explanation=(
            "For the logit of the token the model predicts at the chosen position, each map becomes "
            "mean over heads of max(0, ∂logit/∂A ⊙ A): weights that raise that logit, weighted by how much. "
            "The paper's update rules then carry this relevance through the layers to the source and target "
            "tokens. Gradients are local: a first-order picture of one prediction, and the max(0, ·) drops "
            "evidence against it."
        ),
        needs_decoder=True,
        uses_position=True,
        extras=(
            (
                "source_relevance",
                "(S,) float32: the relevance of each source token for the prediction, row `position` of R_ts",
            ),
            (
                "target_relevance",
                "(T,) float32: the relevance of each decoder input token for the prediction, row `position` of "
                "R_tt; it includes the 1 that R_tt's identity start puts on the position itself",
            ),
        ),
        token_extras=(("source_relevance", "source"), ("target_relevance", "target")),
    ),
}

__all__ = ["METHODS", "Contributions", "Method"]
