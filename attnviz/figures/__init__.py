"""Figures: plain data in (numpy arrays, token lists), a plotly figure out; never Streamlit.

One module per family of views: `attention` (maps), `decoding`,
`walkthrough`, `teaching` and `positional`,
with what they share in `common`.

Each figure is made in one call, ``go.Figure(data=traces, layout=layout)``, its layout written whole
as a dict: plotly's ``update_layout``, ``update_xaxes``, ``add_shape``, ``add_vline`` and the like
check every key path anew and lay the figure out again on each call, and took most of a figure's
time (an attention heatmap 10 ms so, 2 ms in one call; 2-core AMD EPYC, Zen 4). A grid of subplots is
made so too and handed to ``make_subplots(figure=...)``, which adds its domains and subplot titles.
"""
