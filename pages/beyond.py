"""Beyond the weights: contribution methods beside the weights, heads switched off, and head importance."""

import html
from dataclasses import dataclass

import streamlit as st

from attnviz import analysis
from attnviz.app import bound, clamp_state, domain_notice, sentence_pairs, shared, truncation_notice, views
from attnviz.app.frame import Context, frame
from attnviz.app.present import data_table, picture_area, room
from attnviz.app.widgets import Download, download, escape_markdown, export_download, guarded
from attnviz.export import AttentionExport
from attnviz.figures.common import export_config
from attnviz.figures.contributions import contribution_heatmap, importance_grid, relevance_bars
from attnviz.kinds import KINDS, TITLES, allowed
from attnviz.methods import METHODS
from attnviz.methods.ablation import MODES, Ablation, all_heads, expand_layers, whole_layers

INTRO = (
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


@dataclass(frozen=True)
class Asked:
    """What the method section shows, as keys only: a method at a decoder position, and one kind, layer and
    head (from 1) of the maps over pieces or words. It holds no arrays: the downloads' closures hold it, and
    Streamlit keeps a closed tab's session (and its download callables) for a while; the arrays come back
    from the cache on a click."""

    ctx: Context
    method: str
    position: int | None
    words: bool
    kind: str
    layer: int
    head: int

    @property
    def spec(self):
        return METHODS[self.method]

    def result(self):
        """The method's maps (an [`AttentionExport`][attnviz.export.AttentionExport]), from the cache or computed."""
        return self.ctx.on_text("attribution", self.method, self.position, self.words)

    @property
    def shown(self) -> tuple:
        """What the maps show: the figures' cache key."""
        return (*self.ctx.key, self.words, self.kind, self.layer, self.head)

    @property
    def stem(self) -> str:
        return f"{self.ctx.file_stem}-{self.kind}" + ("-words" if self.words else "") + f"-L{self.layer}"

    @property
    def explained(self) -> str:
        """'-position3' where the method explains one decoder position, else nothing."""
        return f"-position{self.position}" if self.position is not None else ""

    @property
    def npz_name(self) -> str:
        """The method's NPZ: every map of it, so no kind, layer or head; over words or pieces, and the position
        it explains, change every array in it."""
        return f"{self.ctx.file_stem}" + ("-words" if self.words else "") + f"-{self.method}{self.explained}"

    @property
    def view_name(self) -> str:
        """The method's files (CSV, figure): the head where the method has one map per head, the position it
        explains where it explains one; a method per layer covers every head at once."""
        head = f"H{self.head}" if self.spec.per_head else ""
        return f"{self.stem}{head}-{self.method}{self.explained}"


def method_controls(
    ctx: Context, export: AttentionExport, pieces: AttentionExport, kinds: list[str], words: bool
) -> Asked:
    """The method section's heading and controls: the method, the kind, layer and head, and the position.

    ``export`` holds the maps as shown (over words with ``words``), ``pieces`` over pieces: a
    prediction is explained at a decoder piece, as the model writes them.
    """
    st.header("The weights beside a contribution method")
    methods = [name for name, m in METHODS.items() if not (m.needs_decoder and export.tgt_ids is None)]
    clamp_state("bw_method", methods)
    captions = [METHODS[m].title for m in methods]  # the options are the CLI's names, as a link writes them
    method = bound(st.radio, "Method", methods, captions=captions, key="bw_method", horizontal=True)
    spec = METHODS[method]
    st.info(f"**{spec.title}.** {spec.explanation}\n\n*{spec.paper}.*")

    kind = views.kind_choice(kinds, "bw_kind")
    L, H = getattr(export, kind).shape[:2]  # (L, H, Q, K)
    columns = st.columns([1, 1, 3])
    clearest = ctx.clearest_head()
    layer, head = views.layer_and_head(columns, kind, L, H, clearest, keys=("bw_layer", "bw_head"), keyboard=False)
    position = None
    if spec.uses_position:
        positions = list(range(len(pieces.tgt_tokens)))
        clamp_state("bw_position", positions)
        # the tokens, not `pieces`: a bound widget's format_func stays in the session (its maps would too)
        tgt_tokens = pieces.tgt_tokens
        position = bound(
            columns[2].selectbox,
            "Explain the prediction at decoder position",
            positions,
            index=len(positions) - 1,  # the last: what the whole decoder input leads to
            format_func=lambda t: f"{t}: input {tgt_tokens[t]}, predicting the next token",
            key="bw_position",
        )
    return Asked(ctx, method, position, words, kind, layer, head)


def method_section(picture, asked: Asked, export: AttentionExport, contrast: str) -> None:
    """The weights and the method's map side by side (in ``picture``, see
    `picture_area`), the relevance of a prediction, and the downloads."""
    result = asked.result()
    spec, kind, layer, head, method = asked.spec, asked.kind, asked.layer, asked.head, asked.method
    q_tokens, k_tokens = export.tokens(kind)  # the table's; the figures name decoder rows by what they write
    rows = views.row_labels(export, kind)
    mask = allowed(kind, len(q_tokens), len(k_tokens))
    values = getattr(result, kind)
    matrix = values[layer - 1, head - 1] if spec.per_head else values[layer - 1]
    left, right = picture.columns(2)
    with left:
        title = f"Weights, layer {layer}, head {head}"
        weights = getattr(export, kind)[layer - 1, head - 1]
        fig = views.one_head(("beyond", *asked.shown), weights, rows, k_tokens, kind, contrast, mask, title)
        st.plotly_chart(room(fig, 0.5), width="stretch", config=export_config(f"{asked.stem}H{head}-weights", "png"))
    with right:
        which = f"layer {layer}, head {head}" if spec.per_head else f"layer {layer}, all heads"
        fig = shared(
            "beyond-method",
            (*asked.shown, method, asked.position),
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
        st.plotly_chart(room(fig, 0.5), width="stretch", config=export_config(asked.view_name, "png"))
        if not spec.per_head:
            st.caption("This method gives one map per layer: the heads together, not the head chosen on the left.")
    if "position" in result.manifest:
        relevance(asked, export, result)
    method_downloads(asked, values.shape, q_tokens, k_tokens, result)


def relevance(asked: Asked, export: AttentionExport, result) -> None:
    """How much each source and target token matters for the prediction the method explains."""
    explained = f"'{result.manifest['predicted_token']}' predicted at decoder position {result.manifest['position']}"
    fig = shared(
        "beyond-relevance",
        (*asked.ctx.key, asked.words, asked.method, asked.position),
        lambda: relevance_bars(
            export.src_tokens,  # None for a language model, as its source_relevance
            result.extras.get("source_relevance"),
            export.tgt_tokens,
            result.extras["target_relevance"],
            html.escape(explained, quote=False),
        ),
    )
    st.plotly_chart(room(fig), width="stretch", config=export_config(f"{asked.npz_name}-relevance", "png"))


def method_downloads(asked: Asked, shape: tuple[int, ...], q_tokens, k_tokens, result: AttentionExport) -> None:
    """The CSV of the map shown and the NPZ of every map of the method, both bounded and built on a click.

    ``shape`` is that of the method's ``kind`` array ((L, H, Q, K), or (L, Q, K) for a method per layer),
    ``result`` the method's maps in this run: the closures hold `Asked` (keys), never them.
    """
    spec, layer, method = asked.spec, asked.layer, asked.method
    heads = [asked.head] if spec.per_head else None
    shape = shape if spec.per_head else (shape[0], 1, *shape[1:])
    names = None if spec.per_head else ([layer], ["all"])  # one map per layer: its "head" is every head at once
    size = analysis.long_form_csv_size(shape, q_tokens, k_tokens, [layer], heads, spec.value_name, names)

    def write(out) -> None:
        values = getattr(asked.result(), asked.kind)
        values = values if spec.per_head else values[:, None]
        tokens = (asked.ctx.export(True) if asked.words else asked.ctx.export(False)).tokens(asked.kind)
        analysis.long_form_csv(out, values, *tokens, [layer], heads, spec.value_name, names)

    cols = st.columns(2)
    download(
        cols[0], "CSV of what is shown", Download(size, write), f"{asked.view_name}.csv", "text/csv", key="_bw_csv"
    )
    download(
        cols[1],
        f"NPZ of every {spec.title.lower()} array",
        export_download(asked.result, result),
        f"{asked.npz_name}.npz",
        "application/octet-stream",
        hint=f"`attnviz attribute --method {method} --out` writes it from the command line.",
        help=f"The same file as `attnviz attribute --method {method}`: its arrays, ids, tokens and a manifest.",
        key="_bw_npz",
    )


def ablation_hint(cfg, kinds: list[str]) -> str:
    """The empty ablation box's hint: a whole layer and a head of a kind this model has (cross if it has it)."""
    kind = "cross" if "cross" in kinds else kinds[-1]
    heads = all_heads(cfg, [kind])
    return (
        f"a whole layer ({whole_layers(cfg, [kind])[-1]}), a head ({heads[min(1, len(heads) - 1)]}), "
        "or click a cell of the importance grid below"
    )


def ablation_controls(bundle, kinds: list[str]) -> tuple[list[str], str]:
    """The ablation panel's heading and controls: (the heads and layers to switch off, the replacement)."""
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
        placeholder=ablation_hint(bundle.config, kinds),
    )
    mode = bound(right.radio, "Replace their output by", list(MODES), format_func=MODE_NAMES.get, key="bw_ablate_mode")
    st.caption(
        f"**zero**: {MODES['zero']} (Michel et al., 2019). **mean**: {MODES['mean']}: the head keeps its average "
        "message and loses what depends on the token. The shared model is not modified: the heads are switched "
        "off for this computation only."
    )
    return chosen, mode


def ablation_section(bundle, kinds: list[str], asked: Asked, contrast: str) -> None:
    """The model with heads switched off beside the intact one: outputs, each step, and the head chosen above."""
    chosen, mode = ablation_controls(bundle, kinds)
    if not chosen:
        st.info("Choose heads to switch off, or click a cell of the importance grid below.")
        return
    ctx, kind, layer, head = asked.ctx, asked.kind, asked.layer, asked.head
    heads = str(Ablation.parse(",".join(expand_layers(chosen, bundle.config.n_heads))))
    comparison = ctx.on_text("ablation", heads, mode, asked.words)
    if comparison.intact_output is not None:
        ablation_outputs(ctx, comparison, heads)
    q_tokens, k_tokens = comparison.intact.tokens(kind)
    rows = views.row_labels(comparison.intact, kind)
    mask = allowed(kind, len(q_tokens), len(k_tokens))
    a, b = st.columns(2)
    for column, export, label in ((a, comparison.intact, "intact"), (b, comparison.ablated, "heads off")):
        matrix = getattr(export, kind)[layer - 1, head - 1]
        title = f"{TITLES[kind]}, layer {layer}, head {head}: {label}"
        shown = ("beyond-ablation", *ctx.key, heads, mode, asked.words)
        fig = views.one_head((*shown, kind, layer, head), matrix, rows, k_tokens, kind, contrast, mask, title)
        off = "intact" if label == "intact" else f"{mode}-off-" + heads.replace(":", "-L").replace(".", "H")
        name = f"{asked.stem}H{head}-{off}"
        column.plotly_chart(room(fig, 0.5), width="stretch", config=export_config(name, "png"))
    st.caption(
        "Both maps read the same decoder input, so rows line up; the layer and head are those chosen above. "
        "A head switched off still has weights: it is its output that is replaced."
    )


def ablation_outputs(ctx: Context, comparison, heads: str) -> None:
    """Both models' outputs, and each step's probabilities in both."""
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
        + ("target sentence" if ctx.choices.tgt else "intact model's output")
        + ": the probability of each token in both models, and each model's most likely tokens."
    )
    data_table(
        comparison.steps.style.format({"p intact": "{:.4f}", "p ablated": "{:.4f}", "change": "{:+.4f}"}),
        hide_index=True,
        width="stretch",
    )


