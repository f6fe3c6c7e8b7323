"""The one exception family the SDK raises: ``EpdClientError`` and a subclass per status code.

try:
    answer = client.generate([user("hi", image="cat.png")])
except InvalidRequest as e:      # bad input: fix the request
    print(e.reason, e.message)   # e.g. BAD_IMAGE "the image could not be decoded: ..."
except Unavailable:              # retry later
    ...
"""

from __future__ import annotations

import grpc

from epd.common.status import error_info


class EpdClientError(Exception):
    """A failed call: ``code`` is the gRPC status name (e.g. ``"INVALID_ARGUMENT"``), ``reason``
    the server's ErrorInfo reason in UPPER_SNAKE (e.g. ``"BAD_IMAGE"``; the code name when the
    server sent none), ``metadata`` the ErrorInfo details."""

    def __init__(
        self, message: str, *, code: str, reason: str, metadata: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.metadata = dict(metadata or {})

    def __str__(self) -> str:
        return f"{self.code} ({self.reason}): {self.message}"

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> EpdClientError:
        """Wrap a failed gRPC call (sync or async), reading its rich status; the subclass
        matches the status code."""
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else None
        info = error_info(err)
        error_class = _CLASSES.get(code, EpdClientError)
        return error_class(
            details or code.name,
            code=code.name,
            reason=info.reason if info else code.name,
            metadata=dict(info.metadata) if info else {},
        )


class InvalidRequest(EpdClientError):
    """The request is wrong (INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND): do not retry."""


class Unavailable(EpdClientError):
    """The deployment cannot serve now (UNAVAILABLE, RESOURCE_EXHAUSTED): retry with backoff."""


class DeadlineExceeded(EpdClientError):
    """The request's deadline passed before it completed."""


class Unauthenticated(EpdClientError):
    """The token is missing or wrong (UNAUTHENTICATED, PERMISSION_DENIED)."""


class Cancelled(EpdClientError):
    """The call was cancelled."""


_CLASSES: dict[grpc.StatusCode, type[EpdClientError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidRequest,
    grpc.StatusCode.NOT_FOUND: InvalidRequest,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRequest,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: Unauthenticated,
    grpc.StatusCode.CANCELLED: Cancelled,
}
