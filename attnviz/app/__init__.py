"""The app's helpers: the only part of attnviz that imports Streamlit.

Pages import from here: the sidebar and its choices (`session`), the cached
computations (`cache`), shared widgets (`widgets`), the weight
views several pages draw (`views`) and the list of pages (`registry`).

The names are imported on first use, not with the package, as `attnviz`'s are: a module of the
package that needs none of them, such as ``python -m attnviz.app.visit`` (the first visit that
``deploy/serve.sh`` pays each replica), then does not import torch and pandas for nothing: a visit
takes 0.5-0.7 CPU s, where importing them made it 2.6-3.1 (a 2-core AMD EPYC with AVX-512).
"""

from __future__ import annotations

import importlib

# Each name and the module of this package that defines it.
WHERE = {
    "links": None,  # None: the name is a module of this package
    "registry": None,
    "views": None,
    **dict.fromkeys(["clearest_head", "computed", "computed_atlas", "load_bundle", "open_atlas", "shared"], "cache"),
    **dict.fromkeys(["bound", "footer", "lazy_tabs"], "links"),
    "Page": "registry",
    **dict.fromkeys(["CUSTOM_PATH", "Choices", "keep_state", "sidebar"], "session"),
    **dict.fromkeys(
        [
            "clamp_state",
            "domain_notice",
            "download_buttons",
            "keep_in_range",
            "number_table",
            "sentence_pairs",
            "show_error",
            "sinusoid_inputs",
            "truncation_notice",
        ],
        "widgets",
    ),
}

__all__ = sorted(WHERE)


def __getattr__(name: str):
    if name not in WHERE:
        raise AttributeError(f"module 'attnviz.app' has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{WHERE[name] or name}")
    value = module if WHERE[name] is None else getattr(module, name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value
