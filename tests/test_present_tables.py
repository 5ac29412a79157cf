"""Tables in presenter mode: plain tables whose text the room's styles size, with outside text shown as typed."""

from __future__ import annotations

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow  # a Streamlit script run per test


def _script(present: bool, styled: bool) -> None:
    import pandas as pd
    import streamlit as st

    from attnviz.app.present import PRESENT, data_table

    st.session_state[PRESENT] = present
    frame = pd.DataFrame({"piece": ["</s>", "[log in](https://evil.example)", "2. Juli"], "p": [0.5, 0.25, 0.125]})
    data_table(frame.style.format({"p": "{:.2f}"}) if styled else frame, hide_index=True)


def _run(present: bool, styled: bool) -> AppTest:
    at = AppTest.from_function(_script, args=(present, styled), default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    return at


@pytest.mark.parametrize("styled", [False, True], ids=["frame", "styler"])
def test_presenter_mode_draws_a_table_whose_outside_text_is_inert_markdown(styled):
    from attnviz.app.text import escape_markdown

    at = _run(present=True, styled=styled)
    assert not at.dataframe, "a data grid draws its text at 14 px on a canvas: not for a room"
    (table,) = at.table
    sent = table.proto.arrow_data  # as sent to the browser: a Styler's text is in its display values
    cells = pa.ipc.open_stream(sent.styler.display_values if styled else sent.data).read_all().to_pandas()
    pieces = list(cells["piece"])
    assert pieces == [escape_markdown(t) for t in ("</s>", "[log in](https://evil.example)", "2. Juli")]
    assert pieces[1] != "[log in](https://evil.example)", "a link in a token stays text"
    if styled:
        assert list(cells["p"]) == ["0.50", "0.25", "0.12"], "the Styler's own formats are kept"


def test_outside_presenter_mode_the_table_stays_a_data_frame():
    at = _run(present=False, styled=False)
    assert at.dataframe and not at.table
