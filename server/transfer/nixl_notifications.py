"""Notifications of the process's NIXL agent: sent from an outbox and received by polling, both on
one thread of ours that runs every $EPD_NIXL_POLL_INTERVAL_S (a millisecond).

NIXL's own progress thread polls without pause and takes a whole core; with torch's intra-op
threads beside it on a small machine, a 64 KiB copy took 20 ms instead of 5 us. A passive producer
must still make progress for peers to connect and for their notifications to arrive: this thread
does that, and sends what callers left in the outbox on its way.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

NotificationListener = Callable[[str, bytes], None]


class Notifications:
    """Outbox, listeners and the polling thread of one ``nixl_agent`` (thread-safe).

    ``poll_gate`` is held around each poll: polling takes NIXL's agent lock exclusively, and a
    writer waiting there holds back every transfer not yet started, so callers that must not be
    held back (striped READs) take turns with polls on the same gate."""

    def __init__(self, agent: Any, poll_gate: threading.Lock, *, interval_s: float,
                 threaded: bool) -> None:  # fmt: skip
        self._agent = agent
        self._poll_gate = poll_gate
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._listeners: list[NotificationListener] = []
        self._outbox: deque[tuple[str, bytes]] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="epd-nixl-progress")  # fmt: skip
            self._thread.start()

    def stop(self) -> None:
        """Stop the polling thread (idempotent); ``notify`` sends at once from then on."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.flush()
                self.poll()
            except Exception:  # NOTE: a listener's bug must not stop progress for every peer
                logger.exception("NIXL notification handling failed")

    def notify(self, agent_name: str, message: bytes) -> None:
        """Send ``message`` to ``agent_name`` within a polling interval, from the polling thread:
        the caller does not wait for it (a notification carried by a READ costs that READ ~9 us
        more; waking the thread at once costs the caller as much in GIL handoffs). Sent at once
        where NIXL's own progress thread runs instead of ours, or once ours has stopped. A
        notification that cannot be sent (the peer is gone) is logged and dropped."""
        if self._thread is None or self._stop.is_set():
            self.send(agent_name, message)
            return
        self._outbox.append((agent_name, message))

    def flush(self) -> int:
        """Send every notification ``notify`` left; returns how many."""
        count = 0
        while self._outbox:
            try:
                agent_name, message = self._outbox.popleft()
            except IndexError:  # NOTE: another thread took the last one meanwhile
                break
            self.send(agent_name, message)
            count += 1
        return count

    def send(self, agent_name: str, message: bytes) -> None:
        """Send ``message`` now; a peer that cannot be reached is logged, not raised."""
        try:
            self._agent.send_notif(agent_name, message)
        except Exception as e:
            logger.warning("cannot notify NIXL agent %r (the lease expires instead): %s",
                           agent_name, e)  # fmt: skip

    def add_listener(self, listener: NotificationListener) -> None:
        """Call ``listener(peer_name, message)`` for each notification ``poll`` receives."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: NotificationListener) -> None:
        """Stop calling ``listener`` (unknown: no-op)."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def poll(self) -> int:
        """Deliver notifications that arrived since the last poll; returns how many."""
        with self._poll_gate:
            notifications = self._agent.get_new_notifs()
        with self._lock:
            listeners = list(self._listeners)
        count = 0
        for peer, messages in notifications.items():
            for message in messages:
                count += 1
                for listener in listeners:
                    listener(str(peer), bytes(message))
        return count
