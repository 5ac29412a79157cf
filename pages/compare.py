"""Compare: the same view for two sentences or two models, side by side, and their difference."""

import html
from dataclasses import dataclass

import numpy as np
import streamlit as st

from attnviz.app import CUSTOM_PATH, Choices, bound, domain_notice, shared, truncation_notice, views
from attnviz.app.cache import computed, load_bundle
from attnviz.app.frame import Context, frame
from attnviz.app.present import picture_area, room
from attnviz.app.views import EXACT_MAX, KIND_NAMES, one_head, words_and_contrast
from attnviz.app.widgets import escape_markdown
from attnviz.checkpoints.catalog import list_models, visitor_model
from attnviz.export import AttentionExport
from attnviz.figures.common import export_config
from attnviz.figures.compare import difference_heatmap, difference_image, head_changes, pair_labels, why_no_difference
from attnviz.figures.images import head_grid
from attnviz.kinds import KINDS, TITLES, allowed

INTRO = (
    "**A** is the model and sentence of the sidebar; **B** is another sentence on the same model, or the same "
    "sentence on another model. Both are drawn the same way, side by side, and when their maps have the same "
    "shape, their difference A - B (red where A attends more, blue where B does)."
)

WHAT = {"sentence": "another sentence", "model": "another model"}
VIEWS = {"one": "One head", "grid": "All heads"}
SIDES = ("A", "B")


@dataclass(frozen=True)
class Side:
    """Side B of the comparison: a model, a sentence and its optional target (on the sidebar's device)."""

    model: str
    src: str
    tgt: str | None


@dataclass(frozen=True)
class Shown:
    """What both sides show: one kind of attention, its maps and labels per side, a layer and head, the colours."""

    kind: str
    maps: dict[str, np.ndarray]  # side: (L, H, Q, K)
    tokens: dict[str, tuple[list[str], tuple[str, ...]]]  # side: (row labels, column tokens)
    keys: dict[str, tuple]  # side: what its maps depend on
    layer: int
    head: int
    contrast: str
    names: dict[str, str]  # side: its model's name when the sides' models differ, else ""


def next_example(ctx: Context) -> str:
    """Sentence B to open on: the model's example after A's sentence (B = A would show no difference)."""
    src = ctx.choices.src
    examples = ctx.bundle.info.get("examples") or []
    if src in examples:  # the examples after A's, then those before it
        at = examples.index(src)
        examples = examples[at + 1 :] + examples[:at]
    return next((e for e in examples if e != src), src)


def side_b(ctx: Context) -> Side | None:
    """Side B, from this page's widgets; None when B cannot be used yet."""
    what = bound(st.radio, "Compare A with", list(WHAT), format_func=WHAT.get, horizontal=True, key="cmp_what")
    if what == "sentence":
        st.session_state.setdefault("cmp_src", next_example(ctx))
        config = ctx.bundle.config
        if config.decoder_only or config.encoder_only:  # a model that reads no target is offered no box for one
            return Side(ctx.model, bound(st.text_area, "Sentence B", key="cmp_src", height=68), None)
        left, right = st.columns([2, 1])
        src = bound(left.text_area, "Sentence B", key="cmp_src", height=68)
        tgt = bound(right.text_input, "Target B (optional)", key="cmp_tgt").strip() or None
        return Side(ctx.model, src, tgt)
    options = [*list_models(), CUSTOM_PATH]
    model = bound(st.selectbox, "Model B", options, key="cmp_model")
    if model == CUSTOM_PATH:
        typed = bound(
            st.text_input,
            "Model B: checkpoint directory or hub id",
            key="cmp_model_path",
            help="A folder under the model folders this server offers, or a hub id it already has.",
        ).strip()
        if not typed:
            st.info("Type the path of model B's folder.")
            return None
        model = str(visitor_model(typed))  # a refused path's message comes from the page's guard
    return Side(model, ctx.choices.src, target_for(ctx, model))


def target_for(ctx: Context, model: str) -> str | None:
    """Sentence A's target for model B, when B reads one: a language model or an encoder-only one reads the
    sentence alone (its side had failed with "there is no target sentence"), and the page says so."""
    if ctx.choices.tgt is None:
        return None
    try:
        config = load_bundle(model, ctx.device).config
    except Exception:
        st.error("Side B:")  # the error's own message follows, from the page's guard
        raise
    if config.decoder_only or config.encoder_only:
        st.caption("Model B reads no target: its maps are of sentence A alone.")
        return None
    return ctx.choices.tgt


def side_exports(ctx: Context, b: Side, words: bool) -> dict[str, AttentionExport]:
    """The maps of side A and side B, each with its truncation notice; a failure names its side first."""
    jobs = {
        "A": lambda: ctx.export(words),
        "B": lambda: computed("attention", b.model, ctx.device, b.src, b.tgt, words),
    }
    runs = {}
    for side, job in jobs.items():
        try:
            runs[side] = job()
        except Exception:
            st.error(f"Side {side}:")  # the error's own message follows, from the page's guard
            raise
        truncation_notice(runs[side])
    return runs


def no_common_kind(runs: dict[str, AttentionExport]) -> str:
    """Why there is nothing to compare: the kinds of attention of each side, none of them in both."""
    has = {side: ", ".join(KIND_NAMES[k] for k in KINDS if getattr(e, k) is not None) for side, e in runs.items()}
    return (
        f"The two models have no kind of attention in common (A: {has['A']}; B: {has['B']}), so no map of one "
        "can be set beside a map of the other: choose a model B with one of A's kinds."
    )