def importance_controls(ctx: Context, bundle) -> str | None:
    """The sentences to measure over and the toggle that measures: the sentences' text, None until measured.

    Both are in the link (and a room's view) where they differ from the model's own: its examples, and
    measuring at once for a small model. A newly chosen model starts from its own; a page opened from a
    link takes the link's (Streamlit seeds a widget from the address bar over the value set here).
    """
    examples = "\n".join(bundle.info.get("examples") or [ctx.choices.src])
    if st.session_state.get("bw_imp_for") != ctx.model:  # a new model: start from its own examples
        st.session_state["bw_imp_text"] = examples
        st.session_state["bw_imp_for"] = ctx.model
    text = bound(
        st.text_area,
        "Sentences, one per line (optionally `source ||| reference`)",
        value=examples,
        key="bw_imp_text",
        height=120,
        help=f"Up to {MAX_IMPORTANCE_SENTENCES}. Without references the model's own outputs are scored.",
    )
    cfg = bundle.config
    n_heads = (cfg.n_enc_layers + 2 * cfg.n_dec_layers) * cfg.n_heads
    at_once = n_heads <= AUTO_IMPORTANCE_HEADS  # small models measure at once, large ones on request
    if st.session_state.get("bw_imp_on_for") != ctx.model:
        st.session_state["bw_imp_on"] = at_once
        st.session_state["bw_imp_on_for"] = ctx.model
    measure = bound(
        st.toggle,
        f"Measure all {n_heads} heads",
        value=at_once,
        key="bw_imp_on",
        help="Every head is switched off in turn, over every sentence: a few seconds for a small model, "
        "a minute or more for one of the paper's base size.",
    )
    return text if measure else None


