"""Forward-pass walkthrough: one sentence through the whole model, one stage per step, real numbers."""

import streamlit as st

from attnviz.app import bound, clamp_state, computed, domain_notice, load_bundle, shared
from attnviz.app.follow import map_chart
from attnviz.app.frame import Context, frame
from attnviz.app.present import first, presenting, room
from attnviz.app.widgets import Download, download, escape_markdown
from attnviz.config import TransformerConfig
from attnviz.figures.common import export_config
from attnviz.figures.decoding import topk_bar
from attnviz.figures.walkthrough import feed_arrow, matrix_figure, table_figure
from attnviz.lessons import walkthrough as wk

INTRO = (
    "One sentence through the encoder, the decoder and the output layer, one stage at a time (a language model's "
    "prompt through its decoder). Every matrix is the loaded model's own intermediate tensor for this input, "
    "recorded during its forward pass."
)


def move(delta: int) -> None:
    """Previous / Next: change the stage before the rerun draws the stage list."""
    keys = st.session_state.get("wt_keys", [])
    if keys:
        i = keys.index(st.session_state.get("wt_stage", keys[0])) if st.session_state.get("wt_stage") in keys else 0
        st.session_state["wt_stage"] = keys[max(0, min(len(keys) - 1, i + delta))]


def stage_of(shown_stage: tuple) -> wk.Stage:
    """The stage for (model, device, src, tgt, stage, layer, head, step), kept with the cached results."""
    model, device, src, tgt, key, layer, head, step = shown_stage
    bundle = load_bundle(model, device)
    cfg = bundle.config

    def build() -> wk.Stage:
        out_w = bundle.model.tgt_embed.weight if cfg.tie_output else getattr(bundle.model, "out_proj", None)
        return wk.build_stage(
            computed("forward_pass", model, device, src, tgt),
            wk.ModelFacts.of(cfg),
            key,
            layer=layer - 1,
            head=head - 1,
            step=step - 1,
            embedding=bundle.model.src_embed.weight.detach().cpu().numpy() if key == "embedding" else None,
            output_weight=None if key != "output" or out_w is None else out_w.detach().cpu().numpy(),
            token_of=bundle.tokenizer.target_token if not cfg.encoder_only else None,
        )

    return shared("walkthrough-stage", shown_stage, build)


def show_matrix(m: wk.Matrix, k: int, i: int, shown_stage: tuple, name: str, csv_name: str) -> None:
    """The matrix ``m`` (its figure's file name ``name``) and its full tensor's CSV (``csv_name``.csv)."""
    fig = shared("walkthrough-matrix", (*shown_stage, k, i), lambda: matrix_figure(m, k))
    # a click on a cell of a map points at it, for a room's followers
    map_chart(st, fig, f"_wt_fig_{i}", config=export_config(name, "png"))
    shown = "" if m.style != "matrix" or m.values.shape[1] <= k else f"; the first {k} of {m.values.shape[1]} columns"
    # the recorded name counts layers from 0 (the code's index); say which layer that is in the app's count
    layer = f" ({m.recorded_layer}; the recorded name counts from 0)" if m.recorded_layer else ""
    st.caption(
        f"`{m.source}`{layer}: full tensor {m.shape_text}; shown: {m.row_axis} x {m.col_axis} = "
        f"{m.values.shape[0]} x {m.values.shape[1]}{shown}. Hover a cell for its value."
    )
    size = wk.tensor_csv_size(
        m.full.shape, m.full_axes, wk.matrix_labels(m, computed("forward_pass", *shown_stage[:4]))
    )

    def write(out) -> None:  # keys, not tensors: Streamlit keeps a closed tab's download callables for a while
        matrix, wt = stage_of(shown_stage).matrices[i], computed("forward_pass", *shown_stage[:4])
        wk.write_tensor_csv(out, matrix.full, matrix.full_axes, wk.matrix_labels(matrix, wt))

    download(
        st,
        f"CSV of the full {m.source}",
        Download(size, write),
        f"{csv_name}.csv",
        "text/csv",
        key=f"_wt_csv_{i}",
        on_click="ignore",
        help="Long form: one line per entry, an index column per axis (and the token), then the value.",
    )


def body(ctx: Context) -> None:
    bundle = ctx.bundle
    cfg = bundle.config
    wt = ctx.on_text("forward_pass")
    domain_notice(ctx.choices)  # the pass reads the source, and the target as the decoder input where one is given
    stages = wk.stage_list(cfg.encoder_only, cfg.decoder_only, cfg.pos_encoding == "rotary")
    keys, titles = [k for k, _ in stages], dict(stages)
    st.session_state["wt_keys"] = keys
    clamp_state("wt_stage", keys)
    if cfg.encoder_only:
        st.info(
            "This model is encoder-only (BERT-style): it has no decoder, so the walkthrough stops after the encoder."
        )
    key = stage_picker(keys, titles)
    layer, head, step, k = stage_controls(cfg, key, 1 if wt.tgt_ids is None else len(wt.tgt_ids))
    shown_stage = (*ctx.key, key, layer, head, step)
    # the figures' file names: the model, the stage, and the layer, head and step where the stage uses them
    stem = f"{ctx.file_stem}-{key}" + (f"-L{layer}" if key in wk.USES_LAYER else "")
    stem += (f"H{head}" if key in wk.USES_HEAD else "") + (f"-step{step}" if key in wk.USES_STEP else "")
    show_stage(stage_of(shown_stage), k, shown_stage, stem, ctx.file_stem)


