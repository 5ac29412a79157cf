"""The atlas's statistics against plain numpy, on maps written by `attnviz attention` and on hand-made maps.

The reference below is written from the definitions (docs/atlas.md), one query row at a
time in float64, sharing no code with attnviz.atlas.stats (batched torch, float32, padding masks).
"""

from __future__ import annotations

import math
import unicodedata

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import seeded_model, tiny_config

import attnviz
from attnviz.analysis import head_statistics
from attnviz.atlas import STATISTICS, compute_atlas
from attnviz.atlas.corpus import Sentence, is_punctuation
from attnviz.atlas.engine import run_batch
from attnviz.atlas.stats import js_divergences, sentence_statistics
from attnviz.cli import main
from attnviz.kinds import KINDS

ATOL = 1e-5
PAIRS = {
    "en-de": [("Thursday, July 2, 1998", "Donnerstag, 2. Juli 1998"), ("twenty-one", None), ("$1,234.50", None)],
    "reverse": [("a t t e n t i o n", "n o i t n e t t a"), ("h e l l o", None), ("x y", None)],
}


def punctuation(label: str) -> bool:
    core = label[1:] if label.startswith("▁") else label[2:] if label.startswith("##") else label
    return len(core) > 0 and all(unicodedata.category(ch)[0] == "P" for ch in core)


def reference(maps, kind, key_ids, key_tokens, specials) -> dict[str, np.ndarray]:
    """Each statistic per (layer, head) of unpadded maps (L, H, Q, K), from the definitions, row by row."""
    maps = np.asarray(maps, dtype=np.float64)
    L, H, Q, K = maps.shape
    special = np.array([i in specials for i in key_ids])
    punct = np.array([punctuation(t) for t in key_tokens])
    out = {name: np.full((L, H), np.nan) for name in STATISTICS}
    for layer in range(L):
        for head in range(H):
            rows: dict[str, list[float]] = {name: [] for name in STATISTICS}
            for i in range(Q):
                p = maps[layer, head, i]
                d = i if kind != "cross" else (0 if Q == 1 else int(math.floor(i * (K - 1) / (Q - 1) + 0.5)))
                positive = p[p > 0]
                rows["entropy"].append(float(-(positive * np.log(positive)).sum()))
                if kind != "cross":
                    rows["mean_distance"].append(float(sum(p[j] * abs(i - j) for j in range(K))))
                rows["diagonal"].append(p[d])
                if d >= 1:
                    rows["previous"].append(p[d - 1])
                if d + 1 < K and kind != "decoder":
                    rows["next"].append(p[d + 1])
                rows["first"].append(p[0])
                if kind != "decoder":
                    rows["last"].append(p[K - 1])
                rows["special"].append(float(p[special].sum()))
                rows["punctuation"].append(float(p[punct].sum()))
                rows["confidence"].append(float(p.max()))
                top = int(np.argmax(p))
                if kind != "cross" and i >= 1:
                    rows["argmax_previous"].append(float(top == i - 1))
                if kind == "encoder" and i + 1 < K:
                    rows["argmax_next"].append(float(top == i + 1))
            for name, values in rows.items():
                if values:
                    out[name][layer, head] = np.mean(values)
    return out


def reference_divergences(maps) -> np.ndarray:
    """(N, N): the mean over rows of JS(P, Q) = KL(P||M)/2 + KL(Q||M)/2, M = (P + Q)/2, heads layer-major."""
    maps = np.asarray(maps, dtype=np.float64)
    heads = maps.reshape(-1, *maps.shape[2:])  # (N, Q, K)

    def kl(p, m):
        keep = p > 0
        return float((p[keep] * np.log(p[keep] / m[keep])).sum())

    N, Q, _ = heads.shape
    out = np.zeros((N, N))
    for a in range(N):
        for b in range(N):
            rows = [kl(heads[a, i], (heads[a, i] + heads[b, i]) / 2) / 2 for i in range(Q)]
            rows = [r + kl(heads[b, i], (heads[a, i] + heads[b, i]) / 2) / 2 for i, r in enumerate(rows)]
            out[a, b] = np.mean(rows)
    return out


def test_punctuation_is_unicode_punctuation_without_the_word_marker():
    for piece in [",", "▁,", "##.", "¿", "—", "«", "...", "▁!?"]:
        assert is_punctuation(piece) and punctuation(piece), piece
    for piece in ["▁", "", "a", "▁a,", "$", "+", "1", "</s>", "<unk:,>"]:
        assert not is_punctuation(piece) and not punctuation(piece), piece


