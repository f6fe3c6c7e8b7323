"""An in-memory server stream, as the route's fake clients answer (no servers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from epd.common.errors import EpdError


class FakeStream:
    """A server stream: yields ``responses`` (the first once ``hold`` is set, if given), then
    raises ``error`` if set; records cancel()."""

    def __init__(
        self,
        responses: list[Any],
        error: EpdError | None = None,
        hold: asyncio.Event | None = None,
        linger: asyncio.Event | None = None,
    ) -> None:
        """``linger``: after the responses, the stream ends only once it is set."""
        self.responses = responses
        self.error = error
        self.hold = hold
        self.linger = linger
        self.is_cancelled = False
        self.num_yielded = 0
        self._iterator: AsyncIterator[Any] | None = None

    def cancel(self) -> bool:
        self.is_cancelled = True
        return True

    async def _iterate(self) -> AsyncIterator[Any]:
        if self.hold is not None:
            await self.hold.wait()
        for response in self.responses:
            await asyncio.sleep(0)
            self.num_yielded += 1
            yield response
        if self.linger is not None:
            await self.linger.wait()
        if self.error is not None:
            raise self.error

    def __aiter__(self) -> AsyncIterator[Any]:
        # NOTE: like a grpc call, iterating again goes on where the last iteration stopped.
        if self._iterator is None:
            self._iterator = self._iterate()
        return self._iterator
