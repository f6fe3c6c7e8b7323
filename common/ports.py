"""The port each service listens on by default, shared by the command lines that start or call
them (``epd route`` calls the scheduler; ``epd up`` starts every service)."""

from __future__ import annotations

ROUTE_PORT = 50050
SCHEDULER_PORT = 50051
ENCODE_PORT = 50061
PREFILL_PORT = 50071
DECODE_PORT = 50081
# The scheduler a route on the same host calls when told none.
LOCAL_SCHEDULER = f"127.0.0.1:{SCHEDULER_PORT}"