@pytest.fixture(scope="module", params=sorted(PAIRS))
def cli_maps(request, tmp_path_factory):
    """(bundle, atlas of the pairs with targets, atlas of the others, the maps `attnviz attention` wrote for each)."""
    name = request.param
    folder = tmp_path_factory.mktemp(f"maps-{name}")
    exports = []
    for i, (src, tgt) in enumerate(PAIRS[name]):
        out = folder / f"{i}.npz"
        args = ["attention", "--model", name, "--device", "cpu", "--src", src, "--out", str(out)]
        assert main(args + ([] if tgt is None else ["--tgt", tgt])) == 0
        exports.append(attnviz.load_export(out))
    bundle = attnviz.load(name, device="cpu")
    given = compute_atlas(bundle, [s for s, t in PAIRS[name] if t], [t for _, t in PAIRS[name] if t], batch_size=8)
    greedy = compute_atlas(bundle, [s for s, t in PAIRS[name] if t is None], batch_size=8)
    return bundle, given, greedy, exports


def _rows(atlas, line: int, kind: str) -> pd.DataFrame:
    rows = atlas.sentences[(atlas.sentences["line"] == line) & (atlas.sentences["kind"] == kind)]
    return rows.sort_values(["layer", "head"])


def _where(i: int, name: str) -> tuple[str, int]:
    """Pair i of PAIRS[name] is line n of the atlas with given targets, or of the greedy one."""
    given = [j for j, (_, t) in enumerate(PAIRS[name]) if t is not None]
    greedy = [j for j, (_, t) in enumerate(PAIRS[name]) if t is None]
    return ("given", given.index(i) + 1) if i in given else ("greedy", greedy.index(i) + 1)


def test_every_statistic_equals_numpy_on_the_maps_of_attnviz_attention(cli_maps):
    bundle, given, greedy, exports = cli_maps
    tok = bundle.tokenizer
    specials = {tok.pad_id, tok.bos_id, tok.eos_id}
    checked = 0
    for i, export in enumerate(exports):
        which, line = _where(i, bundle.name)
        atlas = given if which == "given" else greedy
        inputs = atlas.inputs[atlas.inputs["line"] == line].iloc[0]
        assert list(inputs["src_ids"]) == export.src_ids.tolist()
        assert list(inputs["tgt_ids"]) == export.tgt_ids.tolist(), "the same decoder input (given or greedy)"
        keys = {
            "encoder": (export.src_ids, export.src_tokens),
            "decoder": (export.tgt_ids, export.tgt_tokens),
            "cross": (export.src_ids, export.src_tokens),
        }
        for kind in KINDS:
            maps = getattr(export, kind)
            want = reference(maps, kind, *keys[kind], specials)
            rows = _rows(atlas, line, kind)
            L, H = maps.shape[:2]
            assert len(rows) == L * H
            assert (rows["queries"] == maps.shape[2]).all() and (rows["keys"] == maps.shape[3]).all()
            for name in STATISTICS:
                got = rows[name].to_numpy().reshape(L, H)
                np.testing.assert_allclose(got, want[name], atol=ATOL, rtol=0, err_msg=f"{kind} {name}")
                checked += int(np.isfinite(got).sum())
    assert checked > 500


def test_divergences_equal_numpy_on_the_maps_of_attnviz_attention(cli_maps):
    bundle, given, _, exports = cli_maps
    export = exports[0]  # the first pair has a given target: it is line 1 of `given`
    assert given.manifest["counts"]["sentences"] == 1
    for kind in KINDS:
        maps = getattr(export, kind)
        want = reference_divergences(maps)
        table = given.distances[given.distances["kind"] == kind]
        got = table.sort_values(["layer_a", "head_a", "layer_b", "head_b"])["js_divergence"].to_numpy()
        np.testing.assert_allclose(got.reshape(want.shape), want, atol=ATOL, rtol=0, err_msg=kind)
        assert (want >= 0).all() and (want <= math.log(2) + 1e-12).all()


