"""Beyond the weights: contribution methods beside the weights, heads switched off, and head importance."""

import html

import streamlit as st

from attnviz import analysis
from attnviz.app import (
    bound,
    clamp_state,
    clearest_head,
    computed,
    domain_notice,
    footer,
    load_bundle,
    sentence_pairs,
    shared,
    show_error,
    sidebar,
    truncation_notice,
    views,
)
from attnviz.app.present import intro, page_config, picture_area, room
from attnviz.app.widgets import escape_markdown
from attnviz.figures.common import export_config
from attnviz.figures.contributions import contribution_heatmap, importance_grid, relevance_bars
from attnviz.kinds import KINDS, TITLES, allowed
from attnviz.methods import METHODS
from attnviz.methods.ablation import MODES, Ablation, all_heads, expand_layers, whole_layers

page_config("beyond the weights")
choices = sidebar()
st.title("Beyond the weights")
intro(
    "A weight says how much of a value vector is mixed in, not what that token contributes (Jain & Wallace, "
    "2019). Here: four methods that take more of the model into account, beside the weights of the same layer "
    "and head; the model with heads switched off; and how much each head matters for the output."
)

MAX_IMPORTANCE_SENTENCES = 50
# Above this many heads, measuring them all waits for a click: a model of the paper's base size
# (144 heads) took about 45 s over 20 sentences on a 2-core CPU (benchmarks/bench_methods.py).
AUTO_IMPORTANCE_HEADS = 64
MODE_NAMES = {"zero": "zero (switched off)", "mean": "mean over the sentence"}


def apply_importance_click(kind: str) -> None:
    """A click on a cell of the importance grid switches that head off in the ablation panel (runs before the rerun)."""
    event = st.session_state.get(f"_bw_imp_{kind}")
    points = event.selection.points if event is not None else []
    if points:
        cell = points[0]["customdata"]  # (layer, head); the browser sends a list as {"0": layer, "1": head}
        layer, head = (int(cell[k]) for k in ("0", "1")) if isinstance(cell, dict) else (int(v) for v in cell)
        st.session_state["bw_ablate"] = [f"{kind}:{layer}.{head}"]
        st.session_state["bw_ablate_mode"] = "zero"
        st.session_state["bw_kind"], st.session_state["bw_layer"], st.session_state["bw_head"] = kind, layer, head


