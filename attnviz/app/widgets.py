"""Widgets and messages the pages share; plain helpers, no state of their own."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import pandas as pd
import streamlit as st

from attnviz.app.guard import guarded, show_error  # noqa: F401 - pages and tests import them from here
from attnviz.app.links import bound
from attnviz.app.text import escape_markdown
from attnviz.errors import InputError
from attnviz.export import AttentionExport, max_export_bytes
from attnviz.lessons import positional as pe


def number_table(table: pd.DataFrame, fmt: str = "{:.4f}", columns=None) -> pd.DataFrame:
    """``table`` with its numeric ``columns`` (default: the float ones) as text in ``fmt``, for st.table.

    What a pandas Styler's format would show, at a fraction of its cost on every rerun.
    """
    columns = list(table.select_dtypes("float").columns) if columns is None else list(columns)
    return table.assign(**{str(c): table[c].map(fmt.format) for c in columns})


def truncation_notice(export: AttentionExport) -> None:
    """Say so when the decoder input is the model's output cut at the length limit (unfinished)."""
    if export.manifest.get("tgt_truncated"):
        st.warning(
            f"The model's output stopped at the length limit of {export.manifest['max_output_tokens']} tokens "
            "without an end token: it is unfinished, and so are the maps of the decoder."
        )


def domain_notice(choices, side: str | None = None) -> None:
    """Say so when the sentence looks outside what the model was trained on (``choices.out_of_domain``);
    ``side`` names whose sentence it is where a page shows two ("Side B: ...")."""
    if choices.out_of_domain:
        said = choices.out_of_domain if side is None else f"Side {side}: {choices.out_of_domain}"
        st.warning(escape_markdown(said), icon=":material/travel_explore:")


def clamp_state(key: str, options) -> None:
    """Reset a widget's stored value when it is no longer an option (e.g. a model with fewer layers)."""
    options = list(options)
    if key in st.session_state and st.session_state[key] not in options:
        st.session_state[key] = options[0]


def keep_in_range(key: str, default: int, low: int, high: int) -> None:
    """Keep a slider's value, moved into [low, high], when its range changes.

    Streamlit gives a slider whose bounds changed a fresh state (its minimum); setting the value
    through session_state before the slider is drawn carries it over.
    """
    st.session_state[key] = min(max(st.session_state.get(key, default), low), high)


SINUSOID_D_MODELS = [16, 32, 64, 128, 256, 512, 1024]
LAYOUT_NAMES = {"interleaved": "interleaved (paper)", "concat": "concatenated (sin | cos)"}


def sinusoid_inputs(columns, prefix: str, base_help: str, layout_help: str | None = None) -> tuple[int, float, str]:
    """The d_model, base and layout widgets of the two positional-encoding pages, in three containers.

    Keys are ``{prefix}_d_model``, ``{prefix}_base`` and ``{prefix}_layout``.
    """
    d_col, base_col, layout_col = columns
    d_model = bound(
        d_col.selectbox, "d_model", SINUSOID_D_MODELS, index=SINUSOID_D_MODELS.index(128), key=f"{prefix}_d_model"
    )
    base = bound(
        base_col.number_input,
        "Base",
        min_value=1.0,
        max_value=1e9,
        value=pe.PAPER_BASE,
        step=1000.0,
        format="%g",
        key=f"{prefix}_base",
        help=base_help,
    )
    layout = bound(
        layout_col.radio, "Layout", pe.LAYOUTS, format_func=LAYOUT_NAMES.get, key=f"{prefix}_layout", help=layout_help
    )
    return d_model, float(base), layout


@dataclass(frozen=True)
class Download:
    """A file a download button builds on a click: ``write(out)`` writes it to the binary file ``out``,
    and ``size`` is the most bytes it can take, known before anything is built.

    Streamlit keeps a button's callable with the session, and a closed tab's session for a while in
    case it reconnects (up to 128 of them, 120 s): ``write`` must hold keys (strings, numbers), not
    arrays, and get the arrays from the cache when called. Closures holding each tab's 1000-token
    maps kept about 30 MB per closed tab alive, beyond ATTNVIZ_CACHE_MB.
    """

    size: int
    write: Callable[[BinaryIO], object]


