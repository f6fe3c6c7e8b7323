"""Running a built server until SIGTERM or SIGINT, then draining it.

``serve`` runs a server (``server.build_server``) until a stop signal and then drains it;
``stop_signals`` handles the signals from before a service starts, so a stop while it starts
(loads its model, starts its engine) is a clean stop too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterator

from epd.common.server import EpdServer

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """SIGTERM and SIGINT over a service's whole life, from before it starts (loads its model,
    starts its engine): a signal while it starts is remembered and ``serve`` drains at once, so
    what the start made (an engine's child processes) is closed as on any stop; a second signal
    while it starts ends the process as the signal would have; once serving, a second signal
    stops without the drain's grace."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.server: EpdServer | None = None
        self._stopping_now: list[asyncio.Task[None]] = []  # NOTE: held so it is not collected

    def on_signal(self, signum: int) -> None:
        """The handler of ``signum`` (installed by ``stop_signals``)."""
        if not self.requested.is_set():
            if self.server is None:
                logger.warning(
                    "%s while starting: stopping once started (again to stop now)",
                    signal.Signals(signum).name,
                )
            self.requested.set()
        elif self.server is None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        elif not self._stopping_now:
            logger.warning("second signal: stopping without grace")
            self._stopping_now.append(
                asyncio.get_running_loop().create_task(self.server.stop_now())
            )


@contextlib.contextmanager
def stop_signals() -> Iterator[StopSignals]:
    """Handle SIGTERM and SIGINT on the running loop (``StopSignals``) until the block ends."""
    loop = asyncio.get_running_loop()
    stop = StopSignals()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.on_signal, sig)
    try:
        yield stop
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def serve(server: EpdServer, stop: StopSignals | None = None) -> None:
    """Run until a stop signal (``stop``'s, or SIGTERM/SIGINT handled from now on) or until the
    server stops, then drain. A second signal stops now."""
    if stop is None:
        with stop_signals() as own:
            await serve(server, own)
        return
    stop.server = server
    waiter = asyncio.ensure_future(stop.requested.wait())
    terminated = asyncio.ensure_future(server.wait_for_termination())
    await asyncio.wait({waiter, terminated}, return_when=asyncio.FIRST_COMPLETED)
    if stop.requested.is_set():
        logger.info("signal received: draining")
        await server.drain_and_stop()
    waiter.cancel()
    await terminated
