"""attnviz in notebooks: the head, model, step and atlas views, offline, on any model's maps.

```python
from attnviz.notebook import head_view, model_view, step_view, atlas_view

head_view(export)                               # an attnviz export, or a tiled export of a long text
head_view(bundle, "The cat sat on the mat.")    # an attnviz model and a text
head_view(outputs.attentions, tokens=tokens)    # Hugging Face (a decoder-only model, or BERT)
head_view(encoder=enc, decoder=dec, cross=cross, src_tokens=src, tgt_tokens=tgt)  # an encoder-decoder
```

Each view is an anywidget (``pip install attnviz[notebook]``) whose script ships in the package:
nothing is fetched from any host. ``mode="html"`` shows it as one self-contained HTML document
instead (no widget manager: VS Code and Colab offline; ``mode="auto"`` chooses it there), and
``view.save("head.html" | "head.svg")`` writes a file. docs/notebooks.md says what was tested where.
"""

from __future__ import annotations

from attnviz.errors import InputError
from attnviz.export import AttentionExport
from attnviz.figures.images import check_contrast
from attnviz.notebook.data import Source, _is_bundle, as_source, is_export_path, plain_export, stack_layers
from attnviz.notebook.frames import step_data
from attnviz.notebook.widgets import AtlasView, HeadView, ModelView, StepView
from attnviz.tiles import TiledAttention

__all__ = [
    "AtlasView",
    "HeadView",
    "ModelView",
    "Source",
    "StepView",
    "atlas_view",
    "head_view",
    "model_view",
    "plain_export",
    "stack_layers",
    "step_view",
]


def head_view(
    data=None,
    tokens=None,
    *,
    text: str | None = None,
    tgt: str | None = None,
    generate: int = 0,
    encoder=None,
    decoder=None,
    cross=None,
    src_tokens=None,
    tgt_tokens=None,
    kind: str | None = None,
    layer: int = 1,
    head: int = 1,
    contrast: str = "linear",
    words: bool = False,
    batch: int | None = None,
    dtype: str = "float32",
    mode: str = "auto",
) -> HeadView:
    """One head at a time: kind, layer and head pickers, the map and BertViz's lines; hovering a token
    highlights its row and column; contrast and words as in the app.

    ``data`` is an [`AttentionExport`][attnviz.export.AttentionExport], a
    [`TiledAttention`][attnviz.tiles.TiledAttention] (a long text: the pooled overview first, a dragged
    box zooms to exact weights), a path to an exported .npz, an attnviz model (a ``Bundle``) with
    ``text`` (or the text as the second argument), or plain maps with ``tokens``: Hugging Face's
    ``outputs.attentions`` or a TransformerLens pattern (`attnviz.notebook.data`). An
    encoder-decoder's plain maps go in ``encoder``, ``decoder``, ``cross`` with ``src_tokens`` and
    ``tgt_tokens``. ``kind`` is the kind shown first; for plain self-attention it also says whether the
    maps are an ``"encoder"``'s or a ``"decoder"``'s (default: a decoder's when every map is exactly 0
    above its diagonal, an encoder's when none is; a mix is refused). ``batch`` picks one text of a batch
    (a tuple of layers, or a 5-D stack: a bare 4-D array is (layers, heads, queries, keys), one text).
    ``dtype`` ("float32" or "float16") is how the weights travel to the browser. ``mode``: "widget",
    "html" (one self-contained document) or "auto".
    """
    check_contrast(contrast)
    source = _source(data, tokens, text, tgt, generate, encoder, decoder, cross, src_tokens, tgt_tokens, kind, batch)
    return HeadView(
        source, kind=_first_kind(kind), layer=layer, head=head, contrast=contrast, words=words, dtype=dtype, mode=mode
    )