def test_where_the_explorers_table_has_the_same_statistic_the_numbers_agree(cli_maps):
    """analysis.head_statistics (one sentence, numpy) and the atlas (batched torch) share six statistics."""
    bundle, given, _, exports = cli_maps
    export = exports[0]
    shared = {"entropy": "entropy", "diagonal": "diagonal", "previous": "previous", "first": "first", "last": "end"}
    for kind in KINDS:
        q_tokens = export.src_tokens if kind == "encoder" else export.tgt_tokens
        k_tokens = export.tgt_tokens if kind == "decoder" else export.src_tokens
        theirs = head_statistics(getattr(export, kind), q_tokens, k_tokens, kind)
        ours = _rows(given, 1, kind).reset_index(drop=True)
        names = {**shared, **({"mean_distance": "mean_distance"} if kind != "cross" else {})}
        for mine, their in names.items():
            np.testing.assert_allclose(ours[mine], theirs[their], atol=ATOL, rtol=0, err_msg=f"{kind} {mine}")
    # Where they differ, by design: the atlas has no distance for cross-attention (the explorer
    # measures it from a scaled diagonal), and no `next` or `last` for the decoder.
    assert given.sentences.query("kind == 'cross'")["mean_distance"].isna().all()


# ---------------------------------------------------------------------------------------------
# Hand-made maps: one key, masked keys, padding


def _run(maps: list[list[list[float]]] | np.ndarray, kind: str, n_queries, n_keys, special=None, punct=None):
    """sentence_statistics of one layer and head per sentence, from (B, Q, K) maps padded to a common size."""
    m = torch.tensor(np.asarray(maps, dtype=np.float32))[:, None]  # (B, H=1, Q, K)
    B, _, Q, K = m.shape
    query_valid = torch.arange(Q)[None] < torch.tensor(n_queries)[:, None]
    key_valid = torch.arange(K)[None] < torch.tensor(n_keys)[:, None]
    special = torch.zeros(B, K, dtype=torch.bool) if special is None else torch.tensor(special)
    punct = torch.zeros(B, K, dtype=torch.bool) if punct is None else torch.tensor(punct)
    values = sentence_statistics([m], kind, query_valid, key_valid, special, punct)  # (B, 1, 1, S)
    return [dict(zip(STATISTICS, row[0, 0].tolist(), strict=True)) for row in values], js_divergences([m], query_valid)


def test_a_sentence_of_one_token():
    (stats,), _ = _run([[[1.0]]], "encoder", [1], [1], special=[[True]])
    assert stats["entropy"] == 0 and stats["mean_distance"] == 0 and stats["confidence"] == 1
    assert stats["diagonal"] == stats["first"] == stats["last"] == stats["special"] == 1
    for name in ("previous", "next", "argmax_previous", "argmax_next"):
        assert math.isnan(stats[name]), f"{name}: no row has that key"


def test_causally_masked_keys_by_hand():
    rows = [[1, 0, 0], [0.3, 0.7, 0], [0.2, 0.3, 0.5]]
    (stats,), _ = _run([rows], "decoder", [3], [3], punct=[[False, True, False]])
    h1, h2 = (
        -(0.3 * math.log(0.3) + 0.7 * math.log(0.7)),
        -(0.2 * math.log(0.2) + 0.3 * math.log(0.3) + 0.5 * math.log(0.5)),
    )
    assert stats["entropy"] == pytest.approx((0 + h1 + h2) / 3)
    assert stats["mean_distance"] == pytest.approx((0 + 0.3 + 0.7) / 3)
    assert stats["diagonal"] == pytest.approx((1 + 0.7 + 0.5) / 3)
    assert stats["previous"] == pytest.approx((0.3 + 0.3) / 2)  # rows 1 and 2 have a previous key
    assert stats["punctuation"] == pytest.approx((0 + 0.7 + 0.3) / 3)
    assert stats["confidence"] == pytest.approx((1 + 0.7 + 0.5) / 3)
    assert stats["argmax_previous"] == 0  # every row's largest weight is on itself
    assert math.isnan(stats["next"]) and math.isnan(stats["last"]) and math.isnan(stats["argmax_next"])


def test_cross_attention_scales_the_diagonal_onto_the_source():
    p = np.full((3, 5), 0.2)
    p[0, 0], p[1, 2], p[2, 4] = 0.6, 0.7, 0.8  # on the line from the first to the last token of both
    p /= p.sum(-1, keepdims=True)
    (stats,), _ = _run([p], "cross", [3], [5])
    assert stats["diagonal"] == pytest.approx((p[0, 0] + p[1, 2] + p[2, 4]) / 3)
    assert stats["previous"] == pytest.approx((p[1, 1] + p[2, 3]) / 2)
    assert stats["next"] == pytest.approx((p[0, 1] + p[1, 3]) / 2)
    assert math.isnan(stats["mean_distance"]) and math.isnan(stats["argmax_previous"])


