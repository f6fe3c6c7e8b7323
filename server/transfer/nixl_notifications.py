"""Notifications of the process's NIXL agent, and the thread of ours that makes its progress.

The thread polls the agent every ``interval_s`` (a millisecond by default): each poll makes the
agent's progress (peers connecting, READs it serves over transports that need the target's
progress, such as UCX TCP) and delivers the notifications that arrived to the listeners. NIXL's
own progress thread does the same without pause and takes a whole core (see ``nixl_agent``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

NotificationListener = Callable[[str, bytes], None]


class Notifications:
    """Listeners and the polling thread of one ``nixl_agent`` (thread-safe)."""

    def __init__(self, agent: Any, *, interval_s: float, threaded: bool) -> None:
        self._agent = agent
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._listeners: list[NotificationListener] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._run, daemon=True, name="epd-nixl-progress")
            self._thread.start()

    def stop(self) -> None:
        """Stop the polling thread (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.poll()
            except Exception:  # NOTE: a listener's bug must not stop progress for every peer
                logger.exception("NIXL notification handling failed")

    def send(self, agent_name: str, message: bytes) -> None:
        """Send ``message`` now; a peer that cannot be reached is logged, not raised."""
        try:
            self._agent.send_notif(agent_name, message)
        except Exception as e:
            logger.warning(
                "cannot notify NIXL agent %r (the lease expires instead): %s", agent_name, e
            )

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
