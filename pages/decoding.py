"""Decoding step-through: watch the decoder write its output one token at a time."""

import html
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from attnviz.app import bound, clamp_state, domain_notice, shared, viewport, views
from attnviz.app.follow import map_chart
from attnviz.app.frame import Context, frame
from attnviz.app.present import data_table, picture_area, room
from attnviz.app.widgets import escape_markdown
from attnviz.decoding import DecodeStep, Decoding
from attnviz.figures.attention import attention_heatmap
from attnviz.figures.common import export_config
from attnviz.figures.decoding import step_rows_grid, topk_bar
from attnviz.kinds import causal_mask, writing_labels

INTRO = (
    "At step t the decoder reads the start token and the t tokens it has written, attends to them "
    "(masked self-attention) and to the source (cross-attention), and picks the next token. "
    "Each row here is the query of the newest position. A language model reads its prompt in one pass, "
    "keeps the keys and values, and then writes one token per step, attending to the prompt and its own output."
)


def move(delta: int | None = None, to: int | None = None) -> None:
    """Button callbacks: change the step before the rerun draws the slider."""
    n = st.session_state.get("n_steps", 1)
    step = st.session_state.get("step", 1)
    st.session_state["step"] = max(1, min(n, to if to is not None else step + delta))


def tick() -> None:
    """The play timer (a fragment rerun every second): a full rerun once a second has passed."""
    if time.time() - st.session_state.get("last_tick", 0.0) >= 0.9:
        st.rerun(scope="app")


def play_step(n: int) -> None:
    """While playing, advance one step per second of wall time; stop at the last step.

    Runs before the step widgets exist, the only time their state may be changed.
    """
    if not st.session_state.get("playing") or time.time() - st.session_state.get("last_tick", 0.0) < 0.9:
        return
    st.session_state["last_tick"] = time.time()
    if st.session_state.get("step", 1) >= n:
        st.session_state["playing"] = False
    else:
        move(+1)


TO_COME = "#6b6b6b"  # the output's pieces after the step shown: 5.3:1 on white, readable from the back


def step_buttons(n: int) -> tuple:
    """(key, label, icon, keyboard shortcut, move's arguments) of the step buttons, for ``n`` steps."""
    return (
        ("_step_first", "First", ":material/first_page:", "Shift+Home", {"to": 1}),
        ("_step_prev", "Back", ":material/chevron_left:", "Shift+Left", {"delta": -1}),
        ("_step_next", "Next", ":material/chevron_right:", "Shift+Right", {"delta": +1}),
        ("_step_last", "Last", ":material/last_page:", "Shift+End", {"to": n}),
    )


def output_text(pieces: list[str], t: int) -> str:
    """The output as text (the word marker "▁" as a space), step ``t``'s piece highlighted; each piece on hover."""
    spans = []
    for i, piece in enumerate(pieces):
        # pieces still to come in grey, not faded: a projector shows faded text too faint to read
        style = "background:#ffd54f;padding:0 2px" if i == t else ("" if i < t else f"color:{TO_COME}")
        title = html.escape(f"step {i + 1}: piece {piece!r}")
        spans.append(f"<span title='{title}' style='{style}'>{html.escape(piece.replace('▁', ' '))}</span>")
    return "".join(spans)


@dataclass(frozen=True)
class Shown:
    """One step of one decoding and the head its figures show."""

    dec: Decoding
    tok: Any  # the model's tokenizer
    src_tokens: list[str]
    pieces: list[str]  # the output, one piece per step
    t: int  # the step, from 0
    layer: int
    head: int
    contrast: str
    key: tuple  # what this step's figures depend on: the decoding, then the step
    teacher: bool
    beam: int
    stem: str  # the figures' file names start with it: the model, the decoding and the step
    lm: bool = False  # a language model: src_tokens is its prompt, read in one pass before step 1

    @property
    def offset(self) -> int:
        """The position of step 1's query: the start token's (0), or a language model's prompt's last."""
        return len(self.src_tokens) - 1 if self.lm else 0

    @property
    def step(self) -> DecodeStep:
        return self.dec.steps[self.t]

    @property
    def dec_input(self) -> list[str]:
        """The start token (a language model: its prompt), then the decoder's own output."""
        first = self.src_tokens if self.lm else [self.tok.target_token(self.tok.bos_id)]
        return [*first, *self.pieces[:-1]]

    @property
    def rows(self) -> list[str]:
        """Step s's query reads dec_input[offset + s] and writes pieces[s]."""
        return writing_labels(self.dec_input[self.offset :], self.pieces)

    def keys(self, t: int) -> list[str]:
        """What step ``t``'s query may attend to: every position up to its own."""
        return self.dec_input[: self.offset + t + 1]


