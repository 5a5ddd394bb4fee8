"""Errors raised by mechanisms. ``service.problems`` maps each to a problem type.

Messages may quote the request and the public schema, never the data.
"""


class MechanismError(ValueError):
    """Base class of mechanism errors."""


class InvalidParameters(MechanismError):
    """The request's parameters are invalid for this mechanism and domain (before any charge)."""


class PaperModeDisabled(MechanismError):
    """A paper-mode mechanism was requested on a dataset whose owner has not enabled it."""


class ReleaseFailed(MechanismError):
    """The mechanism failed after touching data. The message is generic by construction."""

    def __init__(self) -> None:
        super().__init__("release failed")