def test_padding_never_reaches_a_statistic():
    """A short sentence padded in a batch gives what it gives alone, whatever the padded rows hold."""
    rng = np.random.default_rng(0)
    alone = rng.dirichlet(np.ones(2), size=2)  # (2, 2): two queries over two keys
    long = rng.dirichlet(np.ones(4), size=4)
    padded = np.zeros((4, 4))
    padded[:2, :2] = alone
    padded[2:] = rng.dirichlet(np.ones(4), size=2)  # padded query rows: anything at all
    for kind in ("encoder", "decoder", "cross"):
        if kind == "decoder":
            alone_k, long_k, padded_k = (np.tril(m) / np.tril(m).sum(-1, keepdims=True) for m in (alone, long, padded))
        else:
            alone_k, long_k, padded_k = alone, long, padded
        (one,), d_one = _run([alone_k], kind, [2], [2], punct=[[True, False]])
        (_, batched), d_batched = _run(
            [long_k, padded_k], kind, [4, 2], [4, 2], punct=[[False] * 4, [True] + [False] * 3]
        )
        for name in STATISTICS:
            assert batched[name] == pytest.approx(one[name], abs=1e-6, nan_ok=True), (kind, name)
        torch.testing.assert_close(d_batched[1], d_one[0], atol=1e-7, rtol=0)


def test_divergence_of_identical_heads_is_zero_and_of_disjoint_heads_ln_2():
    left = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])  # (1 sentence, Q=2, K=2)
    right = torch.tensor([[[0.0, 1.0], [0.0, 1.0]]])
    maps = torch.stack([left, left, right], dim=1)  # (B=1, H=3, Q, K)
    d = js_divergences([maps], torch.ones(1, 2, dtype=torch.bool))[0]
    assert d[0, 1] == 0 and d[0, 0] == 0
    assert float(d[0, 2]) == pytest.approx(math.log(2)) and float(d[2, 0]) == pytest.approx(math.log(2))


@pytest.mark.parametrize("heads", [1, 2, 5, 6])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tile", [None, 40])
@pytest.mark.parametrize("keys_given", [False, True])
def test_divergences_of_a_padded_batch_in_any_blocks_equal_numpy(heads, causal, tile, keys_given, monkeypatch):
    """Every pair of heads once (odd and even counts: the shifts pair them), padded rows and keys
    left out, and the same numbers whether a block holds whole sentences or a piece of one: TILE
    40 makes blocks of one run of CHUNK cells, which cut these sentences (up to 7 x 7 cells) apart.
    Under a causal mask the keys after a row's query are left out of the work; they hold no weight.
    Padded query rows hold anything (they must be left out), padded keys of real rows 0."""
    import attnviz.atlas.stats as stats

    if tile is not None:
        monkeypatch.setattr(stats, "TILE", tile)
    g = np.random.default_rng(heads + 10 * causal)
    lengths = [7, 3, 1, 6]
    Q = max(lengths)
    padded = np.zeros((len(lengths), heads, Q, Q), dtype=np.float32)
    for b, n in enumerate(lengths):
        logits = g.normal(0, 2, size=(heads, n, n))
        if causal:
            logits = np.where(np.tril(np.ones((n, n))) > 0, logits, -np.inf)
        padded[b, :, :n, :n] = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        padded[b, :, n:, :] = g.dirichlet(np.ones(Q), size=(heads, Q - n))  # padded query rows: anything
    query_valid = torch.arange(Q)[None] < torch.tensor(lengths)[:, None]
    key_valid = query_valid if keys_given else None
    got = js_divergences([torch.from_numpy(padded)], query_valid, causal=causal, key_valid=key_valid).numpy()
    for b, n in enumerate(lengths):
        want = reference_divergences(padded[b : b + 1, :, :n, :n].transpose(1, 0, 2, 3))
        np.testing.assert_allclose(got[b], want, atol=1e-6, rtol=0, err_msg=f"sentence {b}")


