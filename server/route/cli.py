"""``epd route``: run the public entry point."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from epd.server.common.model_dir import require_model_dir
from epd.server.common.server import ServerOptions, serve
from epd.server.common.telemetry import add_telemetry_arguments, configure_from_args
from epd.server.media.policy import MediaPolicy
from epd.server.route.app import RouteConfig, build_route_server

DEFAULT_PORT = 50050


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Route flags, then media, server and telemetry flags."""
    env = os.environ.get
    parser.add_argument("--model", type=Path, required=True,
                        help="model directory (tokenizer, chat template, processor settings)")
    parser.add_argument("--model-id", default="",
                        help="model name the workers registered (default: the directory name)")
    parser.add_argument("--scheduler", default=env("EPD_SCHEDULER", "127.0.0.1:50051"),
                        help="scheduler host:port (env EPD_SCHEDULER; default 127.0.0.1:50051)")
    http_port = env("EPD_HTTP_PORT")
    parser.add_argument("--http-port", type=int, default=int(http_port) if http_port else None,
                        help="also serve OpenAI-compatible HTTP (/v1/chat/completions, /v1/models, "
                             "/health) on this port, 0 = a free one (env EPD_HTTP_PORT; default: "
                             "off)")  # fmt: skip
    parser.add_argument("--pull-embeddings", action=argparse.BooleanOptionalAction,
                        default=env("EPD_PULL_EMBEDDINGS", "0") == "1",
                        help="send the prompt to the prefill worker while the images are "
                             "encoded; the worker fetches each image's embeddings from its "
                             "encoder (handed over instead if that fails). Slower on a 2-core "
                             "CPU box, where the encoder's loop is busy with the tower; meant "
                             "for encoders with cores or a GPU to spare (env "
                             "EPD_PULL_EMBEDDINGS=1; default off: the route waits for the "
                             "encoders, then hands the embeddings over)")  # fmt: skip
    MediaPolicy.add_arguments(parser)
    ServerOptions.add_arguments(parser, default_port=DEFAULT_PORT)
    add_telemetry_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT."""
    try:
        require_model_dir(args.model)
        options = ServerOptions.from_args(args)
        config = RouteConfig(args.model, args.scheduler, args.model_id,
                             MediaPolicy.from_args(args), args.http_port,
                             pull_embeddings=args.pull_embeddings)  # fmt: skip
    except ValueError as e:
        print(f"epd route: {e}", file=sys.stderr)
        return 2
    configure_from_args("epd-route", args)
    return asyncio.run(_serve(config, options))


async def _serve(config: RouteConfig, options: ServerOptions) -> int:
    app = await build_route_server(config, options)
    http = f", OpenAI HTTP on http://{options.host}:{app.http.port}/v1" if app.http else ""
    print(f"epd route listening on {options.host}:{app.port}{http}", flush=True)
    await serve(app.server)
    await app.worker.peers.close()
    return 0
