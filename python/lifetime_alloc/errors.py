"""The package's exceptions.

Every error carries ``field`` (the input at fault: a column, a configuration key, a parameter)
and ``fix`` (what to change) when they are known; ``str(error)`` shows both.
Bad input is an :class:`InvalidInputError`, which is a :class:`ValueError`; a missing file is a
:class:`MissingFileError`, which is a :class:`FileNotFoundError`; an answer of a service that is an
RFC 9457 problem is a :class:`ServiceError` with the problem's fields, and a service that cannot be
reached is a :class:`ServiceUnavailableError`, which is a :class:`ConnectionError`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional


class LifetimeAllocError(Exception):
    """Base class of the package's errors: the message, the field at fault and the fix."""

    def __init__(self, message: str, *, field: Optional[str] = None, fix: Optional[str] = None) -> None:
        self.message = message
        self.field = field
        self.fix = fix
        text = message
        if field and f"`{field}`" not in text and not text.startswith(field):
            text = f"{field}: {text}"
        if fix:
            text = f"{text} (fix: {fix})"
        super().__init__(text)


class InvalidInputError(LifetimeAllocError, ValueError):
    """The input is wrong: a missing column, a wrong type, an unknown policy, a bad setting."""


class MissingFileError(LifetimeAllocError, FileNotFoundError):
    """A file or directory the call needs does not exist."""


class ServiceError(LifetimeAllocError):
    """A service answered with an error: its RFC 9457 problem body.

    ``status`` is the HTTP status, ``problem`` the whole body, ``errors`` its list of
    ``{"field": ..., "message": ...}`` entries (empty when it has none).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        problem: Optional[Dict[str, Any]] = None,
        field: Optional[str] = None,
        fix: Optional[str] = None,
    ) -> None:
        self.status = status
        self.problem: Dict[str, Any] = problem or {}
        self.errors: List[Dict[str, Any]] = list(self.problem.get("errors") or [])
        super().__init__(message, field=field, fix=fix)


class ServiceUnavailableError(LifetimeAllocError, ConnectionError):
    """The service could not be reached (refused, timed out, no such host)."""


__all__ = [
    "LifetimeAllocError",
    "InvalidInputError",
    "MissingFileError",
    "ServiceError",
    "ServiceUnavailableError",
]
