"""A request's deadline, handed to every hop as that hop's own timeout."""

from __future__ import annotations

import time

from epd.common.errors import DeadlineExceeded


class Deadline:
    """The time left of a request, handed to every hop as its own timeout."""

    def __init__(self, timeout_s: float | None) -> None:
        self._end = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining(self) -> float | None:
        """Seconds left (None: no deadline); DeadlineExceeded once it has passed."""
        if self._end is None:
            return None
        left = self._end - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("the request's deadline passed", reason="DEADLINE_EXCEEDED")
        return left
