"""How attention forms: a model's heads across its training, replayed from the history recorded while it trained."""

import time

import streamlit as st

from attnviz import api, training
from attnviz.app import bound, clamp_state, links, live_training, shared, views
from attnviz.app.cache import model_history
from attnviz.app.frame import Context, file_safe, frame
from attnviz.app.present import picture_area, room
from attnviz.app.widgets import escape_markdown
from attnviz.figures.common import export_config
from attnviz.figures.formation import loss_curves, phase_change_figure, statistic_lines
from attnviz.figures.images import head_grid
from attnviz.kinds import TITLES, allowed
from attnviz.lessons import formation

INTRO = (
    "While attnviz trained this model it recorded, every few hundred steps, the losses, every head's statistics "
    "and the full maps of a few fixed probe texts. Step through them, or press Play, and watch the heads form: the "
    "anti-diagonal of the reverse model, the cross-attention of a translation model learning to align, and in a "
    "language model a previous-token head, then an induction head as the loss suddenly drops."
)

STEP = "step"  # the link's parameter (formation?model=reverse&step=1200), shared with the decoding page's step
PLAYING, LAST_TICK = "formation_playing", "_formation_last_tick"
STATISTIC, HEAD, PROBE = "formation_statistic", "formation_head", "formation_probe"
STEPS = "_formation_steps"  # this run's recorded steps, for the buttons' callbacks
LINES_CHART, GRID_CHART = "_formation_lines", "_formation_grid"
TICK_S = 1.0  # Play shows each record this long: time to see what changed before the next


def move(delta: int | None = None, to: int | None = None) -> None:
    """Button callbacks: the record ``delta`` records on, or record ``to`` (-1: the last), before the rerun."""
    steps = st.session_state.get(STEPS) or [0]
    at = formation.nearest_record(steps, st.session_state.get(STEP, steps[0]))
    index = (to % len(steps)) if to is not None else min(max(at + delta, 0), len(steps) - 1)
    st.session_state[STEP] = steps[index]


def start_playing() -> None:
    """Play's callback: Play from the last record starts again from the first."""
    steps = st.session_state.get(STEPS) or [0]
    if st.session_state.get(PLAYING) and st.session_state.get(STEP) == steps[-1]:
        st.session_state[STEP] = steps[0]
    st.session_state[LAST_TICK] = time.time()


def tick() -> None:
    """The play timer (a fragment rerun every `TICK_S`): a full rerun once the record has been shown long enough."""
    if time.time() - st.session_state.get(LAST_TICK, 0.0) >= 0.9 * TICK_S:
        st.rerun(scope="app")


def play_step(steps: list[int]) -> None:
    """While playing, advance one record per `TICK_S` of wall time; stop at the last record.

    Runs before the step widgets exist, the only time their state may be changed.
    """
    if not st.session_state.get(PLAYING) or time.time() - st.session_state.get(LAST_TICK, 0.0) < 0.9 * TICK_S:
        return
    st.session_state[LAST_TICK] = time.time()
    if st.session_state.get(STEP) == steps[-1]:
        st.session_state[PLAYING] = False
    else:
        move(+1)


def step_controls(steps: list[int]) -> int:
    """The step buttons (Shift+Home, Shift+Left, Shift+Right, Shift+End), Play and the step slider; the step shown."""
    buttons = st.container(horizontal=True)  # each button as wide as its label: none is cut on a projector
    for key, label, icon, shortcut, kwargs in (
        ("_formation_first", "First", ":material/first_page:", "Shift+Home", {"to": 0}),
        ("_formation_back", "Back", ":material/chevron_left:", "Shift+Left", {"delta": -1}),
        ("_formation_next", "Next", ":material/chevron_right:", "Shift+Right", {"delta": +1}),
        ("_formation_last", "Last", ":material/last_page:", "Shift+End", {"to": -1}),
    ):
        buttons.button(label, icon=icon, key=key, on_click=move, kwargs=kwargs, shortcut=shortcut, help=shortcut)
    buttons.toggle("Play", key=PLAYING, on_change=start_playing, help=f"one record every {TICK_S:g} s, to the last")
    if len(steps) > 1:
        bound(st.select_slider, "Training step", steps, key=STEP, help="the recorded steps; Shift+arrows step")
    if st.session_state.get(PLAYING):
        st.fragment(tick, run_every=TICK_S)()  # the timer exists only while playing
    return st.session_state.get(STEP, steps[0])