def body(ctx: Context) -> None:
    picture = picture_area()  # A and B side by side: under the title in presenter mode
    b = side_b(ctx)
    if b is None:
        return
    c1, c2 = st.columns([1, 3])
    words, contrast = words_and_contrast(c1, c2)
    runs = side_exports(ctx, b, words)
    for side, choices in (("A", ctx.choices), ("B", Choices(b.model, b.src, b.tgt, ctx.device))):
        domain_notice(choices, side)
    a, b_export = runs["A"], runs["B"]
    kinds = [k for k in KINDS if getattr(a, k) is not None and getattr(b_export, k) is not None]
    if not kinds:
        st.info(no_common_kind(runs))
        return
    kind = views.kind_choice(kinds, "cmp_kind")
    maps = {"A": getattr(a, kind), "B": getattr(b_export, kind)}
    tokens = {side: (views.row_labels(e, kind), e.tokens(kind)[1]) for side, e in runs.items()}
    n_layers = min(m.shape[0] for m in maps.values())
    n_heads = min(m.shape[1] for m in maps.values())
    c1, c2, c3 = st.columns([1, 1, 2])
    view = bound(c3.selectbox, "View", list(VIEWS), format_func=VIEWS.get, key="cmp_view")
    layer, head = views.layer_and_head(
        (c1, c2), kind, n_layers, n_heads, ctx.clearest_head(), keys=("cmp_layer", "cmp_head"), keyboard=False
    )
    keys = {"A": (*ctx.key, kind, words), "B": (b.model, ctx.device, b.src, b.tgt, kind, words)}
    names = {"A": "", "B": ""}
    if b.model != ctx.model:  # two models: each side says which, by the name the sidebar gives it
        names = {"A": ctx.label, "B": load_bundle(b.model, ctx.device).name}
    shown = Shown(kind, maps, tokens, keys, layer, head, contrast, names)
    blocked = why_no_difference(kind, maps["A"].shape, maps["B"].shape)
    if view == "one":
        draw_one_head(shown, picture)
    else:
        draw_all_heads(shown)
    if blocked:
        st.info(blocked)
        return
    fig = one_head_difference(shown) if view == "one" else head_changes_figure(shown)
    if tokens["A"] != tokens["B"]:
        st.caption("Where the two sides' tokens differ, an axis label names both: A's token | B's token.")
    st.plotly_chart(room(fig), width="stretch", config=export_config(f"compare-difference-{kind}", "png"))


def draw_one_head(s: Shown, picture) -> None:
    """The chosen head of A and of B, side by side."""
    kind, layer, head = s.kind, s.layer, s.head
    for side, column in zip(SIDES, picture.columns(2), strict=True):
        matrix = s.maps[side][layer - 1, head - 1]
        q_tokens, k_tokens = s.tokens[side]
        named = f" ({html.escape(s.names[side], quote=False)})" if s.names[side] else ""  # plotly reads HTML
        title = f"{side}{named}: {TITLES[kind]}, layer {layer}, head {head}"
        key = (*s.keys[side], layer, head)
        fig = one_head(key, matrix, q_tokens, k_tokens, kind, s.contrast, allowed(kind, *matrix.shape), title)
        column.plotly_chart(
            room(fig, 0.5), width="stretch", config=export_config(f"compare-{side}-{kind}-L{layer}H{head}", "png")
        )


def draw_all_heads(s: Shown) -> None:
    """Every layer and head of A, then of B."""
    kind, contrast = s.kind, s.contrast
    for side in SIDES:
        q_tokens, k_tokens = s.tokens[side]
        maps = s.maps[side]
        fig = shared(
            "compare-grid",
            (*s.keys[side], contrast),
            lambda maps=maps, q_tokens=q_tokens, k_tokens=k_tokens: head_grid(
                maps, q_tokens, k_tokens, kind, contrast, allowed(kind, *maps.shape[-2:])
            ),
        )
        st.markdown(f"**{side}**" + (f" ({escape_markdown(s.names[side])})" if s.names[side] else ""))
        st.plotly_chart(room(fig), width="stretch", config=export_config(f"compare-{side}-{kind}-all-heads", "png"))


def one_head_difference(s: Shown):
    """A - B of the chosen head: a heatmap, or an image when the maps are long."""
    difference = s.maps["A"][s.layer - 1, s.head - 1], s.maps["B"][s.layer - 1, s.head - 1]
    q_labels = pair_labels(s.tokens["A"][0], s.tokens["B"][0])
    k_labels = pair_labels(s.tokens["A"][1], s.tokens["B"][1])
    title = f"A - B: {TITLES[s.kind]}, layer {s.layer}, head {s.head}"
    return shared(
        "compare-difference",
        (s.keys["A"], s.keys["B"], s.layer, s.head),
        lambda: (
            difference_heatmap(*difference, q_labels, k_labels, s.kind, title)
            if max(difference[0].shape) <= EXACT_MAX
            else difference_image(difference[0] - difference[1], q_labels, k_labels, s.kind, title)
        ),
    )


def head_changes_figure(s: Shown):
    """The largest |A - B| of every head."""
    return shared(
        "compare-changes",
        (s.keys["A"], s.keys["B"]),
        lambda: head_changes(s.maps["A"], s.maps["B"], s.kind, "Which heads changed: the largest |A - B| per head"),
    )


frame(body, intro=INTRO)
