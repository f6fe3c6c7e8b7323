"""Small asyncio helpers: calls run beside the request, and pairs of calls that stand or fall
together."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

A = TypeVar("A")
B = TypeVar("B")


class BackgroundCalls:
    """Calls nobody waits for (reports, releases), run off the request's critical path but not
    lost: ``settle`` waits for them, e.g. before closing channels."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self, call: Awaitable[Any]) -> asyncio.Future[Any]:
        """Run ``call``, which must handle its own errors, in the background; returns its task."""
        task = asyncio.ensure_future(call)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def settle(self) -> None:
        """Wait for every call started so far."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def retrieve_exception(task: asyncio.Task[Any]) -> None:
    """A done callback for a task that may end with nobody awaiting it (its callers cancelled, or
    a sibling failed first): its failure is retrieved, so asyncio does not log it as "never
    retrieved"."""
    if not task.cancelled():
        task.exception()


async def concurrently(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Both results; the first failure cancels the other one and is raised as it is."""
    first_result, second_result = await every([first, second])
    return first_result, second_result


async def every(awaitables: Sequence[Awaitable[Any]]) -> list[Any]:
    """All results in order; the first failure cancels the others and is raised as it is."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_awaited(awaitable)) for awaitable in awaitables]
    except BaseExceptionGroup as group_error:
        raise group_error.exceptions[0] from None
    return [task.result() for task in tasks]


async def _awaited(awaitable: Awaitable[A]) -> A:
    return await awaitable
