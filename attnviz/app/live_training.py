"""The section "Train a small model now" of the page "How attention forms": a live training, drawn as it runs.

The run itself is `attnviz.app.live_runs`; this module draws it. While it runs, a fragment redraws
every `REDRAW_S` seconds (and so tells the run that its visitor is still there): the losses, every
head's characteristic statistic (the reverse model's anti-diagonal share, the language model's
induction score) and the clearest head's map on a probe text at the latest record. Another
visitor who arrives while every slot is taken is told so and watches the same run. A finished run
is shown once more, whole, with its history as an NPZ to download (the arrays of ``attnviz history
--out F.npz``).
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from attnviz.app import bound, live_runs, shared
from attnviz.app.live_runs import LIVE_RECIPES, LiveRun, LiveSettings, SlotTaken
from attnviz.app.present import room
from attnviz.app.views import one_head
from attnviz.app.widgets import Download, download
from attnviz.figures.common import export_config
from attnviz.figures.formation import loss_curves, statistic_lines
from attnviz.kinds import allowed
from attnviz.lessons import formation
from attnviz.training import History
from attnviz.training.formation import best_head

RUN = "live_run"  # this session's run: its id only (a closed tab's session outlives it by minutes)
TASK = "live_task"  # in the link too: formation?live_task=induction
REDRAW_S = 2.0  # seconds between redraws while a run is shown; each one is the visitor's heartbeat
STATISTIC = {"reverse": "anti_diagonal", "induction": "induction"}  # what forms, per task
SITE = {"reverse": "cross", "induction": "decoder"}  # where it forms
TASKS = {
    "reverse": "reverse (letters backwards: the cross-attention's anti-diagonal)",
    "induction": "induction (a language model: an induction head)",
}


def recipe_text(task: str) -> str:
    """The live recipe of ``task`` as one line."""
    r = LIVE_RECIPES[task]
    return (
        f"{r['n_layers']} layers of {r['n_heads']} heads, d_model {r['d_model']}, d_ff {r['d_ff']}, batches of "
        f"{r['batch_size']}, warmup {r['warmup']} steps, a record every {live_runs.HISTORY_EVERY[task]} steps"
    )


def section() -> None:
    """Draw the section: the button, this visitor's run (or the class's), and its result with its download."""
    st.subheader("Train a small model now")
    settings = LiveSettings.from_environment()
    if settings.trainings < 1:
        st.info("Live training is turned off on this server (ATTNVIZ_LIVE_TRAININGS=0).", icon=":material/block:")
        return
    st.caption(
        f"A model trained from scratch on this server while you watch, for {settings.cpu_seconds:g} CPU seconds "
        "(a few minutes of the clock, more when the server is busy), then it stops and keeps what it learned. It is "
        "never saved as a model: close the tab and it stops. One at a time on this server."
    )
    mine = live_runs.slots().find(st.session_state.get(RUN) or "")
    if mine is None or mine.finished:
        # the button's column wide enough for its label 1024 px wide beside the sidebar ([2, 1] cut it short)
        left, right = st.columns([3, 2], vertical_alignment="bottom")
        task = bound(left.radio, "Task", list(TASKS), key=TASK, format_func=TASKS.get, horizontal=True)
        left.caption(f"Recipe: {recipe_text(task)}.")
        if right.button("Train a small model now", key="_live_start", icon=":material/model_training:", type="primary"):
            try:
                mine = live_runs.start(task, settings, connected=tab_connected())
                st.session_state[RUN] = mine.id
            except SlotTaken as e:
                st.warning(str(e), icon=":material/hourglass_top:")
    if mine is not None and not mine.finished:
        st.fragment(lambda: live_view(mine.id, owner=True), run_every=REDRAW_S)()
        return
    running = live_runs.slots().running()
    if running:
        st.fragment(lambda: live_view(running[0].id, owner=False), run_every=REDRAW_S)()
    if mine is not None:
        finished_view(mine)


def tab_connected():
    """A callable that tells whether this session's tab is still connected to the server; None outside a server."""
    from streamlit.runtime import Runtime
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    if ctx is None or not Runtime.exists():
        return None
    runtime, session = Runtime.instance(), ctx.session_id
    return lambda: runtime.is_active_session(session)


