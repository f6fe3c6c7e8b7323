"""``epd store-holder``: lend the embedding store its memory (``holder.py``), until SIGTERM.

The service serves gRPC health (SERVING once it joined the store, NOT_SERVING while it leaves)
and, with ``--metrics-port``, its process's figures (``process_*``: the memory it lends shows in
``process_resident_memory_bytes`` as it fills). It leaves the store after the server stopped,
before the process ends.
"""

from __future__ import annotations

import argparse
import asyncio

from epd.common.advertise import advertised_host
from epd.common.flags import add_dataclass_arguments, from_arguments, refused
from epd.common.metrics import new_registry
from epd.common.server import EpdServer, ServerOptions, build_server
from epd.common.server_cli import add_server_arguments, pin_to_cpus, serve_announced, server_options
from epd.common.serving import stop_signals
from epd.common.telemetry_cli import add_telemetry_arguments, configure_from_args
from epd.server.store.holder import HolderConfig, SegmentHolder

# NOTE: beside the master's RPC, metadata and admin ports (deploy/helm values: 50090-50092).
DEFAULT_PORT = 50093


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Holder flags (``HolderConfig``'s fields declare them), then the shared server and
    telemetry flags."""
    add_dataclass_arguments(parser, HolderConfig)
    add_server_arguments(parser, default_port=DEFAULT_PORT)
    add_telemetry_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Hold the segment until SIGTERM/SIGINT; 2 for bad flags or a missing Mooncake."""
    try:
        config = from_arguments(HolderConfig, args)
        options = server_options(args)
        pin_to_cpus(args)
        host = advertised_host(options.host, options.advertise_host, config.store_master)
        holder = SegmentHolder(config.settings(host))
    except ValueError as e:
        return refused("store-holder", e)
    configure_from_args("epd-store-holder", args)
    return asyncio.run(_serve(options, holder))


async def _serve(options: ServerOptions, holder: SegmentHolder) -> int:
    with stop_signals() as stop:
        server, port = await build_server([], options, new_registry())
        serving = asyncio.ensure_future(_mark_serving_once_joined(server, holder))
        try:
            await serve_announced("store-holder", server, port, stop, host=options.host)
        finally:
            await holder.close()
            await serving
    return 0


async def _mark_serving_once_joined(server: EpdServer, holder: SegmentHolder) -> None:
    """SERVING once the holder joined (health ignores it once the server drains)."""
    if await holder.wait_joined(float("inf")):
        await server.mark_serving()
