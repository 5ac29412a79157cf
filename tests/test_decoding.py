"""Decoding: the key/value cache against teacher forcing, greedy against beam size 1, beam search."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import seeded_model

from attnviz.decoding import greedy_decode, length_penalty, step_through
from attnviz.model import Transformer
from attnviz.tokenizer import SentencePieceTokenizer
from attnviz.training.data import get_task
from attnviz.training.seq2seq import make_batch

ATOL = 1e-5
MAX_LEN = 30  # longer than any output of the briefly trained model that stops


@pytest.fixture(scope="module")
def tokenizer(tiny_spm) -> SentencePieceTokenizer:
    return SentencePieceTokenizer(tiny_spm)


@pytest.fixture(scope="module")
def model(tiny_cfg, tokenizer, reverse_pairs) -> Transformer:
    """The tiny model after 60 steps on the reverse task (about 2 s).

    A random model never emits the end token; a little training gives outputs that stop at
    different lengths, some that run to the length limit, and beams that disagree with greedy.
    """
    model = seeded_model(tiny_cfg, seed=0).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(60):
        start = (step * 32) % (len(reverse_pairs) - 32)
        src, src_valid, tgt, tgt_valid, labels = make_batch(reverse_pairs[start : start + 32], tokenizer, "cpu")
        logits = model(src, tgt, src_valid, tgt_valid).logits
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str]]:
    return get_task("reverse").pairs(8, seed=3, split="heldout")


@pytest.fixture(scope="module")
def sources(pairs, tokenizer) -> list[torch.Tensor]:
    """Held-out source sentences, each as (1, S) ids."""
    return [torch.tensor([tokenizer.encode_source(src).ids]) for src, _ in pairs]


def _teacher_forced(model: Transformer, src: torch.Tensor, outputs: list[int]):
    """One forward over the decoder input ``<s> outputs[:-1]``: the query at t predicts outputs[t]."""
    tgt = torch.tensor([[model.cfg.bos_id, *outputs[:-1]]])
    return model(src, tgt, return_attention=True)


def _log_prob(model: Transformer, src: torch.Tensor, outputs: list[int]) -> float:
    """Summed log-probability of ``outputs`` under teacher forcing."""
    if not outputs:
        return 0.0
    logp = torch.log_softmax(_teacher_forced(model, src, outputs).logits[0], dim=-1)  # (T, V)
    return float(logp[torch.arange(len(outputs)), torch.tensor(outputs)].sum())


def _assert_steps_match_teacher_forcing(model, src, steps) -> None:
    outputs = [step.token_id for step in steps]
    out = _teacher_forced(model, src, outputs)
    probs = torch.softmax(out.logits[0], dim=-1)  # (T, V)
    self_maps = out.attention.stacked("decoder")[:, 0]  # (L, H, T, T)
    cross_maps = out.attention.stacked("cross")[:, 0]  # (L, H, T, S)
    for t, step in enumerate(steps):
        assert step.index == t
        assert step.self_attn.shape == (model.cfg.n_dec_layers, model.cfg.n_heads, t + 1)
        torch.testing.assert_close(step.self_attn, self_maps[:, :, t, : t + 1], atol=ATOL, rtol=0, msg=f"step {t}")
        torch.testing.assert_close(step.cross_attn, cross_maps[:, :, t], atol=ATOL, rtol=0, msg=f"step {t}")
        assert step.prob == pytest.approx(float(probs[t, step.token_id]), abs=ATOL)
        for candidate in step.top:
            assert candidate.prob == pytest.approx(float(probs[t, candidate.token_id]), abs=ATOL)


# ---------------------------------------------------------------------------------------------
# The cache gives the rows of a teacher-forced forward pass


@pytest.mark.slow
def test_greedy_steps_equal_rows_of_a_teacher_forced_forward(model, sources):
    for src in sources[:4]:
        decoding = step_through(model, src, beam_size=1, max_len=MAX_LEN)
        assert len(decoding.steps) > 1
        _assert_steps_match_teacher_forcing(model, src, decoding.steps)


@pytest.mark.slow  # two seconds or more on a 2-core AMD EPYC with AVX2 only
def test_beam_steps_equal_rows_of_a_teacher_forced_forward(model, sources):
    # Beam search reorders the cache between steps; the followed hypothesis must get its own rows.
    for src in sources[:4]:
        decoding = step_through(model, src, beam_size=4, max_len=MAX_LEN)
        _assert_steps_match_teacher_forcing(model, src, decoding.steps)


def test_forced_steps_follow_the_given_target(model, pairs, tokenizer, sources):
    for (_, target), src in zip(pairs[:4], sources[:4], strict=True):
        forced = list(tokenizer.encode_target(target)[1].ids)  # pieces, then the end token
        decoding = step_through(model, src, forced=forced)
        assert [step.token_id for step in decoding.steps] == forced
        assert list(decoding.ids) == forced[:-1]
        _assert_steps_match_teacher_forcing(model, src, decoding.steps)
        assert decoding.score == pytest.approx(_log_prob(model, src, forced), abs=1e-4)


# ---------------------------------------------------------------------------------------------
# Greedy


def test_beam_size_one_is_greedy_decode(model, sources):
    lengths = []
    for src in sources:
        greedy = greedy_decode(model, src, max_len=MAX_LEN)[0]
        decoding = step_through(model, src, beam_size=1, max_len=MAX_LEN)
        assert list(decoding.ids) == greedy
        assert [step.top[0].token_id for step in decoding.steps] == [step.token_id for step in decoding.steps]
        lengths.append(len(greedy))
    assert len(set(lengths)) > 1, f"outputs too alike to test anything: lengths {lengths}"
    assert min(lengths) > 0


def test_at_a_tie_beam_size_one_takes_the_token_greedy_takes(monkeypatch):
    """Two tokens of exactly equal logits: greedy's argmax takes the lower id, as transformers' greedy search
    does; the step-through of beam 1 had taken the other (topk orders ties any way), so the app's decoding page
    showed another output than `attnviz translate`."""
    import attnviz

    reverse = attnviz.load("reverse", device="cpu")
    src = torch.tensor([reverse.tokenizer.encode_source("a b c d e f").ids])
    first = greedy_decode(reverse.model, src, max_len=20)[0][1]  # the second token written, tied below
    logits = type(reverse.model).logits

    def tied(self, x):
        out = logits(self, x).clone()
        out[..., first + 1] = out[..., first]  # the next id, equal to the best at every position
        return out

    monkeypatch.setattr(type(reverse.model), "logits", tied)
    greedy = greedy_decode(reverse.model, src, max_len=20)[0]
    assert greedy[1] == first, "argmax keeps the lower of the two tied ids"
    for beam_size in (1, 2):
        decoding = step_through(reverse.model, src, beam_size=beam_size, max_len=20)
        assert decoding.steps[1].top[0].token_id == first, "the top list puts the lower tied id first"
        if beam_size == 1:
            assert list(decoding.ids) == greedy


def test_best_first_breaks_ties_to_the_lowest_index_as_argmax_does():
    from attnviz.decoding import best_first

    values = torch.tensor([0.5, 2.0, -1.0, 2.0, 2.0, 0.5, 3.0])
    scores, index = best_first(values, 4)
    assert index.tolist() == [6, 1, 3, 4] and scores.tolist() == [3.0, 2.0, 2.0, 2.0]
    scores, index = best_first(values, 6)
    assert index.tolist() == [6, 1, 3, 4, 0, 5]
    assert best_first(values, 1)[1].item() == int(values.argmax())
    many = torch.randn(50_000)  # no ties: as topk
    assert torch.equal(best_first(many, 8)[1], many.topk(8).indices)


def test_greedy_decode_of_a_padded_batch_equals_one_by_one(model, sources, padded_batch):
    ids = [src[0].tolist() for src in sources]
    src, src_valid = padded_batch([len(s) for s in ids], seed=0)
    for row, s in enumerate(ids):
        src[row, : len(s)] = torch.tensor(s)
    together = greedy_decode(model, src, src_valid, max_len=MAX_LEN)
    assert together == [greedy_decode(model, torch.tensor([s]), max_len=MAX_LEN)[0] for s in ids]


# ---------------------------------------------------------------------------------------------
# Beam search


def test_beam_score_is_the_teacher_forced_log_probability(model, sources):
    for src in sources:
        decoding = step_through(model, src, beam_size=4, max_len=MAX_LEN)
        outputs = [step.token_id for step in decoding.steps]
        assert decoding.score == pytest.approx(_log_prob(model, src, outputs), abs=1e-4)


@pytest.mark.slow  # 1.5 s or more in the quick tier on a 2-core AMD EPYC with AVX2 only
def test_beam_steps_record_the_live_beams_and_the_followed_one(model, sources):
    for src in sources:
        decoding = step_through(model, src, beam_size=4, max_len=MAX_LEN)
        outputs = [step.token_id for step in decoding.steps]
        for t, step in enumerate(decoding.steps):
            assert 1 <= len(step.beams) <= 4
            assert 0 <= step.followed < len(step.beams)
            followed = step.beams[step.followed]
            assert followed.ids == tuple(outputs[:t]), f"step {t} follows another hypothesis"
            assert followed.score == pytest.approx(_log_prob(model, src, outputs[:t]), abs=1e-4)
        assert len(decoding.steps[0].beams) == 1  # the search starts from <s> alone


def test_beam_is_at_least_as_good_as_greedy_when_greedy_stops(model, sources):
    eos = model.cfg.eos_id
    compared = 0
    for src in sources:
        greedy = greedy_decode(model, src, max_len=MAX_LEN)[0]
        if len(greedy) == MAX_LEN:  # greedy ran out of length: no finished score to compare
            continue
        greedy_outputs = [*greedy, eos]
        greedy_norm = _log_prob(model, src, greedy_outputs) / length_penalty(len(greedy_outputs))
        decoding = step_through(model, src, beam_size=4, max_len=MAX_LEN)
        beam_outputs = [step.token_id for step in decoding.steps]
        beam_norm = _log_prob(model, src, beam_outputs) / length_penalty(len(beam_outputs))
        assert beam_norm >= greedy_norm - 1e-5, (decoding.ids, greedy)
        compared += 1
    assert compared >= 3


def _plain_beam_search(model: Transformer, src: torch.Tensor, beam_size: int, max_len: int):
    """Beam search without a cache and without stopping early: every step a whole forward pass over each
    live prefix (log-softmax in float64), run to the length limit. Of the 2k best extensions, those that end
    before the k-th one that does not are finished, the first k that do not stay live; the best of the
    finished and of the live ones at the limit, by the GNMT score. (ids without the end token, summed
    log-probability, ended)."""
    eos, prompt = model.cfg.eos_id, src[0].tolist()
    live, finished = [((), 0.0)], []
    for _ in range(max_len):
        candidates = []
        for ids, score in live:
            if model.cfg.decoder_only:
                logits = model(None, torch.tensor([[*prompt, *ids]])).logits[0, -1]
            else:
                logits = model(src, torch.tensor([[model.cfg.bos_id, *ids]])).logits[0, -1]
            logp = torch.log_softmax(logits.double(), dim=-1).tolist()
            candidates += [(score + lp, ids + (token,)) for token, lp in enumerate(logp)]
        candidates.sort(key=lambda c: -c[0])
        live = []
        for score, ids in candidates[: 2 * beam_size]:
            if ids[-1] == eos:
                finished.append((score / length_penalty(len(ids)), ids, score))
            elif len(live) < beam_size:
                live.append((ids, score))
            if len(live) == beam_size:
                break
        if not live:
            break
    finished += [(score / length_penalty(len(ids)), ids, score) for ids, score in live]
    _, ids, score = max(finished, key=lambda f: f[0])
    ended = ids[-1:] == (eos,)
    return (ids[:-1] if ended else ids), score, ended


@pytest.mark.slow  # a whole forward pass per live prefix and step
@pytest.mark.parametrize("beam_size", [2, 3, 5])
def test_beam_search_equals_a_plain_one_that_never_stops_early(model, sources, beam_size):
    """Stopping once no live hypothesis can overtake the best finished one never changes the answer, and
    hypotheses still live at the length limit compete: the cached search against a plain one run to the end."""
    outcomes = set()
    for src in sources:
        for max_len in (MAX_LEN, 4):  # the second one cuts most of these outputs short
            decoding = step_through(model, src, beam_size=beam_size, max_len=max_len)
            ids, score, ended = _plain_beam_search(model, src, beam_size, max_len)
            assert decoding.ids == ids and decoding.truncated is not ended, (beam_size, max_len, decoding.ids, ids)
            assert decoding.score == pytest.approx(score, abs=1e-4)
            outcomes.add(ended)
    assert outcomes == {True, False}, "outputs that end and outputs cut at the limit were both compared"


@pytest.mark.slow  # a whole forward pass per live prefix and step
def test_beam_search_on_the_shipped_translator_equals_a_plain_one():
    """The same on en-de, where an unlikely early end among the first 2k extensions is common."""
    import attnviz

    en_de = attnviz.load("en-de", device="cpu")
    for text in ("12:00", "1998 twenty", "twenty-one", "Thursday, July 2, 1998"):
        src = torch.tensor([en_de.tokenizer.encode_source(text).ids])
        for beam_size in (3, 4):
            decoding = step_through(en_de.model, src, beam_size=beam_size, max_len=40)
            ids, score, ended = _plain_beam_search(en_de.model, src, beam_size, 40)
            assert (decoding.ids, decoding.truncated) == (ids, not ended), (text, beam_size)
            assert decoding.score == pytest.approx(score, abs=1e-4)


def test_a_wide_beam_is_not_won_by_an_unlikely_early_end_on_the_shipped_models():
    """At step 0 a beam of 2k >= V extensions holds the end token however unlikely it is; it must not win
    over live hypotheses far more likely (the induction model, a vocabulary of 30), nor stop the search while
    a live hypothesis is far ahead of every finished one (en-de's "12:00": greedy gives "00:00")."""
    import attnviz

    lm = attnviz.load("induction", device="cpu")
    greedy = attnviz.generate(lm, "a b c a b", max_new=5)
    assert greedy == "c a b c a"
    for beam in (4, 32):
        assert attnviz.generate(lm, "a b c a b", max_new=5, beam=beam) == greedy, beam
    prompt = torch.tensor([lm.tokenizer.encode_source("a b c a b").ids])
    decoding = step_through(lm.model, prompt, beam_size=32, max_len=5)
    ids, _, ended = _plain_beam_search(lm.model, prompt, 32, 5)
    assert decoding.ids == ids and decoding.truncated and not ended
    en_de = attnviz.load("en-de", device="cpu")
    for text in ("12:00", "1998 twenty"):
        src = torch.tensor([en_de.tokenizer.encode_source(text).ids])
        greedy_ids = greedy_decode(en_de.model, src, max_len=40)[0]
        greedy_norm = _log_prob(en_de.model, src, [*greedy_ids, en_de.model.cfg.eos_id]) / length_penalty(
            len(greedy_ids) + 1
        )
        for beam in (3, 4):
            decoding = step_through(en_de.model, src, beam_size=beam, max_len=40)
            assert not decoding.truncated
            assert decoding.score / length_penalty(len(decoding.steps)) >= greedy_norm - 1e-5, (text, beam)


def test_top_candidates_are_sorted_and_their_probabilities_sum_to_at_most_one(model, sources):
    for beam_size in (1, 4):
        decoding = step_through(model, sources[0], beam_size=beam_size, top_k=5, max_len=MAX_LEN)
        for step in decoding.steps:
            probs = [c.prob for c in step.top]
            assert len(step.top) == 5
            assert probs == sorted(probs, reverse=True)
            assert len({c.token_id for c in step.top}) == 5
            assert all(p > 0 for p in probs)
            assert sum(probs) <= 1 + 1e-6


def test_step_through_refuses_a_batch(model, sources):
    with pytest.raises(ValueError, match="one sentence"):
        step_through(model, torch.cat([sources[0], sources[0]]))


def test_length_penalty_is_gnmt_with_alpha_0_6():
    assert length_penalty(1) == 1.0
    assert length_penalty(7) == pytest.approx(2**0.6)


def test_decoding_builds_no_autograd_graph(tiny_cfg, sources, monkeypatch):
    """Both decoders run without gradients, whatever the caller's mode (a model whose parameters require them,
    as a training's does, would otherwise keep every step's graph)."""
    model = seeded_model(tiny_cfg, seed=0).eval()  # parameters that require gradients
    modes = []
    decode = model.decode
    monkeypatch.setattr(model, "decode", lambda *a, **k: modes.append(torch.is_grad_enabled()) or decode(*a, **k))
    greedy_decode(model, sources[0], max_len=3)
    step_through(model, sources[0], beam_size=2, max_len=3)
    assert modes and not any(modes)


def test_a_language_models_step_through_fills_the_positions_its_prompt_leaves():
    """A prompt of 21 tokens on a model of 64 positions: 43 steps, the last cut by the limit, each step's rows
    those of one full forward pass over the prompt and every token before it (the independent check); a
    prompt that fills every position is refused before any step, as generate refuses one."""
    import attnviz
    from attnviz.errors import InputError

    lm = attnviz.load("induction", device="cpu")
    prompt = " ".join(("q w e r t y u i o p " * 3).split()[:20])
    ids = lm.tokenizer.encode_source(prompt).ids
    room = lm.config.max_len - len(ids)
    assert room == 43
    decoding = attnviz.step_through(lm, prompt)  # stopped at the model's last position: it read "shorten the input"
    assert len(decoding.steps) == room and decoding.truncated
    written = torch.tensor([[*ids, *decoding.ids]])
    assert written.shape[1] == lm.config.max_len
    with torch.no_grad():
        full = lm.model(None, written[:, :-1], return_attention=True).attention.decoder  # L x (1, H, T, T)
    for i in (0, room // 2, room - 1):  # step i's query row is position P - 1 + i, over the keys up to it
        q = len(ids) - 1 + i
        rows = torch.stack([layer[0, :, q, : q + 1] for layer in full])
        torch.testing.assert_close(decoding.steps[i].self_attn, rows, atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="leaves no position for a next token"):
        attnviz.step_through(lm, " ".join(("q w e r t y u i o p " * 7).split()[:63]))


@pytest.mark.parametrize("top_k", [0, -1, 2.5, True, 31])
def test_a_top_k_that_is_not_a_count_of_the_models_tokens_is_refused(top_k):
    import attnviz
    from attnviz.errors import InputError

    lm = attnviz.load("induction", device="cpu")  # 30 tokens
    for call in (attnviz.step_through, lambda *a, **k: attnviz.compare_ablation(*a, "decoder:1.1", **k)):
        with pytest.raises(InputError, match="top_k, the candidates kept at each step, must be a whole number"):
            call(lm, "q w e r q w", top_k=top_k)
    assert len(attnviz.step_through(lm, "q w e r q w", top_k=30).steps[0].top) == 30