def _built(write: Callable[[BinaryIO], object]) -> bytes:
    """The file ``write`` makes, through a temporary file on disk: the process holds it once, as the
    bytes Streamlit serves, never twice (a buffer and its copy)."""
    with tempfile.TemporaryFile() as out:
        write(out)
        out.seek(0)
        return out.read()


def megabytes(n_bytes: float) -> str:
    """'1,116 MB', '2.5 MB', '0.01 MB': a size for a message, never rounded to 0."""
    mb = n_bytes / 2**20
    return f"{mb:,.0f} MB" if mb >= 10 else f"{mb:.2g} MB"


def download(column, label: str, file: Download, file_name: str, mime: str, hint: str = "", **kwargs) -> None:
    """A download button in ``column`` that builds ``file`` on a click; instead, when the file could
    take more than an export may hold (ATTNVIZ_MAX_EXPORT_MB, as for `attnviz attention`), a line
    that says so, then ``hint`` (what to do instead), and nothing is built."""
    limit = max_export_bytes()
    if file.size > limit:
        column.info(
            f"**{label}**: this file could take {megabytes(file.size)}, more than a download may hold on this "
            f"server ({megabytes(limit)}, ATTNVIZ_MAX_EXPORT_MB). {hint}".rstrip(),
            icon=":material/block:",
        )
        return
    write = file.write
    column.download_button(label, lambda: _built(write), file_name, mime, **kwargs)


def export_download(make_export: Callable[[], AttentionExport], shown: AttentionExport) -> Download:
    """The .npz of the export that ``make_export()`` gives from the cache, ``shown`` in this run: its size
    is that of ``shown``'s arrays (compressed, the file is no larger, but for the zip's headers)."""
    size = sum(a.nbytes for a in shown.arrays().values()) + 2**20
    return Download(size, lambda out: make_export().write(out))


LONG_FORM = "Long form: layer, head, query index and token, key index and token, value."


def download_buttons(
    table: Download,
    npz: Download | None,
    image_format: str | None,
    name: str,
    npz_name: str = "attention",
    holds: str = LONG_FORM,
) -> None:
    """CSV of the matrix shown (``name``.csv), NPZ of every tensor (``npz_name``.npz), and the image format of the
    figure's camera button. ``holds`` is the CSV button's help: what the file's columns are.

    The files are built only when a button is clicked, each bounded (`download`): a long form of
    every head of a 500-token sentence has millions of rows, too many to build on every rerun.
    """
    cols = st.columns(3)
    download(
        cols[0],
        "CSV of what is shown",
        table,
        f"{name}.csv",
        "text/csv",
        hint="One head (the view One head) or a shorter text makes a smaller file.",
        help=holds,
    )
    if npz is not None:
        download(
            cols[1],
            "NPZ of every map",
            npz,
            f"{npz_name}.npz",
            "application/octet-stream",
            hint="`attnviz attention --out` writes it from the command line, where its user sets the bound.",
            help="The same file as `attnviz attention`: encoder, decoder, cross, ids, tokens and a manifest.",
        )
    if image_format is not None:
        cols[2].radio(
            "Figure download (camera icon on the figure)",
            ["png", "svg"],
            key="image_format",
            horizontal=True,
        )


def sentence_pairs(text: str, limit: int) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """Sentences typed one per line, each optionally followed by ``|||`` and its reference translation.

    Returns (sources, references or None). References must be given for every line or for none;
    blank lines are skipped; more than ``limit`` lines is an InputError, as is no line at all.
    """
    from attnviz.atlas.corpus import text_lines  # here: the atlas package imports torch, which widgets does not

    lines = text_lines(text)  # as `attnviz atlas` splits a file
    if not lines:
        raise InputError("type at least one sentence, one per line")
    if len(lines) > limit:
        raise InputError(f"{len(lines)} sentences: at most {limit}, so that every head can be switched off in time")
    parts = [tuple(p.strip() for p in line.split("|||", 1)) for line in lines]
    with_reference = [len(p) == 2 and bool(p[1]) for p in parts]
    if any(with_reference) and not all(with_reference):
        raise InputError("give a reference after ||| on every line, or on none (then the model's own output is used)")
    sources = tuple(p[0] for p in parts)
    if not all(sources):
        raise InputError("a line starts with |||: write the source sentence before it")
    return sources, (tuple(p[1] for p in parts) if all(with_reference) else None)