def live_view(run_id: str, owner: bool) -> None:
    """A running run, redrawn every `REDRAW_S` (the fragment); the owner's redraw is its heartbeat."""
    run = live_runs.slots().find(run_id)
    if run is None or run.finished:
        st.rerun(scope="app")  # it ended: the whole section is drawn again, without the timer
    if owner:
        run.beat()
    history = run.snapshot()
    who = "Your model" if owner else "A class model (started by another visitor)"
    if history is None:
        st.info(
            f"{who} ({run.task}) is starting: it waits for the server's other long computations, if any, then "
            "generates its data; its first record comes a few seconds later.",
            icon=":material/hourglass_top:",
        )
    else:
        st.markdown(
            f"**{who}** ({run.task}) is training: step {int(history.step[-1])}, {len(history.step)} records; it "
            f"stops after {run.settings.cpu_seconds:g} CPU seconds."
        )
        draw(run, history)
    if owner and st.button("Stop it now", key="_live_stop", icon=":material/stop_circle:"):
        run.stop()


def finished_view(run: LiveRun) -> None:
    """The finished run: why it stopped, its last figures and its history to download."""
    if run.state == live_runs.LEFT:
        st.warning(
            "Your live training was stopped: this page stopped showing it (the tab was closed or went to another "
            "page), and a live training runs only while someone watches.",
            icon=":material/warning:",
        )
        return
    if run.result is None:
        if run.message:
            st.warning(run.message, icon=":material/warning:")
        return
    history = run.result
    spent = f" after {run.cpu_seconds:.0f} CPU seconds" if run.cpu_seconds is not None else ""
    why = {"cpu": f"its CPU time was spent{spent}", "steps": f"its recipe's last step came{spent}"}
    st.success(
        f"Your model ({run.task}) trained to step {int(history.step[-1])}: it stopped because "
        f"{why.get(run.stopped_by, 'it was stopped')}. It is kept in this server's memory for a while, never saved.",
        icon=":material/check_circle:",
    )
    if run.message:
        st.caption(run.message)
    draw(run, history)
    size = sum(a.nbytes for a in history.arrays().values()) + 2**20
    download(
        st,
        "NPZ of the training's history",
        Download(size, lambda out: np.savez_compressed(out, **history.arrays())),
        f"live-{run.task}-history.npz",
        "application/octet-stream",
        hint="`attnviz train TASK --history-every N` records a history on your own machine.",
        help="The arrays of `attnviz history --out F.npz`: step, the losses, each probe's tokens and maps, a manifest.",
    )


def draw(run: LiveRun, history: History) -> None:
    """The losses, every head's statistic and the clearest head's map at the latest record; shared by watchers."""
    steps = [int(s) for s in history.step]
    version = (run.id, len(steps))  # a record more: new figures; the same: every watcher gets the same ones
    statistic, site = STATISTIC[run.task], SITE[run.task]
    layer, head = best_head(history.heads, statistic, site)
    chosen = formation.head_id(site, layer, head)
    lines = formation.head_lines(history.heads, statistic, steps)
    # the figures' file names, as the history's NPZ: the task, then the figure and the step it shows
    stem, at = f"live-{run.task}", f"step{steps[-1]}"
    left, right = st.columns(2)
    left.plotly_chart(
        room(
            shared(
                "live-loss", version, lambda: loss_curves(steps, history.train_loss, history.heldout_loss, steps[-1])
            ),
            0.5,
        ),
        width="stretch",
        key=f"_live_loss_{run.id}",
        config=export_config(f"{stem}-loss-{at}", "png"),
    )
    right.plotly_chart(
        room(
            shared(
                "live-lines",
                version,
                lambda: statistic_lines(steps, lines.values, lines.heads, lines.ids, statistic, steps[-1], chosen),
            ),
            0.5,
        ),
        width="stretch",
        key=f"_live_lines_{run.id}",
        config=export_config(f"{stem}-{statistic}-{at}", "png"),
    )
    probe = history.probes[0]
    rows, columns = formation.probe_labels(probe.src_tokens, probe.tgt_tokens, site)
    matrix = formation.probe_maps(probe.maps, site, len(steps) - 1)[layer - 1, head - 1]
    title = f"{formation.head_name(site, layer, head)}, step {steps[-1]}"
    mask = allowed(site, *matrix.shape)
    st.plotly_chart(
        room(one_head(("live", *version), matrix, rows, columns, site, "linear", mask, title)),
        width="stretch",
        key=f"_live_map_{run.id}",
        config=export_config(f"{stem}-{site}-L{layer}H{head}-{at}", "png"),
    )
    value = history.heads[
        (history.heads["step"] == steps[-1])
        & (history.heads["kind"] == site)
        & (history.heads["layer"] == layer)
        & (history.heads["head"] == head)
    ][statistic].iloc[0]
    st.caption(
        f"The head with the highest {statistic.replace('_', '-')} score now, {formation.head_name(site, layer, head)} "
        f"({value:.2f}), on the probe {probe.text!r}. Rows are queries, columns keys."
    )