def method_section(picture, export, pieces, kinds: list[str], words: bool, contrast: str) -> tuple[str, int, int]:
    """Weights and a method side by side; returns the kind, layer and head chosen (from 1).

    ``export`` holds the maps as shown (over words with ``words``), ``pieces`` over pieces: a
    prediction is explained at a decoder piece, as the model writes them. The two maps go into
    ``picture`` (:func:`~attnviz.app.present.picture_area`).
    """
    st.header("The weights beside a contribution method")
    methods = [name for name, m in METHODS.items() if not (m.needs_decoder and export.tgt_ids is None)]
    clamp_state("bw_method", methods)
    captions = [METHODS[m].title for m in methods]  # the options are the CLI's names, as a link writes them
    method = bound(st.radio, "Method", methods, captions=captions, key="bw_method", horizontal=True)
    spec = METHODS[method]
    st.info(f"**{spec.title}.** {spec.explanation}\n\n*{spec.paper}.*")

    clamp_state("bw_kind", kinds)
    default = kinds.index("cross") if "cross" in kinds else 0  # where the decoder looks, when there is one
    captions = [TITLES[k] for k in kinds]
    kind = bound(st.radio, "Attention", kinds, index=default, captions=captions, horizontal=True, key="bw_kind")
    maps = getattr(export, kind)  # (L, H, Q, K)
    L, H = maps.shape[:2]
    columns = st.columns([1, 1, 3])
    clearest = clearest_head(choices.model, choices.device)
    layer, head = views.layer_and_head(columns, kind, L, H, clearest, keys=("bw_layer", "bw_head"), keyboard=False)
    position = None
    if spec.uses_position:
        positions = list(range(len(pieces.tgt_tokens)))
        clamp_state("bw_position", positions)
        position = bound(
            columns[2].selectbox,
            "Explain the prediction at decoder position",
            positions,
            index=len(positions) - 1,  # the last: what the whole decoder input leads to
            format_func=lambda t: f"{t}: input {pieces.tgt_tokens[t]}, predicting the next token",
            key="bw_position",
        )
    asked = (choices.model, choices.device, choices.src, choices.tgt, method, position, words)
    try:
        result = computed("attribution", *asked)
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e)
        return kind, layer, head

    q_tokens, k_tokens = export.tokens(kind)  # the table's; the figures name decoder rows by what they write
    rows = views.row_labels(export, kind)
    mask = allowed(kind, len(q_tokens), len(k_tokens))
    values = getattr(result, kind)
    matrix = values[layer - 1, head - 1] if spec.per_head else values[layer - 1]
    left, right = picture.columns(2)
    stem = f"{choices.model.replace('/', '_')}-{kind}-L{layer}"
    shown = (choices.model, choices.device, choices.src, choices.tgt, words, kind, layer, head)  # what maps show
    with left:
        title = f"Weights, layer {layer}, head {head}"
        fig = views.one_head(("beyond", *shown), maps[layer - 1, head - 1], rows, k_tokens, kind, contrast, mask, title)
        st.plotly_chart(room(fig), width="stretch", config=export_config(f"{stem}H{head}-weights", "png"))
    with right:
        which = f"layer {layer}, head {head}" if spec.per_head else f"layer {layer}, all heads"
        fig = shared(
            "beyond-method",
            (*shown, method, position),
            lambda: contribution_heatmap(
                matrix,
                rows,
                k_tokens,
                kind,
                spec.value_name,
                title=f"{spec.title}, {which}",
                mask=mask,
                zmax=1.0 if spec.shares else None,
            ),
        )
        st.plotly_chart(room(fig), width="stretch", config=export_config(f"{stem}-{method}", "png"))
        if not spec.per_head:
            st.caption("This method gives one map per layer: the heads together, not the head chosen on the left.")
    if "position" in result.manifest:
        explained = (
            f"'{result.manifest['predicted_token']}' predicted at decoder position {result.manifest['position']}"
        )
        fig = shared(
            "beyond-relevance",
            (*shown[:5], method, position),
            lambda: relevance_bars(
                export.src_tokens,
                result.extras["source_relevance"],
                export.tgt_tokens,
                result.extras["target_relevance"],
                html.escape(explained, quote=False),
            ),
        )
        st.plotly_chart(room(fig), width="stretch")
    # The downloads' closures hold the keys (asked), not the arrays: Streamlit keeps a closed tab's
    # session (and its download callables) for a while, and the arrays come back from the cache on a click.

    def table():
        values = getattr(computed("attribution", *asked), kind)
        return values[:, None] if not spec.per_head else values

    cols = st.columns(2)
    cols[0].download_button(
        "CSV of what is shown",
        lambda: (
            analysis.long_form(table(), q_tokens, k_tokens, layers=[layer], heads=[head] if spec.per_head else None)
            .rename(columns={"weight": spec.value_name})
            .to_csv(index=False)
            .encode("utf-8")
        ),
        f"{stem}-{method}.csv",
        "text/csv",
        key="_bw_csv",
    )
    cols[1].download_button(
        f"NPZ of every {spec.title.lower()} array",
        lambda: computed("attribution", *asked).to_bytes(),
        f"{choices.model.replace('/', '_')}-{method}.npz",
        "application/octet-stream",
        help=f"The same file as `attnviz attribute --method {method}`: its arrays, ids, tokens and a manifest.",
        key="_bw_npz",
    )
    return kind, layer, head


def ablation_section(bundle, kinds: list[str], kind: str, layer: int, head: int, words: bool, contrast: str) -> None:
    st.header("Switch heads off")
    n_heads = bundle.config.n_heads
    options = whole_layers(bundle.config, kinds) + all_heads(bundle.config, kinds)
    if "bw_ablate" in st.session_state:  # heads of another model are dropped (a link's are checked by the widget)
        st.session_state["bw_ablate"] = [h for h in st.session_state["bw_ablate"] if h in options]
    left, right = st.columns([3, 2])
    chosen = bound(
        left.multiselect,
        "Heads to switch off",
        options,
        key="bw_ablate",
        format_func=lambda o: o if "." in o else f"{o} (the whole layer: its {n_heads} heads)",
        placeholder="a whole layer (cross:3), a head (cross:1.2), or click a cell of the importance grid below",
    )
    mode = bound(right.radio, "Replace their output by", list(MODES), format_func=MODE_NAMES.get, key="bw_ablate_mode")
    st.caption(
        f"**zero**: {MODES['zero']} (Michel et al., 2019). **mean**: {MODES['mean']}: the head keeps its average "
        "message and loses what depends on the token. The shared model is not modified: the heads are switched "
        "off for this computation only."
    )
    if not chosen:
        st.info("Choose heads to switch off, or click a cell of the importance grid below.")
        return
    heads = str(Ablation.parse(",".join(expand_layers(chosen, n_heads))))
    try:
        comparison = computed("ablation", choices.model, choices.device, choices.src, choices.tgt, heads, mode, words)
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e)
        return
    if comparison.intact_output is not None:
        a, b = st.columns(2)
        a.markdown(f"**Intact model:** {escape_markdown(comparison.intact_output) or '(nothing)'}")
        changed = comparison.ablated_output != comparison.intact_output
        n_off = len(Ablation.parse(heads).heads)
        b.markdown(
            f"**With {n_off} head{'s' if n_off > 1 else ''} off:** "
            f"{escape_markdown(comparison.ablated_output) or '(nothing)'} " + ("(changed)" if changed else "(the same)")
        )
        st.markdown(
            "**Step by step**, along the "
            + ("target sentence" if choices.tgt else "intact model's output")
            + ": the probability of each token in both models, and each model's most likely tokens."
        )
        st.dataframe(
            comparison.steps.style.format({"p intact": "{:.4f}", "p ablated": "{:.4f}", "change": "{:+.4f}"}),
            hide_index=True,
            width="stretch",
        )
    q_tokens, k_tokens = comparison.intact.tokens(kind)
    rows = views.row_labels(comparison.intact, kind)
    mask = allowed(kind, len(q_tokens), len(k_tokens))
    a, b = st.columns(2)
    for column, export, label in ((a, comparison.intact, "intact"), (b, comparison.ablated, "heads off")):
        matrix = getattr(export, kind)[layer - 1, head - 1]
        title = f"{TITLES[kind]}, layer {layer}, head {head}: {label}"
        shown = ("beyond-ablation", choices.model, choices.device, choices.src, choices.tgt, heads, mode, words)
        fig = views.one_head((*shown, kind, layer, head), matrix, rows, k_tokens, kind, contrast, mask, title)
        column.plotly_chart(room(fig), width="stretch")
    st.caption(
        "Both maps read the same decoder input, so rows line up; the layer and head are those chosen above. "
        "A head switched off still has weights: it is its output that is replaced."
    )