def body(ctx: Context) -> None:
    c1, c2 = st.columns([2, 1])
    teacher = bound(
        c2.toggle,
        "Teacher forcing",
        key="teacher",
        disabled=ctx.choices.tgt is None,
        help="Feed the target sentence from the sidebar instead of the model's own tokens.",
    )
    teacher = teacher and ctx.choices.tgt is not None
    beam = bound(c1.slider, "Beam size (1 = greedy)", 1, 8, key="beam", disabled=teacher)
    lm = ctx.bundle.config.decoder_only
    if ctx.bundle.config.encoder_only:
        st.info(
            "This model is encoder-only: it has no decoder, so there is nothing to decode step by step. "
            "The attention explorer shows its self-attention."
        )
        return
    job = (ctx.choices.src, 1 if teacher else beam, ctx.choices.tgt if teacher else None)  # the decoding's inputs
    domain_notice(ctx.choices if teacher else replace(ctx.choices, tgt=None))  # the target: only when it is fed
    dec = ctx.on_model("decoding", *job)
    if dec.truncated:
        st.warning(
            f"The output stopped at the length limit of {len(dec.steps)} tokens without an end token: it is unfinished."
        )
    tok = ctx.bundle.tokenizer
    src_tokens = tok.encode_source(ctx.choices.src).tokens
    n = len(dec.steps)
    st.session_state["n_steps"] = n
    clamp_state("step", range(1, n + 1))
    play_step(n)

    top = picture_area()  # the alignment and the candidates: under the title in presenter mode
    t = step_controls(n)
    pieces = [tok.target_token(s.token_id) for s in dec.steps]
    st.markdown(f"**Step {t + 1} of {n}.** Output: {output_text(pieces, t)}", unsafe_allow_html=True)

    L, H = dec.steps[t].self_attn.shape[:2]
    c1, c2, c3 = st.columns([1, 1, 2])
    contrast = views.contrast_choice(c3)
    kind = "decoder" if lm else "cross"
    layer, head = views.layer_and_head((c1, c2), kind, L, H, ctx.clearest_head(), keyboard=False)
    shown = Shown(
        dec=dec,
        tok=tok,
        src_tokens=src_tokens,
        pieces=pieces,
        t=t,
        layer=layer,
        head=head,
        contrast=contrast,
        key=(ctx.model, ctx.device, *job, t),
        teacher=teacher,
        beam=beam,
        stem=f"{ctx.file_stem}-" + ("teacher" if teacher else f"beam{beam}") + f"-step{t + 1}",
        lm=lm,
    )
    draw_figures(shown, top)


def draw_figures(s: Shown, top) -> None:
    """The alignment and the candidates in ``top``, then the step's rows and its every-head grid."""
    left, right = top.columns(2)
    with left:
        draw_alignment(s)
    with right:
        draw_candidates(s)
    left, right = st.columns(2)
    with left:
        draw_step_rows(s)
    with right:
        draw_step_grid(s)


def step_controls(n: int) -> int:
    """The step buttons, the play toggle and the step slider; the step shown, from 0."""
    # Each button as wide as its label and its key, wrapping onto a second line where they do not fit: in fixed
    # columns beside the slider, 1280 px wide with the sidebar open showed "E", "N" and "L" of the labels, and at
    # 1024 px none.
    buttons = st.container(horizontal=True)
    for key, label, icon, shortcut, kwargs in step_buttons(n):
        buttons.button(label, icon=icon, key=key, on_click=move, kwargs=kwargs, shortcut=shortcut, help=shortcut)
    buttons.toggle("Play", key="playing", help="advance one step a second")
    if n > 1:
        bound(st.slider, "Step", 1, n, key="step", label_visibility="collapsed")
    if st.session_state.get("playing"):
        st.fragment(tick, run_every=1.0)()  # the timer exists only while playing
    return st.session_state.get("step", 1) - 1


def draw_alignment(s: Shown) -> None:
    """Cross-attention of every step so far: the alignment, one row per step (a language model: its
    self-attention over the prompt and what it has written)."""
    dec, t, layer, head = s.dec, s.t, s.layer, s.head
    if s.lm:
        draw_lm_alignment(s)
        return
    narrow = viewport.narrow()  # a phone's layout
    fig = shared(
        "decoding-alignment",
        (*s.key, layer, head, s.contrast, narrow),
        lambda: attention_heatmap(
            np.stack([step.cross_attn[layer - 1, head - 1].numpy() for step in dec.steps[: t + 1]]),  # (t + 1, S)
            s.rows[: t + 1],
            s.src_tokens,
            "cross",
            title=f"Cross-attention so far (one row per step), layer {layer}, head {head}",
            contrast=s.contrast,
            narrow=narrow,
        ),
    )
    name = f"{s.stem}-cross-L{layer}H{head}-alignment"
    # a click on a cell points at it, for a room's followers
    map_chart(st, fig, "_dec_alignment_map", share=0.5, config=export_config(name, "png"))
    st.caption(
        'The alignment grows by one row per step: the row "a → b" is where the decoder looked while reading a '
        "and writing b."
    )


