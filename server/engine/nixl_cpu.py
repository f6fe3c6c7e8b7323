"""vLLM's NixlConnector without NIXL's busy-polling progress thread (for CPU-only hosts).

NIXL's UCX backend starts a progress thread that polls with a zero timeout (nixl 1.5.1 hard-codes
``pthrDelay = 0``): it keeps one core busy for as long as the engine lives. On a 2-core machine
that made every engine step of a KV-transfer engine ~20x slower (measured: 16 tokens in ~6 s
instead of ~0.2 s). vLLM's connector progresses transfers itself: the consumer polls transfer
state and the producer polls notifications on every engine step, and on one host UCX reads the
producer's memory directly (cma), so the thread is not needed.

vLLM loads this module in its engine processes through ``kv_connector_module_path``; importing it
swaps the agent factory the NIXL worker uses. The connector class is vLLM's own.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector

__all__ = ["NixlConnector", "quiet_agent"]

_make_agent = base_worker.NixlWrapper


def quiet_agent(name: str, config: Any = None) -> Any:
    """A NIXL agent like vLLM's, with the progress thread turned off."""
    if config is not None:
        config.enable_pthread = False
    return _make_agent(name, config)


if _make_agent is not None and getattr(_make_agent, "__name__", "") != "quiet_agent":
    base_worker.NixlWrapper = quiet_agent
