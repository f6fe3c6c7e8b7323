"""Watch the children of a deployment: a child that dies is reported in one line (service, pid,
exit code or signal, log) and then either restarted or the end of the deployment."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from epd.common.flags import flag
from epd.launch.launcher import Child, Deployment

T = TypeVar("T")


class ChildDied(RuntimeError):
    """A child of the deployment died (and is not restarted); the message says which and how."""


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """``max_restarts``: how many times one child is restarted (0: a dead child ends the
    deployment). ``interval_s``: how often children are checked."""

    max_restarts: int = field(
        default=3,
        metadata=flag(
            "with --keep: restarts of one service before the deployment stops; 0: the first "
            "death stops it"
        ),
    )
    interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts must be 0 or more, got {self.max_restarts}")


async def watch(
    deployment: Deployment,
    options: WatchOptions,
    report: Callable[[str], None] = print,
    on_restart: Callable[[Child], None] | None = None,
) -> NoReturn:
    """Check the children every ``interval_s``; restart a dead one (reporting it) while it has
    restarts left, else raise ChildDied."""
    while True:
        await asyncio.sleep(options.interval_s)
        dead = deployment.reap_dead()
        if given_up := [c for c in dead if c.num_restarts >= options.max_restarts]:
            raise ChildDied("\n".join(_gave_up(child, options) for child in given_up))
        for child in dead:
            count = f"{child.num_restarts + 1} of {options.max_restarts}"
            report(f"epd up: {child.describe_exit()}; restarting it ({count})")
            deployment.restart(child)
            if on_restart is not None:
                on_restart(child)


async def until_a_child_dies(
    deployment: Deployment, work: Coroutine[Any, Any, T], interval_s: float = 1.0
) -> T:
    """``work``'s result, unless a child dies first: then ``work`` is cancelled and ChildDied
    raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(watch(deployment, WatchOptions(0, interval_s)))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            watcher.result()  # NOTE: raises ChildDied
        result = task.result()
        if dead := deployment.reap_dead():  # NOTE: died while ``work`` finished (a failed request)
            raise ChildDied("\n".join(child.describe_exit() for child in dead))
        return result
    finally:
        for pending in (task, watcher):
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, ChildDied):
                await pending


def _gave_up(child: Child, options: WatchOptions) -> str:
    if not options.max_restarts:
        return child.describe_exit()
    return f"{child.describe_exit()}; gave up after {child.num_restarts} restarts"