def importance_section(bundle, kinds: list[str]) -> None:
    st.header("Head importance")
    if bundle.config.encoder_only:
        st.info(
            "Head importance measures how much less likely the model's output becomes without a head; this model "
            "is encoder-only and writes no output."
        )
        return
    examples = bundle.info.get("examples") or [choices.src]
    if st.session_state.get("bw_imp_for") != choices.model:  # a new model: start from its own examples
        st.session_state["bw_imp_text"] = "\n".join(examples)
        st.session_state["bw_imp_for"] = choices.model
    text = st.text_area(
        "Sentences, one per line (optionally `source ||| reference`)",
        key="bw_imp_text",
        height=120,
        help=f"Up to {MAX_IMPORTANCE_SENTENCES}. Without references the model's own outputs are scored.",
    )
    cfg = bundle.config
    n_heads = (cfg.n_enc_layers + 2 * cfg.n_dec_layers) * cfg.n_heads
    if st.session_state.get("bw_imp_on_for") != choices.model:  # small models measure at once, large ones on request
        st.session_state["bw_imp_on"] = n_heads <= AUTO_IMPORTANCE_HEADS
        st.session_state["bw_imp_on_for"] = choices.model
    if not st.toggle(
        f"Measure all {n_heads} heads",
        key="bw_imp_on",
        help="Every head is switched off in turn, over every sentence: a few seconds for a small model, "
        "a minute or more for one of the paper's base size.",
    ):
        return
    try:
        sentences, references = sentence_pairs(text, MAX_IMPORTANCE_SENTENCES)
        importance = computed("importance", choices.model, choices.device, sentences, references)
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e)
        return
    scored = "the references" if references else "the model's own outputs"
    st.caption(
        f"For each head alone switched off (zeroed), the drop in the log-probability of {scored}, in nats per "
        f"token, over {importance.n_sentences} sentence{'s' if importance.n_sentences > 1 else ''} "
        f"({importance.n_tokens} tokens; intact model: {importance.intact_logprob:.3f} nats per token). Red: the "
        "output is less likely without the head. Heads that back each other up each look unimportant alone "
        "(Michel et al., 2019). **Click a cell** to switch that head off in the panel above."
    )
    chosen = st.session_state.get("bw_ablate", [])
    columns = st.columns(len(kinds))
    for column, kind in zip(columns, kinds, strict=True):
        selected = None
        if len(chosen) == 1 and chosen[0].startswith(kind + ":"):
            (_, layer, head) = next(iter(Ablation.parse(chosen[0]).heads))
            selected = (layer + 1, head + 1)
        fig = shared(
            "beyond-importance",
            (choices.model, choices.device, tuple(sentences), tuple(references or ()), kind, selected),
            lambda kind=kind, selected=selected: importance_grid(importance.scores[kind], kind, selected=selected),
        )
        column.plotly_chart(
            room(fig),
            key=f"_bw_imp_{kind}",
            on_select=lambda kind=kind: apply_importance_click(kind),
            selection_mode="points",
            width="stretch",
        )


def main() -> None:
    if choices is None:
        return
    picture = picture_area()  # the weights beside a method: under the title in presenter mode
    words_column, contrast_column = st.columns([1, 3])
    words, contrast = views.words_and_contrast(words_column, contrast_column)
    try:
        bundle = load_bundle(choices.model, choices.device)
        pieces = computed("attention", choices.model, choices.device, choices.src, choices.tgt, False)
        export = (
            computed("attention", choices.model, choices.device, choices.src, choices.tgt, True) if words else pieces
        )
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e)
        return
    truncation_notice(export)
    domain_notice(choices)
    kinds = [k for k in KINDS if getattr(export, k) is not None]
    kind, layer, head = method_section(picture, export, pieces, kinds, words, contrast)
    ablation_section(bundle, kinds, kind, layer, head, words, contrast)
    importance_section(bundle, kinds)


main()
footer()
