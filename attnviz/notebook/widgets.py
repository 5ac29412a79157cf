"""The notebook views as anywidgets: thin hosts that send `attnviz.notebook.frames` to the browser.

Each view is an ``anywidget.AnyWidget`` whose JavaScript and CSS ship in this package
(``static/views.js``, ``static/views.css``: plain ES modules, no imports, no CDN). What the reader
chooses in the browser (kind, layer, head, contrast, words, a dragged box) comes back as traits;
Python answers with the next frame: palette indices and weights as binary buffers
(``traitlets.Bytes``), never JSON lists.

Where a notebook cannot load a widget manager offline (VS Code and Colab fetch anywidget's own
front end from a CDN), a view renders as one self-contained HTML document instead
(`attnviz.notebook.standalone`): ``mode="html"``, or ``mode="auto"`` there. Every view also
carries a static picture in its output (``text/html`` and ``image/png``), which nbconvert and a
notebook reopened without its widget state show.
"""

from __future__ import annotations

import base64
import os
import sys
import uuid
from pathlib import Path

import anywidget
import traitlets

from attnviz.errors import AttnvizError, InputError, describe
from attnviz.figures.images import CONTRASTS
from attnviz.notebook import standalone
from attnviz.notebook.data import Source
from attnviz.notebook.frames import HeadFrames, atlas_data, grid_frame, palette_bytes

STATIC = Path(__file__).parent / "static"
MODES = ("auto", "widget", "html")
STILL_ABOVE = "<small>attnviz: the view needs its widget; its still picture is above.</small>"


def offline_widgets_fail() -> bool:
    """Whether this kernel runs under a front end that loads anywidget's front end from a CDN (Colab, VS Code)."""
    return "google.colab" in sys.modules or any(name.startswith("VSCODE_") for name in os.environ)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    if mode == "auto":
        return "html" if offline_widgets_fail() else "widget"
    return mode


def sent_value(value: object) -> str:
    """A value from the front end as a message shows it (`describe`), a short list item by item, so that a zoom's
    four numbers are named; `attnviz.notebook.data.shown` cuts a list's repr instead, for the maps and tokens a
    caller passes."""
    if isinstance(value, (list, tuple)) and len(value) <= 8:
        return f"[{', '.join(describe(v) for v in value)}]"
    return describe(value)


class View(anywidget.AnyWidget):
    """What every view shares: its script and style, which view it is, a message, the save and fallbacks."""

    _esm = STATIC / "views.js"
    _css = STATIC / "views.css"

    view = traitlets.Unicode("head").tag(sync=True)
    spec = traitlets.Dict().tag(sync=True)  # what does not change: the choices there are, labels, sizes
    error = traitlets.Unicode("").tag(sync=True)  # the last choice's message, shown in the view
    still_id = traitlets.Unicode().tag(sync=True)  # names the still picture the script hides once it draws

    @traitlets.default("still_id")
    def _new_still_id(self) -> str:
        return uuid.uuid4().hex

    def __init__(self, mode: str = "auto", **kwargs):
        self._mode = check_mode(mode)
        super().__init__(**kwargs)

    @property
    def mode(self) -> str:
        return self._mode

    def set_state(self, sync_data):
        """A front end's message, applied as ipywidgets applies it; a value no trait takes (a layer of 1.5, a
        zoom of strings) is refused as a whole and shown in the view, where ipywidgets let the TraitError out into
        the kernel's log and left the front end holding the value Python had refused."""
        try:
            super().set_state(sync_data)
        except traitlets.TraitError:  # traitlets has put every trait of the message back already
            self.error = self._refusal(sync_data)
            self.send_state([name for name in sync_data if name in self.keys])  # the front end shows Python's values

    def _refusal(self, sync_data: dict) -> str:
        """One line on the first value of ``sync_data`` its trait refuses, which never grows with the value:
        traitlets' own message quotes the value whole (a string of a megabyte, shown in the view)."""
        for name, value in sync_data.items():
            if name not in self.keys:
                continue
            trait = self.traits()[name]
            value = self.trait_metadata(name, "from_json", self._trait_from_json)(value, self)  # as set_state reads it
            try:
                trait._validate(self, value)  # as set_trait checks it: the type, then the class's @validate
            except traitlets.TraitError as e:
                text = str(e)
                if len(text) <= 300 and "\n" not in text:
                    return text
                item = getattr(trait, "_trait", None)  # a List's trait for its items
                each = f", each item {item.info()}" if isinstance(trait, traitlets.List) and item is not None else ""
                return f"{name} must be {trait.info()}{each}; got {sent_value(value)}"
        return "a value the view sent was refused"

    def state(self) -> dict:
        """Every synced value the script reads (bytes as they are): what a standalone page embeds."""
        return {name: getattr(self, name) for name in self.keys if not name.startswith("_") and name != "layout"}

    def frames_for_page(self) -> dict:
        """Frames a standalone page answers choices with, keyed as the script asks (none: the state is all)."""
        return {}

    def html(self) -> str:
        """This view as one self-contained HTML document: its script inline, no widget manager, no network."""
        return standalone.document(self.state(), self.frames_for_page(), self.view)

    def fallback_png(self) -> bytes:
        """A PNG of what the view shows now (the static fallback)."""
        return standalone.fallback_png(self.state())

    def fallback_html(self) -> str:
        """The static fallback: the PNG and the numbers that matter, as HTML with no script."""
        return standalone.fallback_html(self.state())

    def save(self, path: str | Path) -> Path:
        """Write the view to ``path``: ``.html`` (the whole interactive view, self-contained) or ``.svg``
        (what it shows now, as a vector picture). Returns the path."""
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix == ".html":
            text = self.html()
        elif suffix == ".svg":
            text = standalone.svg(self.state())
        else:
            raise InputError(f"save writes .html or .svg files; got {path.name!r}")
        path.write_text(text, encoding="utf-8")
        return path

    def _still(self) -> dict:
        """The static fallback as a mime bundle: HTML (the picture and its numbers) and the PNG alone."""
        try:
            png = base64.b64encode(self.fallback_png()).decode("ascii")
            return {"text/html": self.fallback_html(), "image/png": png}
        except AttnvizError as e:
            return {"text/html": f"<p>{standalone.escape(str(e))}</p>"}

    def _repr_mimebundle_(self, **kwargs):
        if self._mode == "html":
            return {"text/html": standalone.iframe(self.html()), "text/plain": repr(self)}
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
        return {**self._still(), **data}, metadata

    def _ipython_display_(self):
        """In IPython's front ends: the still picture as an output of its own, then the widget.

        A saved notebook that keeps its widget state (nbclient and ``nbconvert --execute`` keep it)
        is rendered by nbconvert through a widget manager fetched from a CDN, in place of the
        widget's own fallback: blank offline. An output of its own is shown by every renderer; the
        widget's script hides it once the view is drawn, so a live notebook shows the view alone.
        """
        from IPython.display import display

        if self._mode == "html":
            display(self._repr_mimebundle_(), raw=True)
            return
        display(self._still(), raw=True)
        data, metadata = super()._repr_mimebundle_()
        display({**data, "text/html": STILL_ABOVE}, metadata=metadata, raw=True)


