"""Exceptions with messages for people: what was wrong and what to do about it."""


class AttnvizError(Exception):
    """Base class: every error attnviz raises on purpose is one of these."""


class ConfigError(AttnvizError, ValueError):
    """A model config is invalid."""


class CheckpointError(AttnvizError):
    """A checkpoint directory is missing, incomplete, corrupt or not one attnviz can read."""


class InputError(AttnvizError, ValueError):
    """Text or ids the model cannot take (empty, too long, out of vocabulary range)."""


class DeviceError(AttnvizError):
    """The requested device does not exist on this machine."""


class AtlasError(AttnvizError):
    """A head-atlas folder that cannot be written or read: another run's, incomplete, or not an atlas."""
