"""Exception classes: one per canonical error code of the runtime.

Each class subclasses :class:`ColocatedError` and the builtin exception that fits
(``InvalidArgumentError`` is a ``ValueError``, ``DeadlineExceededError`` a
``TimeoutError``, ...), so ``except ValueError`` keeps working for code ported
from JAX. ``err.code`` is the lower-case code name (``"invalid_argument"``).
"""

from __future__ import annotations

__all__ = [
    "AlreadyExistsError",
    "CancelledError",
    "ColocatedError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "RemoteError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
]


class ColocatedError(Exception):
    """Base class of every error the runtime raises; ``.code`` names the code."""

    code: str = "unknown"


class CancelledError(ColocatedError):
    """The operation was cancelled."""

    code = "cancelled"


class InvalidArgumentError(ColocatedError, ValueError):
    """An argument is invalid, whatever the state of the system."""

    code = "invalid_argument"


class DeadlineExceededError(ColocatedError, TimeoutError):
    """A deadline passed before the operation completed."""

    code = "deadline_exceeded"


class NotFoundError(ColocatedError, LookupError):
    """A named entity (device, function, ...) does not exist."""

    code = "not_found"


class AlreadyExistsError(ColocatedError):
    """The entity to create already exists."""

    code = "already_exists"


class PermissionDeniedError(ColocatedError, PermissionError):
    """The caller may not perform the operation."""

    code = "permission_denied"


class ResourceExhaustedError(ColocatedError, MemoryError):
    """A resource (memory, quota) is exhausted."""

    code = "resource_exhausted"


class FailedPreconditionError(ColocatedError, RuntimeError):
    """The system is not in the state the operation needs (e.g. a deleted array)."""

    code = "failed_precondition"


class UnimplementedError(ColocatedError, NotImplementedError):
    """The operation is not implemented or not supported."""

    code = "unimplemented"


class InternalError(ColocatedError, RuntimeError):
    """An invariant broke inside the runtime."""

    code = "internal"


class UnavailableError(ColocatedError, ConnectionError):
    """A host or link is unavailable."""

    code = "unavailable"


class UnauthenticatedError(ColocatedError, PermissionError):
    """The request carries no valid credentials."""

    code = "unauthenticated"


class RemoteError(ColocatedError):
    """User code failed on a host; ``.remote_traceback`` is the text it left there.

    ``.code`` is the code the runtime reported for the failure.
    """

    def __init__(self, message: str, code: str = "internal", remote_traceback: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        text = super().__str__()
        if self.remote_traceback:
            return f"{text}\n\nRemote traceback:\n{self.remote_traceback}"
        return text


_BY_CODE: dict[str, type[ColocatedError]] = {
    cls.code: cls
    for cls in (
        CancelledError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        UnauthenticatedError,
    )
}


def _from_core(code: str, message: str, remote_traceback: str | None) -> ColocatedError:
    """The exception for a core error (called by the native module)."""
    if remote_traceback is not None:
        return RemoteError(message, code, remote_traceback)
    cls = _BY_CODE.get(code)
    if cls is None:
        err = ColocatedError(message)
        err.code = code
        return err
    return cls(message)