class HeadView(View):
    """One head at a time: kind, layer and head pickers, the map and BertViz's lines, contrast and words.

    A long map (a tiled export) opens max-pooled; a box dragged on it zooms to exact weights.
    """

    kind = traitlets.Unicode().tag(sync=True)
    layer = traitlets.Int(1).tag(sync=True)
    head = traitlets.Int(1).tag(sync=True)
    contrast = traitlets.Unicode("linear").tag(sync=True)
    words = traitlets.Bool(False).tag(sync=True)
    zoom = traitlets.List(traitlets.Int()).tag(sync=True)  # [r0, r1, c0, c1] half-open; [] the whole map
    frame = traitlets.Dict().tag(sync=True)  # the current frame's JSON values
    indices = traitlets.Bytes().tag(sync=True)  # uint8 palette indices, h x w
    weights = traitlets.Bytes().tag(sync=True)  # float16 or float32, h x w: the numbers on hover
    palette = traitlets.Bytes().tag(sync=True)  # RGB, 3 bytes per palette index

    def __init__(
        self,
        source: Source,
        *,
        kind=None,
        layer=1,
        head=1,
        contrast="linear",
        words=False,
        dtype="float32",
        mode="auto",
        view="head",
    ):
        self._frames = HeadFrames(source, dtype)
        self._source = source
        self._putting_back = False
        kinds = source.kinds
        kind = kind or ("cross" if "cross" in kinds else kinds[0])
        shapes = {k: list(source.shape(k)) for k in kinds}
        spec = {
            "kinds": kinds,
            "shapes": shapes,
            "contrasts": CONTRASTS,
            "has_words": source.words is not None,
            "tiled": source.tiled,
            "zoomable": True,
        }
        first = self._frames.frame(kind, layer, head, contrast, words)  # a bad first choice raises here
        super().__init__(
            mode=mode,
            view=view,
            spec=spec,
            kind=kind,
            layer=layer,
            head=head,
            contrast=contrast,
            words=words,
            palette=palette_bytes(),
        )
        self._show(first)
        self.observe(self._chosen, names=["kind", "layer", "head", "contrast", "words", "zoom"])

    @traitlets.validate("contrast")
    def _valid_contrast(self, proposal) -> str:  # a value refused keeps the one before: the view stays drawable
        if proposal["value"] not in CONTRASTS:
            raise traitlets.TraitError(f"contrast must be one of {', '.join(CONTRASTS)}; got {proposal['value']!r}")
        return proposal["value"]

    @traitlets.validate("zoom")
    def _valid_zoom(self, proposal) -> list:
        zoom = list(proposal["value"])
        if zoom and (len(zoom) != 4 or not (0 <= zoom[0] < zoom[1] and 0 <= zoom[2] < zoom[3])):
            raise traitlets.TraitError(
                f"zoom is [] (the whole map) or [first row, row after the last, first column, column after the last], "
                f"from 0 and half-open; got {sent_value(zoom)}"
            )
        return zoom

    def _show(self, frame: dict) -> None:
        frame = dict(frame)
        indices, weights = frame.pop("indices"), frame.pop("weights")
        with self.hold_sync():
            self.indices, self.weights, self.frame, self.error = indices, weights, frame, ""

    def _chosen(self, change) -> None:
        if self._putting_back or self._shown() == self._choice():
            return  # nothing to draw: a change put back, or one queued with others that a refusal put back
        if change["name"] != "zoom" and self.zoom:
            self.zoom = []  # a new head or contrast opens whole; that change calls back here
            return
        try:
            self._show(self._frames.frame(self.kind, self.layer, self.head, self.contrast, self.words, self.zoom))
        except AttnvizError as e:
            self._put_back(str(e))
            return
        if self._choice() != self._shown():
            self._put_back("")  # a box past the map is drawn clipped to it: the state says what is drawn

    def _choice(self) -> tuple:
        return self.kind, self.layer, self.head, self.contrast, self.words, list(self.zoom)

    def _shown(self) -> tuple:
        """The choice the frame drawn answers, as `_choice` gives it: its zoom [] when it shows the whole map."""
        frame = self.frame
        (r0, r1, c0, c1), (Q, K) = frame["region"], frame["full"]
        zoom = [] if (r0, r1, c0, c1) == (0, Q, 0, K) else [r0, r1, c0, c1]
        return frame["kind"], frame["layer"], frame["head"], frame["contrast"], frame["words"], zoom

    def _put_back(self, message: str) -> None:
        """The choice traits set back to what the frame shows, and ``message``: a refused choice (a layer past the
        last, a kind the maps lack: from Python, or from a front end) must not stay in the state, where every
        later choice would be refused with it and a saved page would open on it; nor a box past the map, which is
        drawn clipped to it."""
        self._putting_back = True
        try:
            with self.hold_sync():
                self.kind, self.layer, self.head, self.contrast, self.words, self.zoom = self._shown()
                self.error = message
        finally:
            self._putting_back = False

    def frames_for_page(self) -> dict:
        """Every kind, layer, head, contrast and words the page can answer without Python, within its budget."""
        return standalone.head_frames(self._frames, self._source, self.state())


