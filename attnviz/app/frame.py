"""The frame every page is drawn in, and the context a page's body receives.

A page is a file in ``pages/`` (the home page is ``app.py``), one line in
`attnviz.app.registry`, and a body:

```python
from attnviz.app.frame import Context, frame

def body(ctx: Context) -> None:
    st.markdown(f"{ctx.bundle.name} reads {ctx.choices.src}")

frame(body)
```

`frame` does everything else, the same way on every page: the page's configuration (its
title and icon from the registry, presenter mode), the shared sidebar, the page's title and
introduction, one guard that turns any error into a clear message (never a traceback), and the
footer. It is a call each page file makes, not ``st.navigation`` over the registry: with the
design card's ``pages/`` folder, a server's first run after a restart, a deep link opened first
and AppTest all run a page file on its own, and a call at the top of that file runs in each of
them (see the facts on Streamlit's ``pages/`` folder in the architecture notes).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import streamlit as st

from attnviz.api import HeadChoice
from attnviz.app import follow, present, registry, viewport
from attnviz.app.cache import clearest_head, computed, is_long, load_bundle
from attnviz.app.links import footer
from attnviz.app.session import Choices, sidebar
from attnviz.app.widgets import guarded
from attnviz.startup import freeze_once
from attnviz.threads import share_the_cores


def file_safe(text: str) -> str:
    """``text`` fit for a file name: anything but letters, digits, '.', '_' and '-' becomes '_'."""
    return re.sub(r"[^\w.-]", "_", text, flags=re.ASCII)


@dataclass(frozen=True)
class Context:
    """What a page's body receives: the sidebar's choices, and the loaded model and its maps on demand.

    ``choices`` is None when the sidebar's choices cannot be used (no model, or one that failed to
    load: the sidebar has said why). Everything else is computed when first asked for, from the
    caches every session shares, so a page pays only for what it shows.
    """

    choices: Choices | None

    @property
    def ready(self) -> bool:
        """Whether there is a model and a sentence to show."""
        return self.choices is not None

    @property
    def key(self) -> tuple[str, str, str, str | None]:
        """(model, device, source, target): what every map of the sidebar's sentence depends on."""
        c = self._chosen()
        return c.model, c.device, c.src, c.tgt

    @property
    def model(self) -> str:
        """The model's key: a shipped model's name, or the path of a typed folder on the server. Never shown:
        a page names the model by `label`."""
        return self._chosen().model

    @property
    def label(self) -> str:
        """The model's name as the sidebar's caption gives it (its card's name, or its folder's): what a page
        shows, never the server's path to it."""
        return self.bundle.name

    @property
    def file_stem(self) -> str:
        """`label` fit for a file name (`file_safe`)."""
        return file_safe(self.label)

    @property
    def device(self) -> str:
        return self._chosen().device

    @property
    def bundle(self):
        """The loaded model (an [`attnviz.api.Bundle`][]), shared by every session: never change it."""
        return load_bundle(self.model, self.device)

    def export(self, words: bool = False):
        """The attention maps of the sidebar's sentence (an [`attnviz.export.AttentionExport`][]);
        ``export(...).tokens(kind)`` names the rows and columns of ``kind``'s maps."""
        return computed("attention", *self.key, words)

    def on_text(self, job: str, *args: Any) -> Any:
        """Job ``job`` (`attnviz.jobs.JOBS`) on the sidebar's sentence: ``job(model, src, tgt, *args)``."""
        return computed(job, *self.key, *args)

    def on_model(self, job: str, *args: Any) -> Any:
        """Job ``job`` on the loaded model with other inputs than the sidebar's sentence."""
        return computed(job, self.model, self.device, *args)

    @property
    def long(self) -> bool:
        """Whether the sidebar's text is too long for every map at once: the explorer shows it tile by tile."""
        return is_long(*self.key)

    def layer_tiles(self, kind: str, layer: int):
        """One layer of a long text's maps ([`attnviz.tiles.LayerTiles`][]): each head's queries and keys,
        normalisers, statistics and thumbnail, from which any region of any head is computed."""
        return computed("tiled_layer", *self.key, kind, layer)

    def clearest_head(self) -> HeadChoice:
        """(kind, layer, head) of the head pickers open on: the model's clearest, or the one its card names."""
        return clearest_head(self.model, self.device)

    def _chosen(self) -> Choices:
        if self.choices is None:
            raise RuntimeError("this page part needs a model: check Context.ready first")
        return self.choices


def page_of(body: Callable) -> registry.Page:
    """The registry's entry for the file that defines ``body``."""
    parts = Path(inspect.getsourcefile(body) or "").resolve().parts
    for page in registry.PAGES:
        own = Path(page.path).parts
        if parts[-len(own) :] == own:
            return page
    raise LookupError(f"{'/'.join(parts[-2:])} is not in attnviz.app.registry.PAGES: add its line there")


def _intro_for(intro: Callable[[Context], str], choices) -> str:
    """A callable introduction's text; none without a usable model (the body then says what is wrong)."""
    if choices is None:
        return ""
    try:
        return intro(Context(choices))
    except Exception:  # noqa: BLE001 - a model that fails to load is the body's message, shown in its guard
        return ""


def frame(
    body: Callable[[Context], None],
    intro: str | Callable[[Context], str] = "",
    prose: bool = False,
    needs_model: bool = True,
) -> None:
    """Draw one page: configuration, sidebar, title, ``intro``, ``body(context)`` in the guard, footer.

    ``intro`` is shown under the title except in presenter mode (`attnviz.app.present.intro`),
    as a paragraph with ``prose``, else as a caption. A callable ``intro`` is given the page's
    context, so that the text can speak of the model in front of it (it is called only when the
    sidebar's choices are usable). With ``needs_model`` (the default) the body
    runs only when the sidebar's choices are usable; otherwise it runs always and checks
    `Context.ready` where it needs the model.
    """
    page = page_of(body)
    share_the_cores()  # one thread for torch and numpy: the server shares the cores with its workers (attnviz.threads)
    freeze_once()  # the first page's imports out of the garbage collector's passes (attnviz.startup)
    present.page_config(page.title if page.url_path else "", page.favicon)
    follow.start(page.url_path)  # before the sidebar: a follower's link is read before any widget
    choices = sidebar()
    with st.sidebar:
        follow.presenter_panel()
    follow.follower_bar()
    st.title(page.heading or page.title)
    viewport.picture_slot()  # on a phone the page's picture comes first, before the introduction
    if callable(intro):
        intro = _intro_for(intro, choices)
    if intro:
        present.intro(intro, prose=prose)
    if choices is not None or not needs_model:
        guarded(lambda: body(Context(choices)))
    footer()
    follow.publish_view()  # after every widget has written its value into the address bar
    follow.drawn()  # a follower's applied view, drawn to the end
    follow.keep_room()
    viewport.watch(present.presenting())