def model_view(
    data=None,
    tokens=None,
    *,
    text: str | None = None,
    tgt: str | None = None,
    generate: int = 0,
    encoder=None,
    decoder=None,
    cross=None,
    src_tokens=None,
    tgt_tokens=None,
    kind: str | None = None,
    contrast: str = "linear",
    batch: int | None = None,
    dtype: str = "float32",
    mode: str = "auto",
) -> ModelView:
    """Every layer and head of a kind as thumbnails, max-pooled past 96 tokens as in the app; a click on
    a head opens it in the head view below. Takes what [`head_view`][attnviz.notebook.head_view] takes."""
    check_contrast(contrast)
    source = _source(data, tokens, text, tgt, generate, encoder, decoder, cross, src_tokens, tgt_tokens, kind, batch)
    return ModelView(source, kind=_first_kind(kind), contrast=contrast, dtype=dtype, mode=mode)


def step_view(
    data,
    text: str | None = None,
    *,
    src_tokens=None,
    tgt_tokens=None,
    id_to_token=None,
    beam: int = 1,
    mode: str = "auto",
) -> StepView:
    """Decoding step by step, for an encoder-decoder or a language model: per step the token written, its
    probability and candidates, and one layer's and head's rows over the source and the prefix.

    ``data`` is an attnviz model (a ``Bundle``) with ``text`` (greedy, or ``beam`` search), or an
    [`attnviz.decoding.Decoding`][] with its ``src_tokens`` (None for a language model), the decoder
    input's ``tgt_tokens`` and ``id_to_token`` (a function from an id to its token). ``tgt_tokens`` is
    the start token or the prompt, then every token written but the last (P, what the last step reads),
    or with the last one too (P + 1); each token a step wrote must be ``id_to_token`` of its id.
    """
    if _is_bundle(data):
        from attnviz import api

        if not isinstance(text, str):
            raise InputError("step_view(model, text): give the text to decode")
        decoding = api.step_through(data, text, beam=beam)
        tok = data.tokenizer
        written = [tok.target_token(i) for i in decoding.ids]
        if data.config.decoder_only:
            src, prefix = None, [*tok.encode_source(text).tokens, *written]
        else:
            src, prefix = tok.encode_source(text).tokens, [tok.target_token(tok.bos_id), *written]
        return StepView(step_data(decoding, src, prefix, tok.target_token), mode=mode)
    if tgt_tokens is None or id_to_token is None:
        raise InputError("step_view(decoding, ...) needs tgt_tokens (the decoder input) and id_to_token")
    return StepView(step_data(data, src_tokens, tgt_tokens, id_to_token), mode=mode)


def atlas_view(atlas, mode: str = "auto") -> AtlasView:
    """The head atlas ([`attnviz.atlas.Atlas`][], or its folder): each kind's map of heads, coloured by a
    statistic, and the table of heads."""
    from pathlib import Path

    from attnviz.atlas import Atlas, load_atlas

    if isinstance(atlas, (str, Path)):
        atlas = load_atlas(atlas)
    if not isinstance(atlas, Atlas):
        raise InputError(
            f"atlas_view takes an attnviz.atlas.Atlas or its folder (`attnviz atlas --out` writes one); "
            f"got {type(atlas).__name__}"
        )
    return AtlasView(atlas, mode=mode)


def _first_kind(kind: str | None) -> str | None:
    if kind is not None and kind not in ("encoder", "decoder", "cross"):
        raise InputError(f"kind must be 'encoder', 'decoder' or 'cross' (or None: the view chooses); got {kind!r}")
    return kind


def _source(data, tokens, text, tgt, generate, encoder, decoder, cross, src_tokens, tgt_tokens, kind, batch) -> Source:
    _first_kind(kind)
    exported = isinstance(data, (Source, AttentionExport, TiledAttention)) or is_export_path(data)
    if batch is not None and (exported or _is_bundle(data)):
        raise InputError("batch picks one text of plain maps; a model or an export holds one text already")
    plain = {
        name: value
        for name, value in (
            ("encoder", encoder),
            ("decoder", decoder),
            ("cross", cross),
            ("src_tokens", src_tokens),
            ("tgt_tokens", tgt_tokens),
        )
        if value is not None
    }
    self_kind = kind if kind in ("encoder", "decoder") and data is not None else "auto"
    return as_source(data, tokens, text=text, tgt=tgt, generate=generate, batch=batch, kind=self_kind, **plain)
