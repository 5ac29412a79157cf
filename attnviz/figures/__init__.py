"""Figures: plain data in (numpy arrays, token lists), a plotly figure out; never Streamlit.

One module per family of views: :mod:`~attnviz.figures.attention` (maps), :mod:`~attnviz.figures.decoding`,
:mod:`~attnviz.figures.walkthrough`, :mod:`~attnviz.figures.teaching` and :mod:`~attnviz.figures.positional`,
with what they share in :mod:`~attnviz.figures.common`.
"""