def test_cross_attention_divergences_read_a_sentences_own_keys():
    """Queries and keys of different lengths (cross-attention): the real keys of each sentence, from
    ``key_valid``, and the same numbers as reading every key, whose padded ones hold 0."""
    g = np.random.default_rng(3)
    shapes = [(4, 6), (2, 3), (5, 1)]  # (queries, keys) per sentence
    Q, K, heads = 5, 6, 3
    padded = np.zeros((len(shapes), heads, Q, K), dtype=np.float32)
    for b, (nq, nk) in enumerate(shapes):
        padded[b, :, :nq, :nk] = g.dirichlet(np.ones(nk), size=(heads, nq))
    query_valid = torch.arange(Q)[None] < torch.tensor([q for q, _ in shapes])[:, None]
    key_valid = torch.arange(K)[None] < torch.tensor([k for _, k in shapes])[:, None]
    maps = [torch.from_numpy(padded)]
    got = js_divergences(maps, query_valid, key_valid=key_valid).numpy()
    np.testing.assert_allclose(got, js_divergences(maps, query_valid).numpy(), atol=1e-7, rtol=0)
    for b, (nq, nk) in enumerate(shapes):
        want = reference_divergences(padded[b : b + 1, :, :nq, :nk].transpose(1, 0, 2, 3))
        np.testing.assert_allclose(got[b], want, atol=1e-6, rtol=0, err_msg=f"sentence {b}")


def test_the_cells_are_every_real_cell_once_in_runs_of_one_sentence():
    from attnviz.atlas.stats import CHUNK, _cells

    cases = [([5, 0, 9, 1], [5, 0, 9, 1], True), ([3, 7], [9, 2], False), ([40, 33], None, False), ([64], [64], True)]
    for n_queries, n_keys, causal in cases:
        B, Q = len(n_queries), max(n_queries)
        K = Q if n_keys is None else max(n_keys)
        query_valid = torch.arange(Q)[None] < torch.tensor(n_queries)[:, None]
        key_valid = None if n_keys is None else torch.arange(K)[None] < torch.tensor(n_keys)[:, None]
        cells, pads, owners = _cells(query_valid, key_valid, K, causal)
        assert len(cells) == CHUNK * len(owners), "whole runs"
        sentence = owners.repeat_interleave(CHUNK)
        real = torch.ones(len(cells), dtype=torch.bool)
        real[pads] = False
        for b in range(B):
            nq, nk = n_queries[b], K if n_keys is None else n_keys[b]
            want = {(i, j) for i in range(nq) for j in range(nk) if j <= i or not causal}
            got = [divmod(int(c), K) for c in cells[real & (sentence == b)]]
            assert len(got) == len(set(got)) and set(got) == want, (n_queries, b)
            assert int((~real & (sentence == b)).sum()) < CHUNK, "under one run of padding per sentence"


# ---------------------------------------------------------------------------------------------
# Batches


def _sentences(n: int, seed: int) -> list[Sentence]:
    g = np.random.default_rng(seed)
    out = []
    for line in range(1, n + 1):
        S, T = int(g.integers(1, 12)), int(g.integers(1, 10))
        src = tuple(int(i) for i in g.integers(4, 50, S - 1)) + (2,)
        tgt = (1,) + tuple(int(i) for i in g.integers(4, 50, T - 1))
        out.append(Sentence(line, "", src, tuple(map(str, src)), tgt, tuple(map(str, tgt))))
    return out


class _Tokenizer:
    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def target_token(self, i):
        return str(i)


def _bundle(model):
    from attnviz.checkpoints import Bundle

    return Bundle(model, _Tokenizer(), "tiny", None, "0", {})


def test_a_batch_gives_what_each_sentence_gives_alone():
    bundle = _bundle(seeded_model(tiny_config(), seed=3))
    sentences = _sentences(7, seed=4)
    together = run_batch(bundle, sentences)
    for b, sentence in enumerate(sentences):
        alone = run_batch(bundle, [sentence])
        for kind in KINDS:
            np.testing.assert_allclose(together.stats[kind][b], alone.stats[kind][0], atol=ATOL, rtol=0, err_msg=kind)
            np.testing.assert_allclose(
                together.divergences[kind][b], alone.divergences[kind][0], atol=ATOL, rtol=0, err_msg=kind
            )


# ---------------------------------------------------------------------------------------------
# bfloat16

