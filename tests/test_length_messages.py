"""A text longer than a model takes is refused in tokens, as its limit is: by the tokenizer, the CLI and the app.

A text of over 20 characters per token the model takes is refused before it is tokenised whole;
the message still counts tokens, those of its first characters, here counted again by hand (one
piece per letter for the `induction` model, whose pieces are the letters).
"""

from __future__ import annotations

import pytest

import attnviz
from attnviz.cli import main
from attnviz.errors import InputError

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def letters(n: int) -> str:
    return " ".join(LETTERS[i % 26] for i in range(n))


@pytest.fixture(scope="module")
def induction():
    return attnviz.load("induction", device="cpu")


def test_a_far_too_long_text_is_counted_in_tokens(induction):
    text = letters(4095)  # 8,189 characters, 128 for each of the 64 tokens the model takes
    most = 20 * induction.config.max_len
    by_hand = len(text[:most].split())  # one piece per letter
    with pytest.raises(InputError) as caught:
        induction.tokenizer.encode_source(text)
    message = str(caught.value)
    assert f"over {by_hand:,} tokens long" in message and "at most 64 tokens" in message, message
    assert f"has {len(text):,} characters" not in message


def test_a_text_just_over_the_limit_is_counted_exactly(induction):
    with pytest.raises(InputError, match=r"the prompt text is 71 tokens long; this model takes at most 64"):
        induction.tokenizer.encode_source(letters(70))  # <s> and 70 letters
    assert len(induction.tokenizer.encode_source(letters(63)).ids) == 64, "the limit itself is taken"


def test_a_text_of_pieces_too_long_to_count_says_why(induction):
    """Words the letter model does not know merge into one unknown piece: few tokens, but far too many characters."""
    text = " ".join(["qwertyuiopasdfghjklzxcvbnm"] * 60)
    with pytest.raises(InputError, match=r"too long: 1,619 characters, over 20 for each of the 64 tokens"):
        induction.tokenizer.encode_source(text)


def test_the_cli_says_it_in_tokens(capsys):
    assert main(["attention", "--model", "induction", "--src", letters(4095), "--out", "unused.npz"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "over 640 tokens long" in err and "at most 64 tokens" in err, err


@pytest.mark.slow
def test_the_app_says_it_in_tokens(fresh_streamlit_caches):
    from conftest import open_app

    at = open_app("pages/explorer.py", "induction")
    at.sidebar.text_area(key="src").set_value(letters(4095)).run()
    assert not at.exception, [e.value for e in at.exception]
    shown = " ".join(e.value for e in at.error)
    assert "over 640 tokens long" in shown and "at most 64 tokens" in shown, shown
