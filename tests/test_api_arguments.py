"""Bad arguments to the public API raise InputError naming the argument, never a deep error or a wrong result."""

from __future__ import annotations

import inspect

import pytest

import attnviz
from attnviz import InputError


@pytest.fixture(scope="module")
def reverse():
    return attnviz.load("reverse", device="cpu")


@pytest.fixture(scope="module")
def induction():
    return attnviz.load("induction", device="cpu")


@pytest.mark.parametrize("device", [1, b"cpu", ["cpu"]])
def test_a_device_that_is_not_text_is_refused(device):
    with pytest.raises(InputError, match="device must be"):
        attnviz.load("reverse", device=device)


@pytest.mark.parametrize("method", [["norm"], {"norm": 1}, 3])
def test_a_method_that_is_not_a_name_is_refused(reverse, method):
    with pytest.raises(InputError, match="method"):
        attnviz.attribute(reverse, "a b c", method=method)


@pytest.mark.parametrize("sentences", [5, 2.5, object()])
def test_sentences_that_are_not_a_list_are_refused(reverse, sentences):
    with pytest.raises(InputError, match="sentences must be a list of texts"):
        attnviz.head_importance(reverse, sentences)


def test_references_that_are_not_a_list_are_refused(reverse):
    with pytest.raises(InputError, match="references must be a list of texts"):
        attnviz.head_importance(reverse, ["a b c"], 5)


@pytest.mark.parametrize("flag", ["no", 1, None])
def test_words_must_be_true_or_false(reverse, induction, flag):
    with pytest.raises(InputError, match="words must be True or False"):
        attnviz.attention(reverse, "a b c", words=flag)
    with pytest.raises(InputError, match="words must be True or False"):
        attnviz.attribute(reverse, "a b c", words=flag)
    with pytest.raises(InputError, match="words must be True or False"):
        attnviz.compare_ablation(induction, "a b c a", "decoder:1.1", words=flag)


@pytest.mark.parametrize("flag", ["no", 0, None])
def test_rotated_must_be_true_or_false(reverse, flag):
    with pytest.raises(InputError, match="rotated must be True or False"):
        attnviz.queries_keys(reverse, "a b c", rotated=flag)


@pytest.mark.parametrize("sources", ["abc", b"abc", [b"abc"], ["abc", None], 5])
def test_an_atlas_of_sentences_that_are_not_a_list_of_texts_is_refused(sources):
    """One string had been read as its letters, each a sentence; bytes had been called "too long"."""
    bundle = attnviz.load("reverse", device="cpu")
    with pytest.raises(InputError, match="sources must be a list of texts"):
        attnviz.api.compute_atlas(bundle, sources)


@pytest.mark.parametrize("name", ["attention", "translate", "attribute", "forward_pass", "compute_atlas"])
@pytest.mark.parametrize("first", ["en-de", None, 3])
def test_a_model_name_or_anything_else_in_place_of_a_loaded_model_is_refused(name, first):
    """attnviz.attention("en-de", ...) had failed deep inside with "'str' object has no attribute 'config'"."""
    function = getattr(attnviz, name)
    with pytest.raises(InputError, match=rf"^{name} takes a loaded model first, not .*attnviz\.load"):
        function(first, "twenty-one")
    assert function.__name__ == name and "bundle" in str(inspect.signature(function)), "its signature, as documented"
