"""Figures: plain data in (numpy arrays, token lists), a plotly figure out; never Streamlit.

One module per family of views: `attention` (maps), `decoding`,
`walkthrough`, `teaching` and `positional`,
with what they share in `common`.
"""
