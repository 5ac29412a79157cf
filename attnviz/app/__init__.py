"""The app's helpers: the only part of attnviz that imports Streamlit.

Pages import from here: the sidebar and its choices (`session`), the cached
computations (`cache`), shared widgets (`widgets`), the weight
views several pages draw (`views`) and the list of pages (`registry`).
"""

from attnviz.app import links, registry, views
from attnviz.app.cache import (
    clearest_head,
    computed,
    computed_atlas,
    load_bundle,
    open_atlas,
    shared,
)
from attnviz.app.links import bound, footer, lazy_tabs
from attnviz.app.registry import Page
from attnviz.app.session import CUSTOM_PATH, Choices, keep_state, sidebar
from attnviz.app.widgets import (
    clamp_state,
    domain_notice,
    download_buttons,
    keep_in_range,
    number_table,
    sentence_pairs,
    show_error,
    sinusoid_inputs,
    truncation_notice,
)

__all__ = [
    "CUSTOM_PATH",
    "Choices",
    "Page",
    "bound",
    "clamp_state",
    "clearest_head",
    "computed",
    "computed_atlas",
    "domain_notice",
    "download_buttons",
    "footer",
    "keep_in_range",
    "keep_state",
    "lazy_tabs",
    "links",
    "number_table",
    "load_bundle",
    "open_atlas",
    "registry",
    "sentence_pairs",
    "shared",
    "show_error",
    "sidebar",
    "sinusoid_inputs",
    "truncation_notice",
    "views",
]