def draw_lm_alignment(s: Shown) -> None:
    """A language model's rows of every step so far, over the prompt and its output; grey: not yet written."""
    t, layer, head = s.t, s.layer, s.head
    keys = s.keys(t)
    narrow = viewport.narrow()  # a phone's layout

    def figure():
        rows = np.zeros((t + 1, len(keys)), dtype=np.float32)  # row i: step i's keys 0..offset + i
        for i, step in enumerate(s.dec.steps[: t + 1]):
            rows[i, : s.offset + i + 1] = step.self_attn[layer - 1, head - 1].numpy()
        return attention_heatmap(
            rows, s.rows[: t + 1], keys, "decoder", mask=causal_mask(t + 1, len(keys), s.offset),
            query_start=s.offset, contrast=s.contrast, narrow=narrow,
            title=f"Self-attention so far (one row per step), layer {layer}, head {head}",
        )  # fmt: skip

    fig = shared("decoding-lm-rows", (*s.key, layer, head, s.contrast, narrow), figure)
    name = f"{s.stem}-decoder-L{layer}H{head}-alignment"
    # a click on a cell points at it, for a room's followers
    map_chart(st, fig, "_dec_lm_map", share=0.5, config=export_config(name, "png"))
    st.caption(
        'One row per step: the row "a → b" is where the model looked while reading a and writing b, over the '
        "prompt and what it has written so far (the prompt was read in one pass, then one token per step)."
    )


def draw_candidates(s: Shown) -> None:
    """The step's top candidates, the token taken, and with beam search the beams before the step."""
    step, tok = s.step, s.tok
    labels = [tok.target_token(c.token_id) for c in step.top]
    chosen = tok.target_token(step.token_id)
    top = shared("decoding-top", s.key, lambda: topk_bar(labels, [c.prob for c in step.top], chosen=chosen))
    st.plotly_chart(room(top, 0.5), width="stretch", config=export_config(f"{s.stem}-candidates", "png"))
    if s.teacher:
        predicted = step.top[0]
        verdict = (
            ":material/check_circle: the same" if predicted.token_id == step.token_id else ":material/cancel: different"
        )
        st.markdown(
            f"Given token **{escape_markdown(chosen)}** (the model gives it p = {step.prob:.3f}); the model's own "
            f"prediction: **{escape_markdown(labels[0])}** (p = {predicted.prob:.3f}): {verdict}."
        )
    else:
        st.markdown(f"Chosen: **{escape_markdown(chosen)}** with p = {step.prob:.3f}.")
    if s.beam > 1 and not s.teacher:
        table = [
            {
                "beam": i + 1,
                "followed": "→" if i == step.followed else "",
                "output so far": tok.decode(bm.ids) or "(start)",
                "log-probability": round(bm.score, 4),
            }
            for i, bm in enumerate(step.beams)
        ]
        st.markdown("**Beams before this step** (the arrow marks the one the final output extends):")
        data_table(pd.DataFrame(table), hide_index=True, width="stretch")


def draw_step_rows(s: Shown) -> None:
    """The newest position's row of decoder self-attention, then of cross-attention."""
    step, t, layer, head = s.step, s.t, s.layer, s.head
    self_row = step.self_attn[layer - 1, head - 1].numpy()[None]  # (1, t + 1): only the prefix
    fig = shared(
        "decoding-self-row",
        (*s.key, layer, head, s.contrast),
        lambda: attention_heatmap(
            self_row,
            s.rows[t : t + 1],
            s.keys(t),
            "decoder",
            query_start=s.offset + t,
            title=f"Decoder self-attention of step {t + 1}, layer {layer}, head {head}",
            contrast=s.contrast,
        ),
    )
    name = f"{s.stem}-decoder-L{layer}H{head}-row"
    map_chart(st, fig, "_dec_self_row_map", share=0.5, config=export_config(name, "png"))
    if step.cross_attn is None:  # a language model has no source to look at
        return
    cross_row = step.cross_attn[layer - 1, head - 1].numpy()[None]
    fig = shared(
        "decoding-cross-row",
        (*s.key, layer, head, s.contrast),
        lambda: attention_heatmap(
            cross_row,
            s.rows[t : t + 1],
            s.src_tokens,
            "cross",
            query_start=t,
            title=f"Cross-attention of step {t + 1}, layer {layer}, head {head}",
            contrast=s.contrast,
        ),
    )
    name = f"{s.stem}-cross-L{layer}H{head}-row"
    map_chart(st, fig, "_dec_cross_row_map", share=0.5, config=export_config(name, "png"))


def draw_step_grid(s: Shown) -> None:
    """The newest position's cross-attention in every layer and head (a language model: its self-attention)."""
    step, t = s.step, s.t
    if s.lm:
        rows, keys, what, kind = step.self_attn.numpy(), s.keys(t), "Self-attention", "decoder"
    else:
        rows, keys, what, kind = step.cross_attn.numpy(), s.src_tokens, "Cross-attention", "cross"
    grid = shared(
        "decoding-grid",
        s.key,
        lambda: step_rows_grid(rows, keys, title=f"{what} of step {t + 1}, every layer and head", kind=kind),
    )
    st.plotly_chart(room(grid, 0.5), width="stretch", config=export_config(f"{s.stem}-{kind}-all-heads", "png"))


frame(body, intro=INTRO)
