"""Exceptions with messages for people: what was wrong and what to do about it.

Every error carries two messages. ``str(e)`` is the full one, for the CLI, the API and the server
log: it may name files and quote what they hold. ``e.public`` is the one a visitor of a hosted app
sees: it never names a server path, lists a folder or echoes a value read from a file.
"""

from __future__ import annotations


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


class DeviceError(AttnvizError):
    """The requested device does not exist on this machine."""


class NonFiniteError(AttnvizError):
    """A computation gave NaN or infinity where a picture or an export would show numbers."""


class ExportError(AttnvizError):
    """An export file or atlas folder that is corrupt, foreign, or written by a newer attnviz."""


class AtlasError(AttnvizError):
    """A head-atlas folder that cannot be written or read: another run's, incomplete, or not an atlas."""