def pick_head(chart: str, site: str | None = None) -> None:
    """A click on a head's line (or, with ``site``, on a head of the grid) picks that head (before the rerun)."""
    event = st.session_state.get(chart)
    points = event.selection.points if event is not None else []
    data = points[0].get("customdata") if points else None
    if not data:
        return
    if site is None:
        head = data if isinstance(data, str) else data[0]
    else:
        head = formation.head_id(site, *(int(v) for v in data[:2]))
    if head in (st.session_state.get("_formation_heads") or ()):
        st.session_state[HEAD] = head


def body(ctx: Context) -> None:
    replay(ctx)
    live_training.section()  # "Train a small model now" (attnviz.app.live_training): with or without a history


def replay(ctx: Context) -> None:
    """The chosen model's recorded history, step by step; one line when it has none."""
    history = model_history(ctx.bundle.path)
    if history is None:
        st.info(
            f"{escape_markdown(ctx.bundle.name)} has no training history, so there is nothing to replay: the shipped "
            "reverse, en-de and induction models have one, and `attnviz train TASK --out DIR --history-every N` "
            "records one for a model you train.",
            icon=":material/history_toggle_off:",
        )
        return
    mismatch = formation.history_mismatch(history.kind, history.heads, ctx.bundle.config)
    if mismatch:
        st.error(
            f"{escape_markdown(ctx.bundle.name)}'s folder holds another model's training history: {mismatch}. "
            "Nothing of it is drawn; `attnviz train` writes a history beside the model it trains.",
            icon=":material/history_toggle_off:",
        )
        return
    steps = [int(s) for s in history.step]
    st.session_state[STEPS] = steps
    links.nearest_from_link(STEP, steps)
    if STEP in st.session_state and st.session_state[STEP] not in steps:  # another page's step, or an older history
        wanted = st.session_state[STEP]
        st.session_state[STEP] = steps[formation.nearest_record(steps, wanted if isinstance(wanted, int) else 0)]
    play_step(steps)

    top = picture_area()  # the maps: under the title in presenter mode, first on a phone
    step = step_controls(steps)
    record = steps.index(step)
    version = (str(history.folder), len(steps), steps[-1])  # what every figure of this history depends on

    statistics = formation.statistics_of(history.heads)  # those with a value recorded
    every_head = formation.every_head(history.heads)
    st.session_state["_formation_heads"] = every_head
    c1, c2, c3 = st.columns([1, 1, 2])
    opening = statistic = None
    if statistics:
        opening = formation.opening_statistic(history.heads, history.kind, history.task)
        statistic = bound(c1.selectbox, "Statistic", statistics, index=statistics.index(opening), key=STATISTIC)
    named = api.named_heads(ctx.bundle).get("induction")  # the head the card names
    default_head = formation.opening_head(history.heads, opening, None if named is None else ("decoder", *named))
    clamp_state(HEAD, every_head)
    head = bound(
        c2.selectbox,
        "Head",
        every_head,
        index=every_head.index(default_head),
        key=HEAD,
        format_func=lambda i: formation.head_name(*formation.parse_head(i)),
        help="or click a head's line in the chart of the statistic",
    )
    site, layer, head_number = formation.parse_head(head)
    probes = list(range(len(history.probes)))
    clamp_state(PROBE, probes)
    probe_index = bound(
        c3.selectbox,
        "Probe text",
        probes,
        key=PROBE,
        format_func=lambda p: history.probes[p].text,
        help="the fixed texts whose maps were recorded at every step",
    )
    contrast = views.contrast_choice(st)
    probe = history.probes[probe_index]
    rows, columns = formation.probe_labels(probe.src_tokens, probe.tgt_tokens, site)
    maps_now = formation.probe_maps(probe.maps, site, record)
    maps_final = formation.probe_maps(probe.maps, site, len(steps) - 1)
    mask = allowed(site, *maps_now.shape[-2:])

    # the figures' file names: the model, the head and probe where one is shown, and the step
    probe_stem = f"{ctx.file_stem}-probe{probe_index + 1}-{site}"
    top.markdown(f"**Step {step}** (record {record + 1} of {len(steps)}), probe: {escape_markdown(probe.text)}")
    left, right = top.columns(2)
    for column, maps, when, at in ((left, maps_now, f"step {step}", record), (right, maps_final, "final", -1)):
        # the short name: two maps side by side, each title on one line in half of a 1280-pixel screen
        title = f"{formation.head_name(site, layer, head_number, short=True)}, {when}"
        key = (*version, "formation", probe_index, site, layer, head_number, steps[at])
        matrix = maps[layer - 1, head_number - 1]
        name = f"{probe_stem}-L{layer}H{head_number}-" + ("final" if at == -1 else f"step{step}")
        column.plotly_chart(
            room(views.one_head(key, matrix, rows, columns, site, contrast, mask, title), 0.5),
            width="stretch",
            config=export_config(name, "png"),
        )
    st.caption(
        f"Left: the head at step {step}; right: the same head at the last record (step {steps[-1]}), on the same "
        "colour scale. Rows are queries, columns keys"
        + (" (target rows by source columns)." if site == "cross" else ".")
    )

    drop = training.loss_drop(history) if history.kind == "language model" else None
    left, right = st.columns(2)
    loss = shared(
        "formation-loss",
        (*version, step, drop),
        lambda: loss_curves(steps, history.train_loss, history.heldout_loss, step, drop),
    )
    left.plotly_chart(room(loss, 0.5), width="stretch", config=export_config(f"{ctx.file_stem}-loss-step{step}", "png"))
    unmeasured = formation.unmeasured(history.heads)
    if statistic is None:
        right.info(
            "The history's heads table records no value of any statistic, so there is no chart of them: the maps "
            "and the losses are what it holds.",
            icon=":material/query_stats:",
        )
    else:
        lines = formation.head_lines(history.heads, statistic, steps)
        figure = shared(
            "formation-lines",
            (*version, statistic, step, head),
            lambda: statistic_lines(steps, lines.values, lines.heads, lines.ids, statistic, step, head),
        )
        right.plotly_chart(
            room(figure, 0.5),
            width="stretch",
            key=LINES_CHART,
            on_select=lambda: pick_head(LINES_CHART),
            selection_mode="points",
            config=export_config(f"{ctx.file_stem}-{head}-{file_safe(statistic)}-step{step}", "png"),
        )
        right.caption("One line per head; click a line to pick its head.")
    if unmeasured:
        right.caption(f"Not offered, with no value recorded at any step: {escape_markdown(', '.join(unmeasured))}.")

    grid = shared(
        "formation-grid",
        (*version, probe_index, site, step, contrast, layer, head_number),
        lambda: head_grid(
            formation.probe_maps(probe.maps, site, record), rows, columns, site, contrast, mask, (layer, head_number)
        ),
    )
    st.plotly_chart(
        room(grid),
        width="stretch",
        key=GRID_CHART,
        on_select=lambda: pick_head(GRID_CHART, site),
        selection_mode="points",
        config=export_config(f"{probe_stem}-all-heads-step{step}", "png"),
    )
    st.caption(f"Every {TITLES[site].lower()} head at step {step}; click one to pick it.")

    if history.kind == "language model" and {formation.PREVIOUS, formation.INDUCTION} <= set(statistics):
        named = api.named_heads(ctx.bundle)
        change = formation.phase_change(
            steps,
            history.train_loss,
            history.heldout_loss,
            history.heads,
            drop,
            named.get("previous-token"),
            named.get("induction"),
        )
        fig = shared(
            "formation-phase",
            (*version, step),
            lambda: phase_change_figure(
                change.steps,
                change.loss,
                change.previous,
                change.induction,
                change.drop,
                change.previous_head,
                change.induction_head,
                change.loss_name,
                step,
            ),
        )
        name = f"{ctx.file_stem}-phase-change-step{step}"
        st.plotly_chart(room(fig), width="stretch", config=export_config(name, "png"))
        st.caption(
            "Olsson et al. (2022): an induction head forms at the loss's sudden drop, after a previous-token head "
            "that it builds on. Both scores are measured on the recorded probe set at every record."
        )


frame(body, intro=INTRO)