def stage_picker(keys: list[str], titles: dict[str, str]) -> str:
    """Previous, Next and the list of stages: the stage shown."""
    # each button as wide as its label and its key, the list in the rest of the row (or the next, where it
    # does not fit): in fixed columns, 1280 px wide beside the sidebar cut "Previous" short
    row = st.container(horizontal=True, vertical_alignment="bottom")
    row.button(
        "Previous",
        icon=":material/chevron_left:",
        key="_wt_prev",
        on_click=move,
        args=(-1,),
        shortcut="Shift+Left",
        help="Shift+Left",
    )
    row.button(
        "Next",
        icon=":material/chevron_right:",
        key="_wt_next",
        on_click=move,
        args=(+1,),
        shortcut="Shift+Right",
        help="Shift+Right",
    )
    return bound(row.selectbox, "Stage", keys, format_func=titles.get, key="wt_stage", label_visibility="collapsed")


def stage_controls(cfg: TransformerConfig, key: str, T: int) -> tuple[int, int, int, int]:
    """(layer, head, output step, dimensions shown) for stage ``key`` of a model with ``cfg``, ``T`` output steps."""
    decoder_stage = key in wk.USES_STEP
    n_layers = cfg.n_dec_layers if decoder_stage or cfg.decoder_only else cfg.n_enc_layers
    clamp_state("wt_layer", range(1, n_layers + 1))
    clamp_state("wt_head", range(1, cfg.n_heads + 1))
    clamp_state("wt_step", range(1, T + 1))
    c = st.columns(4)
    layer = bound(
        c[0].selectbox,
        "Decoder layer" if decoder_stage else "Encoder layer",
        range(1, n_layers + 1),
        key="wt_layer",
        disabled=key not in wk.USES_LAYER,
    )
    head = bound(c[1].selectbox, "Head", range(1, cfg.n_heads + 1), key="wt_head", disabled=key not in wk.USES_HEAD)
    step = bound(
        c[2].selectbox,
        "Output step",
        range(1, T + 1),
        index=T - 1 if cfg.decoder_only else 0,  # a prompt's last position reads all of it: step 1 reads one token
        key="wt_step",
        disabled=key not in wk.USES_STEP,
        help="Step t: the decoder has read positions 0..t-1 and predicts the token after them.",
    )
    k = bound(c[3].number_input, "Dimensions shown (k)", 1, 4096, 16, key="wt_k", help="columns drawn; the CSV has all")
    return layer, head, step, k


def show_stage(stage: wk.Stage, k: int, shown_stage: tuple, stem: str, model: str) -> None:
    """The stage's title, text, notes, table, arrow, candidates, and its matrices two by two; ``stem`` starts
    the figures' file names, ``model`` (the model's file stem) the CSVs'."""
    st.subheader(stage.title)
    st.markdown(stage.text)
    for note in stage.notes:
        st.markdown(f"- {escape_markdown(note)}")
    if stage.table is not None:  # the stage's picture: first in presenter mode, its heading and text below
        if presenting():  # the room reads a figure's text at its size; a data frame's canvas stays at 14 px
            picture = room(shared("walkthrough-table", shown_stage, lambda: table_figure(stage.table, stage.title)))
            first("wt_table").plotly_chart(
                picture, width="stretch", key="wt_table", config=export_config(f"{stem}-table", "png")
            )
        else:
            st.dataframe(stage.table, hide_index=True, width="stretch")
    if stage.arrow is not None:
        st.plotly_chart(
            room(shared("walkthrough-arrow", shown_stage, lambda: feed_arrow(*stage.arrow))),
            width="stretch",
            key="wt_arrow",
            config=export_config(f"{stem}-arrow", "png"),
        )
    if stage.candidates:
        labels, probs = zip(*stage.candidates, strict=True)
        top = shared("walkthrough-top", shown_stage, lambda: topk_bar(list(labels), list(probs), chosen=stage.chosen))
        first("wt_top").plotly_chart(
            room(top), width="stretch", key="wt_top", config=export_config(f"{stem}-candidates", "png")
        )
        st.caption("Probabilities: the softmax of the model's logits at this step, computed for display.")
    cols = first("wt_matrices").columns(2)
    for i, m in enumerate(stage.matrices):
        with cols[i % 2]:
            show_matrix(m, int(k), i, shown_stage, f"{stem}-{m.file_name}", csv_name(m, model, shown_stage[-1]))


def csv_name(m: wk.Matrix, model: str, step: int) -> str:
    """A full tensor's CSV name: the model, then the tensor (its layer in its name); the output layer's rows of the
    top candidates (``…[top]``) are the candidates of one step, so their name says the step. The whole tensor
    does not depend on the head or step shown."""
    return f"{model}-{m.file_name}" + (f"-step{step}" if m.source.endswith("[top]") else "")


frame(body, intro=INTRO)
