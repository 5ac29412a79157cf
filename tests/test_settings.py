"""The operator's numeric settings (attnviz.settings): each read the one way, and a bad value never an error."""

from __future__ import annotations

import logging

import pytest

from attnviz import buffers, settings
from attnviz.app import budget, cache


@pytest.mark.parametrize(
    "text, whole, expected",
    [
        (None, False, 5.0),
        ("", False, 5.0),
        (" 7.5 ", False, 7.5),
        ("2", True, 2),
        ("1e4", True, 100),  # over the bound
        ("50.0", True, 50),
        ("0.5", True, 5),  # not whole: int(0.5) had been 0
        ("inf", False, 5.0),  # float("inf") had raised OverflowError in int()
        ("-inf", False, 5.0),
        ("nan", False, 5.0),
        ("-2", False, 5.0),
        ("1e999", False, 5.0),
        ("many", True, 5),
        ("0x10", True, 5),
    ],
)
def test_a_setting_is_its_value_its_default_or_its_bound(monkeypatch, text, whole, expected):
    if text is None:
        monkeypatch.delenv("ATTNVIZ_TEST_SETTING", raising=False)
    else:
        monkeypatch.setenv("ATTNVIZ_TEST_SETTING", text)
    got = settings.number_setting("ATTNVIZ_TEST_SETTING", 5, 1, 100, whole=whole)
    assert got == expected and type(got) is type(expected)


def test_a_replaced_value_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(settings, "_said", set())
    monkeypatch.setenv("ATTNVIZ_TEST_ONCE", "lots")
    with caplog.at_level(logging.WARNING, logger="attnviz.settings"):
        for _ in range(3):
            settings.number_setting("ATTNVIZ_TEST_ONCE", 5, 1, 100)
    assert caplog.text.count("ATTNVIZ_TEST_ONCE='lots' is not a finite number of at least 1: 5 is used") == 1


@pytest.mark.parametrize("text", ["inf", "-5", "nan", "1e400"])
def test_the_memory_budgets_stay_their_defaults_on_a_bad_value(monkeypatch, text):
    """ATTNVIZ_CACHE_MB=inf had failed every page with an OverflowError, and -5 had cached nothing."""
    monkeypatch.setenv("ATTNVIZ_CACHE_MB", text)
    monkeypatch.setenv("ATTNVIZ_MAP_POOL_MB", text)
    assert budget.budget_bytes() == budget.DEFAULT_MB * 2**20
    assert buffers.keep_bytes() == buffers.DEFAULT_MB * 2**20
    monkeypatch.setenv("ATTNVIZ_CACHE_MB", "0.5")
    assert budget.budget_bytes() == 2**19


def test_the_text_limits_take_a_whole_number_written_as_one(monkeypatch):
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", "1e4")  # had been the default, 8192
    assert cache._int_setting("ATTNVIZ_MAX_TOKENS", cache.MAX_TOKENS) == 10_000
    monkeypatch.setenv("ATTNVIZ_MAX_TOKENS", "0")  # had been 1
    assert cache._int_setting("ATTNVIZ_MAX_TOKENS", cache.MAX_TOKENS) == cache.MAX_TOKENS
