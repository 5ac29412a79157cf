"""Decoding step-through: watch the decoder write its output one token at a time."""

import html
import time

import numpy as np
import pandas as pd
import streamlit as st

from attnviz.app import (
    bound,
    clamp_state,
    clearest_head,
    computed,
    footer,
    load_bundle,
    shared,
    show_error,
    sidebar,
    views,
)
from attnviz.app.present import intro, page_config, picture_area, room
from attnviz.app.widgets import escape_markdown
from attnviz.figures.attention import attention_heatmap
from attnviz.figures.decoding import step_rows_grid, topk_bar
from attnviz.kinds import writing_labels

page_config("decoding step by step")
choices = sidebar()
st.title("Decoding, step by step")
intro(
    "At step t the decoder reads the start token and the t tokens it has written, attends to them "
    "(masked self-attention) and to the source (cross-attention), and picks the next token. "
    "Each row here is the query of the newest position."
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
        style = "background:#ffd54f;padding:0 2px" if i == t else f"opacity:{1 if i < t else 0.35}"
        title = html.escape(f"step {i + 1}: piece {piece!r}")
        spans.append(f"<span title='{title}' style='{style}'>{html.escape(piece.replace('▁', ' '))}</span>")
    return "".join(spans)


def main() -> None:
    if choices is None:
        return
    c1, c2 = st.columns([2, 1])
    teacher = bound(
        c2.toggle,
        "Teacher forcing",
        key="teacher",
        disabled=choices.tgt is None,
        help="Feed the target sentence from the sidebar instead of the model's own tokens.",
    )
    teacher = teacher and choices.tgt is not None
    beam = bound(c1.slider, "Beam size (1 = greedy)", 1, 8, key="beam", disabled=teacher)
    if load_bundle(choices.model, choices.device).config.encoder_only:
        st.info(
            "This model is encoder-only: it has no decoder, so there is nothing to decode step by step. "
            "The attention explorer shows its self-attention."
        )
        return
    try:
        bundle = load_bundle(choices.model, choices.device)
        dec = computed(
            "decoding",
            choices.model,
            choices.device,
            choices.src,
            1 if teacher else beam,
            choices.tgt if teacher else None,
        )
    except Exception as e:  # noqa: BLE001 - the user sees a message, never a traceback
        show_error(e)
        return
    if dec.truncated:
        st.warning(
            f"The output stopped at the length limit of {len(dec.steps)} tokens without an end token: it is unfinished."
        )
    tok = bundle.tokenizer
    src_tokens = tok.encode_source(choices.src).tokens
    n = len(dec.steps)
    st.session_state["n_steps"] = n
    clamp_state("step", range(1, n + 1))
    play_step(n)

    top = picture_area()  # the alignment and the candidates: under the title in presenter mode
    b = st.columns([1.9, 1.7, 1.7, 1.9, 1.1, 2.7])
    for column, (key, label, icon, shortcut, kwargs) in zip(b, step_buttons(n), strict=False):
        column.button(
            label,
            icon=icon,
            key=key,
            on_click=move,
            kwargs=kwargs,
            shortcut=shortcut,
            help=shortcut,
        )
    b[4].toggle("Play", key="playing", help="advance one step a second")
    if n > 1:
        bound(b[5].slider, "Step", 1, n, key="step", label_visibility="collapsed")
    if st.session_state.get("playing"):
        st.fragment(tick, run_every=1.0)()  # the timer exists only while playing
    t = st.session_state.get("step", 1) - 1
    step = dec.steps[t]
    # What this step's figures depend on: the decoding, then the step.
    decoded = (choices.model, choices.device, choices.src, 1 if teacher else beam, choices.tgt if teacher else None, t)

    pieces = [tok.target_token(s.token_id) for s in dec.steps]
    dec_input = [tok.target_token(tok.bos_id), *pieces[:-1]]  # the start token, then its own output
    rows = writing_labels(dec_input, pieces)  # position i reads dec_input[i] and writes pieces[i]
    st.markdown(f"**Step {t + 1} of {n}.** Output: {output_text(pieces, t)}", unsafe_allow_html=True)

    L, H = step.cross_attn.shape[:2]
    c1, c2, c3 = st.columns([1, 1, 2])
    contrast = views.contrast_choice(c3)
    clearest = clearest_head(choices.model, choices.device)
    layer, head = views.layer_and_head((c1, c2), "cross", L, H, clearest, keyboard=False)

    left, right = top.columns(2)
    with left:
        fig = shared(
            "decoding-alignment",
            (*decoded, layer, head, contrast),
            lambda: attention_heatmap(
                np.stack([s.cross_attn[layer - 1, head - 1].numpy() for s in dec.steps[: t + 1]]),  # (t + 1, S)
                rows[: t + 1],
                src_tokens,
                "cross",
                title=f"Cross-attention so far (one row per step), layer {layer}, head {head}",
                contrast=contrast,
            ),
        )
        st.plotly_chart(room(fig), width="stretch")
        st.caption(
            'The alignment grows by one row per step: the row "a → b" is where the decoder looked while reading a '
            "and writing b."
        )
    with right:
        labels = [tok.target_token(c.token_id) for c in step.top]
        chosen = tok.target_token(step.token_id)
        top = shared("decoding-top", decoded, lambda: topk_bar(labels, [c.prob for c in step.top], chosen=chosen))
        st.plotly_chart(room(top), width="stretch")
        if teacher:
            predicted = step.top[0]
            verdict = (
                ":material/check_circle: the same"
                if predicted.token_id == step.token_id
                else ":material/cancel: different"
            )
            st.markdown(
                f"Given token **{escape_markdown(chosen)}** (the model gives it p = {step.prob:.3f}); the model's own "
                f"prediction: **{escape_markdown(labels[0])}** (p = {predicted.prob:.3f}): {verdict}."
            )
        else:
            st.markdown(f"Chosen: **{escape_markdown(chosen)}** with p = {step.prob:.3f}.")
        if beam > 1 and not teacher:
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
            st.dataframe(pd.DataFrame(table), hide_index=True, width="stretch")

    left, right = st.columns(2)
    with left:
        self_row = step.self_attn[layer - 1, head - 1].numpy()[None]  # (1, t + 1): only the prefix
        fig = shared(
            "decoding-self-row",
            (*decoded, layer, head, contrast),
            lambda: attention_heatmap(
                self_row,
                rows[t : t + 1],
                dec_input[: t + 1],
                "decoder",
                query_start=t,
                title=f"Decoder self-attention of step {t + 1}, layer {layer}, head {head}",
                contrast=contrast,
            ),
        )
        st.plotly_chart(room(fig), width="stretch")
        cross_row = step.cross_attn[layer - 1, head - 1].numpy()[None]
        fig = shared(
            "decoding-cross-row",
            (*decoded, layer, head, contrast),
            lambda: attention_heatmap(
                cross_row,
                rows[t : t + 1],
                src_tokens,
                "cross",
                query_start=t,
                title=f"Cross-attention of step {t + 1}, layer {layer}, head {head}",
                contrast=contrast,
            ),
        )
        st.plotly_chart(room(fig), width="stretch")
    with right:
        grid = shared(
            "decoding-grid",
            decoded,
            lambda: step_rows_grid(
                step.cross_attn.numpy(), src_tokens, title=f"Cross-attention of step {t + 1}, every layer and head"
            ),
        )
        st.plotly_chart(room(grid), width="stretch")


main()
footer()