# The bound this project states for --precision bf16 (docs/atlas.md): every weight within
# 0.05 of its float32 value, the mean absolute change under 1e-3, and each statistic within 0.05,
# except the argmax shares, which count rows and can jump where two weights tie in bfloat16.
BF16_MAX_WEIGHT, BF16_MEAN_WEIGHT, BF16_MAX_STATISTIC = 0.05, 1e-3, 0.05


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_bf16_maps_and_statistics_stay_within_the_stated_bound(name):
    bundle = attnviz.load(name, device="cpu")
    exports = [attnviz.attention(bundle, s) for s in bundle.info["examples"]]
    for export in exports:
        src, tgt = torch.from_numpy(export.src_ids)[None], torch.from_numpy(export.tgt_ids)[None]
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            fast = bundle.model(src, tgt, return_attention=True, return_logits=False).attention
        for kind in KINDS:
            bf16 = fast.stacked(kind)[:, 0].numpy()
            assert bf16.dtype == np.float32
            change = np.abs(bf16 - getattr(export, kind))
            assert change.max() < BF16_MAX_WEIGHT and change.mean() < BF16_MEAN_WEIGHT, (kind, change.max())
            assert change.max() > 0, "the products did run in bfloat16"
    sentences = [
        Sentence(i + 1, "", tuple(e.src_ids.tolist()), e.src_tokens, tuple(e.tgt_ids.tolist()), e.tgt_tokens)
        for i, e in enumerate(exports)
    ]
    fp32, bf16 = run_batch(bundle, sentences, "fp32"), run_batch(bundle, sentences, "bf16")
    continuous = [i for i, name in enumerate(STATISTICS) if not name.startswith("argmax")]
    for kind in KINDS:
        a, b = fp32.stats[kind], bf16.stats[kind]
        assert np.array_equal(np.isnan(a), np.isnan(b))
        assert 0 < np.nanmax(np.abs(a - b)[..., continuous]) < BF16_MAX_STATISTIC, kind
        # The argmax shares count rows: where two keys tie within bfloat16's rounding, a row's
        # largest weight can move, and the share jumps by 1 / rows. It happens, rarely.
        flips = np.abs(a - b)[..., [STATISTICS.index("argmax_previous"), STATISTICS.index("argmax_next")]] > 1e-6
        assert flips.mean() < 0.1, kind
        assert np.abs(fp32.divergences[kind] - bf16.divergences[kind]).max() < BF16_MAX_STATISTIC, kind


@pytest.mark.parametrize("numpy_log", [True, False], ids=["numpy", "torch"])
def test_the_divergences_logarithm_is_the_float64_one_to_float32_rounding(numpy_log, monkeypatch):
    """`_log` (numpy's float32 logarithm on a CPU with AVX-512, torch's elsewhere) against float64, from
    TINY-sized weights to 2, in place and not, each of the two."""
    from attnviz.atlas import stats
    from attnviz.atlas.stats import TINY, _log

    for capability, numpy_here in [("AVX512", True), ("AVX2", False), ("DEFAULT", False), ("NO AVX", False)]:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert stats._uses_numpy_log() is numpy_here, capability  # the processor decides, never a timing
    monkeypatch.setattr(stats, "_uses_numpy_log", lambda: numpy_log)
    x = torch.cat([torch.logspace(-30, math.log10(2), 5000), torch.rand(3, 4000).flatten() + TINY]).view(-1, 17000)
    out = torch.full_like(x, float("nan"))
    assert _log(x, out) is out
    exact = torch.log(x.double())  # float32 rounding: torch's own float32 logarithm is held to the same bound
    torch.testing.assert_close(torch.log(x).double(), exact, rtol=2e-7, atol=2e-8)
    torch.testing.assert_close(out.double(), exact, rtol=2e-7, atol=2e-8)
    own = torch.from_numpy(np.log(x.numpy())) if numpy_log else torch.log(x)
    torch.testing.assert_close(out, own, atol=0, rtol=0)  # the chosen logarithm's values, to the bit
    again = x.clone()
    _log(again, again)  # in place, as nowhere in the engine but allowed
    torch.testing.assert_close(again, out, atol=0, rtol=0)
    wide = torch.rand(4, 5, dtype=torch.float64) + 0.5  # not float32: torch's own logarithm
    torch.testing.assert_close(_log(wide, torch.empty_like(wide)), torch.log(wide), atol=0, rtol=0)
