"""Domain errors shared by every service, with no grpc import.

Logic modules raise these; the one mapping in ``epd.common.status`` turns each into its
canonical gRPC status code with a ``google.rpc.ErrorInfo`` (``reason`` in UPPER_SNAKE, ``domain``
``epd``, ``metadata`` for machine-readable details). Any other exception becomes INTERNAL without
leaking its text to the caller.
"""

from __future__ import annotations

import enum


class Code(enum.Enum):
    """Canonical status codes used by epd (names match grpc.StatusCode)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    INTERNAL = "INTERNAL"


class EpdError(Exception):
    """Base of every error a service reports to its caller.

    ``message`` is for humans and must say what was wrong and, where possible, what to do;
    ``reason`` is a stable UPPER_SNAKE identifier for programs; ``metadata`` holds details.
    """

    code: Code = Code.INTERNAL
    default_reason: str = "INTERNAL"

    def __init__(
        self, message: str, *, reason: str | None = None, metadata: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata = dict(metadata or {})

    def __str__(self) -> str:
        return self.message


class InvalidArgument(EpdError):
    """The caller sent something that can never succeed as sent."""

    code = Code.INVALID_ARGUMENT
    default_reason = "INVALID_ARGUMENT"


class NotFound(EpdError):
    """A named thing (lease, handle, worker) does not exist or has expired."""

    code = Code.NOT_FOUND
    default_reason = "NOT_FOUND"


class AlreadyExists(EpdError):
    """A thing with that identity is already held by someone else."""

    code = Code.ALREADY_EXISTS
    default_reason = "ALREADY_EXISTS"


class FailedPrecondition(EpdError):
    """The request is valid but this server is not in a state to serve it (wrong mode, host)."""

    code = Code.FAILED_PRECONDITION
    default_reason = "FAILED_PRECONDITION"


class ResourceExhausted(EpdError):
    """A bounded queue or budget is full; retry later or elsewhere."""

    code = Code.RESOURCE_EXHAUSTED
    default_reason = "RESOURCE_EXHAUSTED"


class Unavailable(EpdError):
    """A peer is down or nothing can serve the request now; retryable."""

    code = Code.UNAVAILABLE
    default_reason = "UNAVAILABLE"


class DeadlineExceeded(EpdError):
    """The work did not finish within the caller's deadline."""

    code = Code.DEADLINE_EXCEEDED
    default_reason = "DEADLINE_EXCEEDED"


class Unimplemented(EpdError):
    """The server does not implement this (e.g. an RPC its mode does not serve)."""

    code = Code.UNIMPLEMENTED
    default_reason = "UNIMPLEMENTED"


class Internal(EpdError):
    """A bug or an unexpected failure inside the server."""

    code = Code.INTERNAL
    default_reason = "INTERNAL"


class Unauthenticated(EpdError):
    """The call carries no valid credentials."""

    code = Code.UNAUTHENTICATED
    default_reason = "UNAUTHENTICATED"


class Cancelled(EpdError):
    """The caller went away or cancelled the call."""

    code = Code.CANCELLED
    default_reason = "CANCELLED"
