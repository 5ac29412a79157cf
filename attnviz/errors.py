"""Exceptions with messages for people: what was wrong and what to do about it.

Every error carries two messages. ``str(e)`` is the full one, for the CLI, the API and the server
log: it may name files and quote what they hold. ``e.public`` is the one a visitor of a hosted app
sees: it never names a server path, lists a folder or echoes a value read from a file.
"""

from __future__ import annotations


def describe(value: object) -> str:
    """``value`` as a message may show it: a number or a short string as it is, anything else by its kind and size.

    A value read from a file is described before it is checked, so the description never grows with
    it: a string of a million characters is "a string of 1,000,000 characters", never the string.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return (
            str(value) if value.bit_length() <= 64 else f"an integer of about {value.bit_length() * 3 // 10:,} digits"
        )
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"a string of {len(value):,} characters"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value):,} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, dict):
        return f"an object of {len(value):,} key{'s' if len(value) != 1 else ''}"
    return f"a value of type {type(value).__name__}"


class AttnvizError(Exception):
    """Base class: every error attnviz raises on purpose is one of these."""

    default_public: str | None = None  # None: the full message is safe to show (it is about the visitor's input)

    def __init__(self, message: str, public: str | None = None):
        super().__init__(message)
        self.public = public or self.default_public or message

    def __reduce__(self):  # both messages survive a pickle: errors travel back from worker processes
        return type(self), (str(self), self.public)


class ConfigError(AttnvizError, ValueError):
    """A model config is invalid."""

    default_public = "the model's config is not valid"


class CheckpointError(AttnvizError):
    """A checkpoint directory is missing, incomplete, corrupt or not one attnviz can read."""

    default_public = "this folder is not a checkpoint attnviz can load"


class InputError(AttnvizError, ValueError):
    """Text or ids the model cannot take (empty, too long, out of vocabulary range)."""


class DeviceError(AttnvizError, ValueError):
    """The requested device does not exist on this machine.

    A ValueError, as InputError is: a device is an argument, and ``except ValueError`` catches every bad one.
    """


class NonFiniteError(AttnvizError):
    """A computation gave NaN or infinity where a picture or an export would show numbers."""


class ExportError(AttnvizError):
    """An export file or atlas folder that is corrupt, foreign, or written by a newer attnviz."""


class AtlasError(AttnvizError):
    """A head-atlas folder that cannot be written or read: another run's, incomplete, or not an atlas."""