def importance_section(ctx: Context, bundle, kinds: list[str]) -> None:
    """Every head's importance, one grid per kind; a click on a cell switches that head off above."""
    st.header("Head importance")
    if bundle.config.encoder_only:
        st.info(
            "Head importance measures how much less likely the model's output becomes without a head; this model "
            "is encoder-only and writes no output."
        )
        return
    text = importance_controls(ctx, bundle)
    if text is None:
        return
    sentences, references = sentence_pairs(text, MAX_IMPORTANCE_SENTENCES)
    importance = ctx.on_model("importance", sentences, references)
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
        if len(chosen) == 1 and chosen[0].startswith(kind + ":") and "." in chosen[0]:  # one head, not a layer
            (_, layer, head) = next(iter(Ablation.parse(chosen[0]).heads))
            selected = (layer + 1, head + 1)
        fig = shared(
            "beyond-importance",
            (ctx.model, ctx.device, tuple(sentences), tuple(references or ()), kind, selected),
            lambda kind=kind, selected=selected: importance_grid(importance.scores[kind], kind, selected=selected),
        )
        column.plotly_chart(
            room(fig, 1 / len(kinds)),
            key=f"_bw_imp_{kind}",
            on_select=lambda kind=kind: apply_importance_click(kind),
            selection_mode="points",
            width="stretch",
            config=export_config(f"{ctx.file_stem}-{kind}-importance-{len(sentences)}-sentences", "png"),
        )


def body(ctx: Context) -> None:
    """A method beside the weights, heads switched off, and every head's importance."""
    picture = picture_area()  # the weights beside a method: under the title in presenter mode
    words_column, contrast_column = st.columns([1, 3])
    words, contrast = views.words_and_contrast(words_column, contrast_column)
    bundle = ctx.bundle
    pieces = ctx.export(False)
    export = ctx.export(True) if words else pieces
    truncation_notice(export)
    domain_notice(ctx.choices)
    kinds = [k for k in KINDS if getattr(export, k) is not None]
    asked = method_controls(ctx, export, pieces, kinds, words)
    # A failing method or ablation leaves the sections below it standing.
    guarded(lambda: method_section(picture, asked, export, contrast))
    guarded(lambda: ablation_section(bundle, kinds, asked, contrast))
    importance_section(ctx, bundle, kinds)


frame(body, intro=INTRO)
