"""Decoding with an incremental key/value cache: batched greedy, beam search, and a step-through.

Each decoding step feeds only the newest token to the decoder; the keys and values of earlier
positions come from a `LayerCache`, and the encoder's keys and values for
cross-attention are projected once. A decoder-only model (a language model) has no encoder: its
prompt fills the cache in one pass (the prefill), and decoding continues from the prompt's last
position. The step-through records, for every step, the decoder
self-attention row and the cross-attention row of every layer and head: the same numbers as the
corresponding rows of one teacher-forced forward pass over the same prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnviz.errors import NonFiniteError
from attnviz.kvcache import LayerCache
from attnviz.model import Transformer

# GNMT length penalty with alpha = 0.6, as the paper's beam search (section 6.1).
LENGTH_PENALTY_ALPHA = 0.6
MAX_OUTPUT_TOKENS = 256


def output_limit(src_len: int, max_len: int) -> int:
    """How many tokens decoding may produce for a source of ``src_len`` tokens: generous (2 S + 16,
    at most `MAX_OUTPUT_TOKENS`), and within the model's ``max_len`` positions. The one rule
    the API, the atlas and the lessons decode by."""
    return min(MAX_OUTPUT_TOKENS, 2 * src_len + 16, max_len - 1)


def length_penalty(length: int, alpha: float = LENGTH_PENALTY_ALPHA) -> float:
    return ((5 + length) / 6) ** alpha


def _new_cache(model: Transformer) -> list[LayerCache]:
    return [LayerCache.empty() for _ in model.decoder_layers]


def _start(model: Transformer, src: Tensor, src_valid: Tensor | None) -> tuple[Tensor | None, Tensor]:
    """(the encoder output, the decoder's first input): ``<s>`` after the encoded source, or for a
    decoder-only model no encoder output and the prompt ``src`` itself, read in one pass."""
    if model.cfg.decoder_only:
        if src_valid is not None and not bool(src_valid.all()):
            raise ValueError("a language model's prompts are decoded one at a time or unpadded")
        return None, src
    memory, _ = model.encode(src, src_valid)
    return memory, torch.full((src.shape[0], 1), model.cfg.bos_id, dtype=torch.long, device=src.device)


def _overflowed(t: int) -> NonFiniteError:
    return NonFiniteError(
        f"the model's keys, values or output hold NaN or infinite values at output step {t + 1}: its numbers "
        "overflow for this input, so nothing is given rather than a wrong output"
    )


def _newest(logits: Tensor, t: int) -> Tensor:
    """The logits of the newest position (n, V), or NonFiniteError: a model whose numbers overflow (finite
    weights can: 3e38 in a projection) would pick its tokens from NaN. One reduction a step: a row's largest
    logit is NaN if any is, +inf if any is, and -inf only if every token is (a -inf logit alone is a token
    never chosen)."""
    last = logits[:, -1]
    if not bool(torch.isfinite(last.amax(-1)).all()):
        raise _overflowed(t)
    return last


def _check_cache(cache: list[LayerCache], first_len: int) -> None:
    """After a decoding, once: every key and value it made, finite. A fused attention kernel makes finite logits
    of infinite keys, which `_newest` cannot see. ``first_len``: the positions the first step read (the start
    token, or a language model's prompt), to name the output step of the first bad position."""
    for c in cache:
        for x in (c.cross_attn.k, c.cross_attn.v, c.self_attn.k, c.self_attn.v):
            if x is None:
                continue
            bad = ~torch.isfinite(x).flatten(end_dim=1).all(0).all(-1)  # (positions,): any batch row or head
            if bool(bad.any()):
                position = int(bad.nonzero()[0, 0]) if x is c.self_attn.k or x is c.self_attn.v else 0
                raise _overflowed(max(position - (first_len - 1), 0))


@torch.no_grad()
def greedy_decode(
    model: Transformer,
    src: Tensor,
    src_valid: Tensor | None = None,
    max_len: int = 64,
) -> list[list[int]]:
    """Greedy outputs for a batch of source ids (B, S), each without the start and end tokens.

    For a decoder-only model ``src`` is the prompt and the output its continuation (without the prompt).
    """
    cfg = model.cfg
    B = src.shape[0]
    memory, token = _start(model, src, src_valid)
    cache = _new_cache(model)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    out = []
    first_len = token.shape[1]
    for t in range(max_len):
        logits, _, _ = model.decode(token, memory, src_valid, cache=cache)
        token = _newest(logits, t).argmax(-1, keepdim=True)  # (B, 1)
        out.append(token)
        done |= token[:, 0] == cfg.eos_id
        if bool(done.all()):
            break
    _check_cache(cache, first_len)
    ids = torch.cat(out, dim=1).tolist()
    return [seq[: seq.index(cfg.eos_id)] if cfg.eos_id in seq else seq for seq in ids]


@dataclass(frozen=True)
class Candidate:
    token_id: int
    prob: float


@dataclass(frozen=True)
class Beam:
    """A live hypothesis after a step: its output ids so far and its summed log-probability."""

    ids: tuple[int, ...]
    score: float


@dataclass(frozen=True)
class DecodeStep:
    """One decoding step of the followed hypothesis.

    At step t the decoder's query is position t of its input (``<s>`` and the t tokens chosen so
    far) and it picks output token t. Rows are that query's attention.
    """

    index: int  # t
    token_id: int  # the token chosen (or given, under teacher forcing) at this step
    prob: float  # the model's probability for that token
    top: tuple[Candidate, ...]  # the k most likely next tokens, most likely first
    self_attn: Tensor  # (L, H, t + 1): decoder self-attention row over the prefix, keys 0..t (+ the prompt)
    cross_attn: Tensor | None  # (L, H, S): cross-attention row over the source; None for a language model
    beams: tuple[Beam, ...] = ()  # beam search: the live hypotheses before this step
    followed: int = 0  # which of ``beams`` the followed hypothesis extends


@dataclass(frozen=True)
class Decoding:
    ids: tuple[int, ...]  # the output, without start and end tokens
    steps: tuple[DecodeStep, ...]  # one per output token, the end token included
    score: float  # summed log-probability of the output (with the end token)
    truncated: bool = False  # the output did not end within max_len: it is cut at the length limit


def best_first(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest of the 1-D ``values`` and their indices, best first, ties to the lowest index as
    ``argmax`` breaks them: ``topk`` orders equal values any way, and a step-through of beam 1 had written
    another token than greedy decoding at a tie. Exact and cheap: only the values at or above the k-th are
    sorted."""
    kth = values.topk(k).values[-1]
    index = (values >= kth).nonzero().squeeze(-1)  # ascending
    order = torch.sort(values[index], descending=True, stable=True).indices[:k]
    return values[index[order]], index[order]


def best_reachable(live: list[Beam], max_len: int) -> float:
    """The highest length-normalised score any of ``live`` could still finish with: its log-probability
    so far (each further token only lowers it) over the largest penalty, at ``max_len`` tokens."""
    return max(b.score for b in live) / length_penalty(max_len)


@torch.no_grad()
def step_through(
    model: Transformer,
    src: Tensor,
    beam_size: int = 1,
    top_k: int = 5,
    max_len: int = 64,
    forced: list[int] | None = None,
) -> Decoding:
    """Decode one source sentence (src: (1, S)) and record every step of the best hypothesis.

    ``beam_size`` 1 is greedy: it stops at the first end token. With ``forced`` (target ids ending with
    the end token) the decoder is teacher-forced: each step takes the given token and records the
    model's own prediction in ``top``. Beam search keeps ``beam_size`` live hypotheses (of the
    ``2 beam_size`` best extensions, the first ``beam_size`` that do not end), finishes those that end
    before the last of them, and returns the best by the GNMT length-normalised score, the hypotheses
    still live at the length limit included (``truncated``: the best is one of them). It stops once no
    live hypothesis can overtake the best finished one (`best_reachable`), so stopping never changes
    the answer.
    """
    if src.dim() != 2 or src.shape[0] != 1:
        raise ValueError(f"step_through decodes one sentence: src must be (1, S), got {tuple(src.shape)}")
    if not 1 <= beam_size <= 64:
        raise ValueError(f"beam_size must be between 1 and 64, got {beam_size}")
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, got {max_len}")
    if forced is not None:
        beam_size, max_len = 1, len(forced)
    cfg = model.cfg
    memory, first = _start(model, src, None)  # (1, S, D) and <s>, or None and the prompt
    cache = _new_cache(model)
    live = [Beam((), 0.0)]
    # Per step, per live beam: (parent beam index, self rows, cross rows, top-k, log-probs).
    history: list[dict] = []
    finished: list[tuple[float, Beam, int, int]] = []  # (normalised score, beam, step, beam index)
    for t in range(max_len):
        n = len(live)
        last = torch.tensor([[b.ids[-1]] for b in live], device=src.device) if t else first
        memory_n = None if memory is None else memory.expand(n, -1, -1)
        logits, self_w, cross_w = model.decode(last, memory_n, return_attention=True, cache=cache)
        logp = torch.log_softmax(_newest(logits, t).float(), dim=-1)  # (n, V)
        self_rows = torch.stack([w[:, :, -1] for w in self_w], dim=1)  # (n, L, H, t+1): the newest query's row
        cross_rows = None if memory is None else torch.stack([w[:, :, -1] for w in cross_w], dim=1)  # (n, L, H, S)
        top = [best_first(row.exp(), min(top_k, logp.shape[-1])) for row in logp]  # the chosen token first at a tie
        top_p, top_i = torch.stack([p for p, _ in top]), torch.stack([i for _, i in top])
        history.append(
            {
                "beams": tuple(live),
                "self": self_rows,
                "cross": cross_rows,
                "logp": logp,
                "top": [
                    tuple(Candidate(i, p) for i, p in zip(ii, pp, strict=True))
                    for ii, pp in zip(top_i.tolist(), top_p.tolist(), strict=True)
                ],
            }
        )
        if forced is not None:
            choices = [(live[0].score + float(logp[0, forced[t]]), 0, forced[t])]
        else:
            total = torch.tensor([b.score for b in live], device=logp.device)[:, None] + logp  # (n, V)
            scores, flat = best_first(total.flatten(), min(2 * beam_size, total.numel()))
            V = logp.shape[-1]
            choices = [(s, f // V, f % V) for s, f in zip(scores.tolist(), flat.tolist(), strict=True)]
        new_live, parents = [], []
        for score, parent, token in choices:
            beam = Beam(live[parent].ids + (token,), score)
            if token == cfg.eos_id or (forced is not None and t == max_len - 1):
                finished.append((score / length_penalty(len(beam.ids)), beam, t, parent))
            else:
                new_live.append(beam)
                parents.append(parent)
            if len(new_live) == beam_size:
                break
        history[-1]["parents"] = parents
        if not new_live:
            break
        live = new_live
        if finished and (beam_size == 1 or max(f[0] for f in finished) >= best_reachable(live, max_len)):
            break  # greedy has ended, or no live hypothesis can overtake the best finished one
        index = torch.tensor(parents, device=src.device)
        cache = [c.select(index) for c in cache]
    else:  # ran out of length: the live hypotheses compete as they are, unfinished
        last_t = len(history) - 1
        for i, beam in enumerate(live):
            unfinished = (beam.score / length_penalty(len(beam.ids)), beam, last_t, history[-1]["parents"][i])
            finished.append(unfinished)
    _check_cache(cache, first.shape[1])
    _, best, t_end, parent = max(finished, key=lambda f: f[0])
    truncated = not (best.ids and best.ids[-1] == cfg.eos_id) and forced is None
    # Walk back from the end: at each step, which live beam did the best hypothesis extend?
    chain = [0] * (t_end + 1)
    chain[t_end] = parent
    for t in range(t_end - 1, -1, -1):
        chain[t] = history[t]["parents"][chain[t + 1]]
    steps = []
    for t in range(t_end + 1):
        h, b = history[t], chain[t]
        token = best.ids[t]
        steps.append(
            DecodeStep(
                index=t,
                token_id=token,
                prob=float(h["logp"][b, token].exp()),
                top=h["top"][b],
                self_attn=h["self"][b].cpu(),
                cross_attn=None if h["cross"] is None else h["cross"][b].cpu(),
                beams=h["beams"],
                followed=b,
            )
        )
    ids = best.ids[:-1] if best.ids and best.ids[-1] == cfg.eos_id else best.ids
    return Decoding(ids=tuple(ids), steps=tuple(steps), score=best.score, truncated=truncated)