class ModelView(HeadView):
    """Every layer and head of one kind as thumbnails (max-pooled past 96 pixels, as the app's grid); a click
    on a head opens it in the head view below."""

    grid = traitlets.Bytes().tag(sync=True)  # uint8 palette indices, L x H x h x w
    grid_info = traitlets.Dict().tag(sync=True)

    def __init__(self, source: Source, **kwargs):
        self._grid_shown = None  # (kind, contrast) of the grid sent
        super().__init__(source, view="model", **kwargs)

    def _show(self, frame: dict) -> None:
        """The head's frame, and the grid of its kind and contrast: the grid follows what is drawn, never a choice
        that was refused."""
        with self.hold_sync():  # one message: the page draws the frame and its grid together
            super()._show(frame)
            if (frame["kind"], frame["contrast"]) != self._grid_shown:
                self._grid_for(frame["kind"], frame["contrast"])

    def _grid_for(self, kind: str, contrast: str) -> None:
        grid = grid_frame(self._source, kind, contrast)
        data = grid.pop("grid")
        with self.hold_sync():
            self.grid, self.grid_info = data, grid
        self._grid_shown = (kind, contrast)

    def frames_for_page(self) -> dict:
        """The grids the page can show within its share of the budget, then the head frames of those kinds and
        contrasts within what is left."""
        state = self.state()
        grids = standalone.grid_frames(self._source, state)
        left = standalone.PAGE_BUDGET - sum(len(grid["grid"]) for grid in grids.values())
        frames = standalone.head_frames(self._frames, self._source, state, left, grids)
        frames["grids"] = grids
        return frames


class StepView(View):
    """Decoding step by step: the token each step writes, its candidates, and one head's rows over the
    source (cross-attention) and the prefix (decoder self-attention)."""

    self_rows = traitlets.Bytes().tag(sync=True)  # float32 (steps, L, H, P)
    cross_rows = traitlets.Bytes().tag(sync=True)  # float32 (steps, L, H, S), empty for a language model

    def __init__(self, data: dict, mode: str = "auto"):
        data = dict(data)
        self_rows, cross_rows = data.pop("self_rows"), data.pop("cross_rows")
        super().__init__(mode=mode, view="step", spec=data, self_rows=self_rows, cross_rows=cross_rows)


class AtlasView(View):
    """The head atlas: every head of a kind on the map of heads, coloured by a statistic, and the table."""

    def __init__(self, atlas, mode: str = "auto"):
        super().__init__(mode=mode, view="atlas", spec=atlas_data(atlas))
