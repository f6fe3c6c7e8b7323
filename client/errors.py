"""The one exception family the SDK raises."""

from __future__ import annotations

import grpc

from epd.server.common.status import error_info


class EpdClientError(Exception):
    """A failed call: ``code`` is the gRPC status name, ``reason`` the ErrorInfo reason."""

    def __init__(self, message: str, *, code: str, reason: str,
                 metadata: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.metadata = dict(metadata or {})

    def __str__(self) -> str:
        return f"{self.code} ({self.reason}): {self.message}"

    @classmethod
    def from_rpc_error(cls, err: grpc.aio.AioRpcError) -> EpdClientError:
        """Wrap a failed gRPC call, reading its rich status."""
        info = error_info(err)
        return cls(err.details() or err.code().name, code=err.code().name,
                   reason=info.reason if info else err.code().name,
                   metadata=dict(info.metadata) if info else {})  # fmt: skip
