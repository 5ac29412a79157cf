"""Compare: the same view for two sentences or two models, side by side, and their difference."""

import streamlit as st

from attnviz.app import (
    CUSTOM_PATH,
    bound,
    clamp_state,
    clearest_head,
    computed,
    domain_notice,
    footer,
    load_bundle,
    shared,
    show_error,
    sidebar,
    truncation_notice,
    views,
)
from attnviz.app.present import intro, page_config, picture_area, room
from attnviz.app.views import EXACT_MAX, one_head, words_and_contrast
from attnviz.checkpoints.catalog import list_models, visitor_model
from attnviz.errors import AttnvizError
from attnviz.figures.common import export_config
from attnviz.figures.compare import difference_heatmap, difference_image, head_changes, pair_labels, why_no_difference
from attnviz.figures.images import head_grid
from attnviz.kinds import KINDS, TITLES, allowed

page_config("compare")
choices = sidebar()
st.title("Compare")
intro(
    "**A** is the model and sentence of the sidebar; **B** is another sentence on the same model, or the same "
    "sentence on another model. Both are drawn the same way, side by side, and when their maps have the same "
    "shape, their difference A - B (red where A attends more, blue where B does)."
)

WHAT = {"sentence": "another sentence", "model": "another model"}
VIEWS = {"one": "One head", "grid": "All heads"}


def next_example(choices) -> str:
    """Sentence B to open on: the model's example after A's sentence (B = A would show no difference)."""
    examples = load_bundle(choices.model, choices.device).info.get("examples") or []
    if choices.src in examples:  # the examples after A's, then those before it
        at = examples.index(choices.src)
        examples = examples[at + 1 :] + examples[:at]
    return next((e for e in examples if e != choices.src), choices.src)


def side_b(model_a: str) -> tuple[str, str, str | None] | None:
    """(model, sentence, target) of side B, from this page's widgets; None when B cannot be used yet."""
    what = bound(st.radio, "Compare A with", list(WHAT), format_func=WHAT.get, horizontal=True, key="cmp_what")
    if what == "sentence":
        st.session_state.setdefault("cmp_src", next_example(choices))
        left, right = st.columns([2, 1])
        src = bound(left.text_area, "Sentence B", key="cmp_src", height=68)
        tgt = bound(right.text_input, "Target B (optional)", key="cmp_tgt").strip() or None
        return model_a, src, tgt
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
        try:
            model = str(visitor_model(typed))
        except AttnvizError as e:
            show_error(e)
            return None
    return model, choices.src, choices.tgt


def main() -> None:
    if choices is None:
        return
    picture = picture_area()  # A and B side by side: under the title in presenter mode
    b = side_b(choices.model)
    if b is None:
        return
    model_b, src_b, tgt_b = b
    c1, c2 = st.columns([1, 3])
    words, contrast = words_and_contrast(c1, c2)
    runs = {}
    for side, (model, src, tgt) in {"A": (choices.model, choices.src, choices.tgt), "B": b}.items():
        try:
            runs[side] = computed("attention", model, choices.device, src, tgt, words)
        except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
            st.error(f"Side {side}:")
            show_error(e)
            return
        truncation_notice(runs[side])
    domain_notice(choices)
    a, b_export = runs["A"], runs["B"]
    kinds = [k for k in KINDS if getattr(a, k) is not None and getattr(b_export, k) is not None]
    clamp_state("cmp_kind", kinds)
    default = kinds.index("cross") if "cross" in kinds else 0  # where the decoder looks, as on the explorer
    captions = [TITLES[k] for k in kinds]
    kind = bound(st.radio, "Attention", kinds, index=default, captions=captions, horizontal=True, key="cmp_kind")
    maps = {"A": getattr(a, kind), "B": getattr(b_export, kind)}
    tokens = {side: (views.row_labels(e, kind), e.tokens(kind)[1]) for side, e in runs.items()}
    n_layers = min(m.shape[0] for m in maps.values())
    n_heads = min(m.shape[1] for m in maps.values())
    c1, c2, c3 = st.columns([1, 1, 2])
    view = bound(c3.selectbox, "View", list(VIEWS), format_func=VIEWS.get, key="cmp_view")
    clearest = clearest_head(choices.model, choices.device)
    layer, head = views.layer_and_head(
        (c1, c2), kind, n_layers, n_heads, clearest, keys=("cmp_layer", "cmp_head"), keyboard=False
    )
    keys = {
        side: (model, choices.device, src, tgt, kind, words)
        for side, (model, src, tgt) in {
            "A": (choices.model, choices.src, choices.tgt),
            "B": (model_b, src_b, tgt_b),
        }.items()
    }
    blocked = why_no_difference(kind, maps["A"].shape, maps["B"].shape)

    if view == "one":
        columns = picture.columns(2)
        for side, column in zip(("A", "B"), columns, strict=True):
            matrix = maps[side][layer - 1, head - 1]
            q_tokens, k_tokens = tokens[side]
            title = f"{side}: {TITLES[kind]}, layer {layer}, head {head}"
            fig = one_head(
                (*keys[side], layer, head),
                matrix,
                q_tokens,
                k_tokens,
                kind,
                contrast,
                allowed(kind, *matrix.shape),
                title,
            )
            column.plotly_chart(
                room(fig), width="stretch", config=export_config(f"compare-{side}-{kind}-L{layer}H{head}", "png")
            )
        if blocked:
            st.info(blocked)
            return
        difference = maps["A"][layer - 1, head - 1], maps["B"][layer - 1, head - 1]
        q_labels = pair_labels(tokens["A"][0], tokens["B"][0])
        k_labels = pair_labels(tokens["A"][1], tokens["B"][1])
        title = f"A - B: {TITLES[kind]}, layer {layer}, head {head}"
        fig = shared(
            "compare-difference",
            (keys["A"], keys["B"], layer, head),
            lambda: (
                difference_heatmap(*difference, q_labels, k_labels, kind, title)
                if max(difference[0].shape) <= EXACT_MAX
                else difference_image(difference[0] - difference[1], q_labels, k_labels, kind, title)
            ),
        )
    else:
        for side in ("A", "B"):
            q_tokens, k_tokens = tokens[side]
            fig = shared(
                "compare-grid",
                (*keys[side], contrast),
                lambda side=side, q_tokens=q_tokens, k_tokens=k_tokens: head_grid(
                    maps[side], q_tokens, k_tokens, kind, contrast, allowed(kind, *maps[side].shape[-2:])
                ),
            )
            st.markdown(f"**{side}**")
            st.plotly_chart(room(fig), width="stretch", config=export_config(f"compare-{side}-{kind}-all-heads", "png"))
        if blocked:
            st.info(blocked)
            return
        fig = shared(
            "compare-changes",
            (keys["A"], keys["B"]),
            lambda: head_changes(maps["A"], maps["B"], kind, "Which heads changed: the largest |A - B| per head"),
        )
    if tokens["A"] != tokens["B"]:
        st.caption("Where the two sides' tokens differ, an axis label names both: A's token | B's token.")
    st.plotly_chart(room(fig), width="stretch", config=export_config(f"compare-difference-{kind}", "png"))


main()
footer()
