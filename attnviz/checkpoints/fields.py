"""A config.json's fields, each checked for type, finiteness and range before anything uses it.

Every importer reads its config through `Fields`: an integer must be a JSON integer (never a
boolean, a string or 64.5), a number must be finite, and each must lie in its range, or the
importer's ``fail`` says which key is wrong and what it holds, described by kind and size
(`attnviz.errors.describe`) rather than quoted. Only checked values reach arithmetic, so a
config cannot make attnviz multiply a string by a billion or allocate for a list. The limits an
operator sets (`attnviz.checkpoints.limits`) are applied to the model the fields describe.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

from attnviz.errors import CheckpointError, describe

# No field of a real config comes near this: larger integers are refused before any arithmetic.
MAX_INT = 2**31 - 1
# The longest context a config may claim (Llama 4 Scout's is 10,485,760); rotary models are read up
# to ATTNVIZ_MAX_POSITIONS of it, models with a table of positions must fit that limit.
MAX_CLAIMED_POSITIONS = 1 << 24
MAX_ID_LIST = 64  # token ids a key may list (Llama 3.1's eos_token_id lists 3)

Fail = Callable[[str], CheckpointError]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Fields:
    """The fields of one config.json object (``hf``), read with checks; ``fail`` makes the error."""

    def __init__(self, hf: dict, fail: Fail, where: str = ""):
        self.hf, self.fail, self.where = hf, fail, where  # where: a prefix for nested keys ("rope_parameters.")

    def _value(self, key: str, default: object, nullable: bool) -> tuple[object, bool]:
        """(the value, whether it is the default): a missing key, or null where allowed, is the default."""
        if key not in self.hf or (nullable and self.hf[key] is None):
            return default, True
        return self.hf[key], False

    def _refuse(self, key: str, wanted: str, value: object) -> CheckpointError:
        return self.fail(f'"{self.where}{key}" must be {wanted}, got {describe(value)}')

    def int(self, key: str, default: int | None, low: int = 1, high: int = MAX_INT, nullable: bool = False) -> int:
        """A whole number from ``low`` to ``high``; ``default`` when absent (or null, if ``nullable``)."""
        value, absent = self._value(key, default, nullable)
        if absent and value is None:
            return value
        if not _is_int(value) or not low <= value <= high:
            raise self._refuse(key, f"a whole number from {low:,} to {high:,}", value)
        return value

    def number(
        self, key: str, default: float | None, low: float, high: float, low_open: bool = False, nullable: bool = False
    ) -> float:
        """A finite number in [low, high] (or (low, high] with ``low_open``), as a float; ``default`` None: required."""
        value, _ = self._value(key, default, nullable)
        bracket = "(" if low_open else "["
        if (
            not _is_number(value)
            or not math.isfinite(value)
            or not (low < value if low_open else low <= value)
            or not value <= high
        ):
            raise self._refuse(key, f"a finite number in {bracket}{low:g}, {high:g}]", value)
        return float(value)

    def flag(self, key: str, default: bool, nullable: bool = True) -> bool:
        """A JSON true or false."""
        value, _ = self._value(key, default, nullable)
        if not isinstance(value, bool):
            raise self._refuse(key, "true or false", value)
        return value

    def choice(self, key: str, default: str, choices: Collection[str], nullable: bool = False) -> str:
        """A string among ``choices``: anything else is refused, naming the choices."""
        value, _ = self._value(key, default, nullable)
        if not isinstance(value, str) or value not in choices:
            raise self._refuse(key, f"one of {sorted(choices)}", value)
        return value

    def token_id(self, key: str, default: int | None, high: int = MAX_INT) -> int | None:
        """A token id: a whole number from 0, or the first of a list of them (Llama 3.1 lists several end
        tokens); ``default`` when absent or null."""
        value, absent = self._value(key, default, nullable=True)
        if absent:
            return value
        if isinstance(value, list):
            if not 0 < len(value) <= MAX_ID_LIST or not all(_is_int(i) and 0 <= i <= high for i in value):
                raise self._refuse(key, f"a token id, or a list of 1 to {MAX_ID_LIST} token ids", value)
            return value[0]
        if not _is_int(value) or not 0 <= value <= high:
            raise self._refuse(key, f"a token id (a whole number from 0 to {high:,})", value)
        return value

    def object(self, key: str) -> Fields | None:
        """The JSON object under ``key`` as Fields, or None when the key is absent or null."""
        value = self.hf.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self._refuse(key, "a JSON object", value)
        return Fields(value, self.fail, f"{self.where}{key}.")
