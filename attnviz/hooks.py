"""Named points inside a forward pass, where tensors can be recorded or edited inside a ``with`` block.

The model hands each intermediate tensor to `point` under a name built by `act_name`,
such as ``encoder.0.attn.weights``; readers (the walkthrough, tests, research methods) build the
same names with the same function. Outside any block `point` returns the tensor after one
context-variable read, so a plain forward pays nothing.

- ``with Recorder() as rec: model(...)`` keeps every named tensor (or those a filter selects) in
  ``rec.tensors``, detached (or attached to the autograd graph, with ``keep_graph=True``).
- ``with Edit({name: fn}): model(...)`` replaces the tensor at each named point by ``fn(tensor)``
  (a head switched off, a value zeroed, a mask narrowed, a position table removed).

Blocks live in a `contextvars.ContextVar`, so each thread sees only its own: a model shared
between Streamlit sessions by ``st.cache_resource`` is never touched, since nothing is registered on
its modules (TransformerLens registers hooks on the module, which shared models cannot allow).
Edits run before recorders, so a recorder sees what the model really used.

Names, with ``i`` a layer index from 0:

- ``src.embed``, ``src.pos``, ``src.input``, ``memory``; ``tgt.embed``, ``tgt.pos``, ``tgt.input``,
  ``decoder_out``, ``logits``;
- for each attention (``encoder.i.attn``, ``decoder.i.self_attn``, ``decoder.i.cross_attn``):
  ``mask``, ``q``, ``k``, ``v``, ``scores``, ``weights``, ``heads`` (each head's weighted sum of
  values, before the concatenation), ``concat``, ``out`` (after W^O);
- for each residual block (``encoder.i.attn_block``, ``encoder.i.ffn_block``,
  ``decoder.i.self_block``, ``decoder.i.cross_block``, ``decoder.i.ffn_block``): ``input``,
  ``residual`` (the sum), ``output``;
- for each feed-forward network (``encoder.i.ffn``, ``decoder.i.ffn``): ``hidden``, ``out``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar

from torch import Tensor

from attnviz.kinds import check_kind

_ACTIVE: ContextVar[tuple[Scope, ...]] = ContextVar("attnviz_hook_scopes", default=())

# The attention module of each kind, as named in a layer.
ATTENTION_PARTS = {
    "encoder": ("encoder", "attn"),
    "decoder": ("decoder", "self_attn"),
    "cross": ("decoder", "cross_attn"),
}


def act_name(*path: str | int) -> str:
    """The name of a point: its path joined by dots, e.g. ``act_name("encoder", 0, "attn", "q")``.

    A part is a layer index (an int from 0) or a non-empty name; a site such as ``encoder.0.attn``
    may itself be one part.
    """
    for p in path:
        if isinstance(p, bool) or not (isinstance(p, int) and p >= 0 or isinstance(p, str) and p.strip() == p != ""):
            raise ValueError(f"a point's path is made of layer indices and names, got {path!r}")
    if not path:
        raise ValueError("a point's path is empty")
    return ".".join(str(p) for p in path)


def attention_site(kind: str, layer: int) -> str:
    """The attention module of ``kind`` (encoder, decoder, cross) in ``layer`` (from 0): ``decoder.1.cross_attn``."""
    stack, part = ATTENTION_PARTS[check_kind(kind)]
    return act_name(stack, layer, part)


class Scope:
    """A block that sees the points of the forward passes run inside it, in this thread only."""

    def wants(self, name: str) -> bool:
        raise NotImplementedError

    def __enter__(self):
        self._token = _ACTIVE.set((*_ACTIVE.get(), self))
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.reset(self._token)


class Recorder(Scope):
    """Keeps the tensors of the points it wants, detached, by name in ``tensors``.

    ``names``: None for every point, a collection of names, or a predicate on the name. A point
    visited twice (a decoder layer at every decoding step) keeps its last tensor.

    With ``keep_graph`` the tensors are kept as the model used them, attached to the autograd graph,
    so that gradients with respect to them can be read: call ``.retain_grad()`` on one before
    ``backward()`` (gradient-weighted attention does so with the weights). A graph exists only when
    some input requires grad, which a loaded model's parameters do not: edit an embedding point to
    return a tensor that requires grad, under ``torch.enable_grad()``.
    """

    def __init__(self, names: Iterable[str] | Callable[[str], bool] | None = None, keep_graph: bool = False):
        if names is None or callable(names):
            self._wants = names
        else:
            wanted = frozenset(names)
            self._wants = wanted.__contains__
        self.keep_graph = keep_graph
        self.tensors: dict[str, Tensor] = {}

    def wants(self, name: str) -> bool:
        return self._wants is None or self._wants(name)

    def visit(self, name: str, tensor: Tensor) -> None:
        self.tensors[name] = tensor if self.keep_graph else tensor.detach()


class Edit(Scope):
    """Replaces the tensor at each named point by ``edits[name](tensor)``.

    The function gets what the model computed there (``None`` for a mask that masks nothing) and
    returns what the model uses instead. With ``strict`` (the default), leaving the block after a
    forward pass that never reached one of the names raises a ValueError: a mistyped name would
    otherwise change nothing, silently.
    """

    def __init__(self, edits: Mapping[str, Callable], strict: bool = True):
        self.edits = dict(edits)
        self.strict = strict
        self.reached: set[str] = set()

    def wants(self, name: str) -> bool:
        return name in self.edits

    def apply(self, name: str, tensor):
        self.reached.add(name)
        return self.edits[name](tensor)

    def __exit__(self, exc_type, *exc) -> None:
        super().__exit__(exc_type, *exc)
        missed = sorted(set(self.edits) - self.reached)
        if self.strict and exc_type is None and missed:
            raise ValueError(f"these points were never reached, so nothing was edited there: {missed[:5]}")


def active() -> bool:
    """Whether any block is active in this thread."""
    return bool(_ACTIVE.get())


def wants(site: str, *parts: str) -> bool:
    """Whether an active block wants any of ``parts`` of ``site``; False at once when none is active."""
    scopes = _ACTIVE.get()
    return bool(scopes) and any(s.wants(act_name(site, p)) for p in parts for s in scopes)


def point(tensor, *path: str | int):
    """``tensor``, edited and recorded as the active blocks ask; ``tensor`` itself when none is active.

    ``path`` names the point (`act_name`); the name is built only when a block is active.
    """
    scopes = _ACTIVE.get()
    if not scopes:
        return tensor
    name = act_name(*path)
    for scope in scopes:
        if isinstance(scope, Edit) and scope.wants(name):
            tensor = scope.apply(name, tensor)
    for scope in scopes:
        if isinstance(scope, Recorder) and tensor is not None and scope.wants(name):
            scope.visit(name, tensor)
    return tensor


def observe(tensor, *path: str | int) -> None:
    """Record ``tensor`` at a point that can be recorded but not edited (scores, weights, a block's input).

    An edit there could not reach what the model computes next (the weighted sum is taken inside
    equation 1), so one asked for is an error rather than a silent no-op.
    """
    scopes = _ACTIVE.get()
    if not scopes:
        return
    name = act_name(*path)
    for scope in scopes:
        if isinstance(scope, Edit) and scope.wants(name):
            raise ValueError(f"{name} can be recorded but not edited")
        if isinstance(scope, Recorder) and tensor is not None and scope.wants(name):
            scope.visit(name, tensor)
