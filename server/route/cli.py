"""``epd route``: run the public entry point."""

from __future__ import annotations

import argparse
import asyncio

from epd.common.flags import add_dataclass_arguments, from_arguments, refused
from epd.common.ports import LOCAL_SCHEDULER, ROUTE_PORT
from epd.common.server import ServerOptions
from epd.common.server_cli import add_server_arguments, pin_to_cpus, serve_announced, server_options
from epd.common.serving import stop_signals
from epd.common.telemetry_cli import add_telemetry_arguments, configure_from_args
from epd.server.media.media_cli import add_media_arguments, media_policy
from epd.server.models.model_cli import add_model_arguments, resolve_model_arguments
from epd.server.route.app import RouteConfig, build_route_server
from epd.server.route.http_guard import HttpOptions
from epd.server.route.prompt import load_chat_template
from epd.server.route.request_check import RequestLimits
from epd.server.route.tools import ToolOptions, check_tool_options
from epd.server.transfer.transfer_cli import add_transfer_arguments, transfer_options

DEFAULT_PORT = ROUTE_PORT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Route flags (``RouteConfig``'s fields declare them), then HTTP, media, host id, server
    and telemetry flags."""
    add_model_arguments(parser, required=True, what="tokenizer, chat template, processor settings")
    defaults = {"scheduler": LOCAL_SCHEDULER}
    add_dataclass_arguments(parser, RouteConfig, defaults=defaults)
    add_http_arguments(parser)
    add_media_arguments(parser)
    add_transfer_arguments(parser, shm=False, nixl=False)
    add_server_arguments(parser, default_port=DEFAULT_PORT)
    add_telemetry_arguments(parser)


def add_http_arguments(parser: argparse.ArgumentParser) -> None:
    """Limits of the OpenAI HTTP port and of one request (those hold for gRPC too), declared by
    ``HttpOptions``' and ``RequestLimits``' fields. Token and TLS are the server group's:
    --auth-token and --tls-* cover both ports."""
    group = parser.add_argument_group("OpenAI HTTP port and request limits")
    add_dataclass_arguments(group, HttpOptions)
    add_dataclass_arguments(group, RequestLimits)
    tools = parser.add_argument_group("OpenAI tool calling and reasoning (vllm serve's flags)")
    add_dataclass_arguments(tools, ToolOptions)


def request_limits(args: argparse.Namespace) -> RequestLimits:
    """RequestLimits from the flags of ``add_http_arguments``."""
    if args.max_prompt_chars <= 0 or args.max_images < 0:
        raise ValueError("--max-prompt-chars must be positive and --max-images not negative")
    return from_arguments(RequestLimits, args)


def _fallback_s(seconds: float) -> float:
    if not seconds >= 0:
        raise ValueError(f"--scheduler-fallback-s must be 0 or more, not {seconds:g}")
    return seconds


def route_config(args: argparse.Namespace) -> RouteConfig:
    """The ``RouteConfig`` of the flags (``--model`` resolved by the caller); ValueError names
    a value out of range."""
    _fallback_s(args.scheduler_fallback_s)
    return from_arguments(
        RouteConfig,
        args,
        model_dir=args.model,
        chat_template=load_chat_template(args.chat_template) if args.chat_template else None,
        media=media_policy(args),
        http=from_arguments(HttpOptions, args),
        tools=check_tool_options(from_arguments(ToolOptions, args)),
        limits=request_limits(args),
        transfer=transfer_options(args),
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT."""
    try:
        resolve_model_arguments(args)
        options = server_options(args)
        if args.max_resumptions < 0:
            raise ValueError("--max-resumptions must not be negative")
        pin_to_cpus(args)
        config = route_config(args)
    except ValueError as e:
        return refused("route", e)
    configure_from_args("epd-route", args)
    return asyncio.run(_serve(config, options))


async def _serve(config: RouteConfig, options: ServerOptions) -> int:
    with stop_signals() as stop:
        try:
            app = await build_route_server(config, options)
        except ValueError as e:  # NOTE: settings only the model can judge (--chat-template)
            return refused("route", e)
        http = ""
        if app.http:
            http = f", OpenAI HTTP on {app.http.scheme}://{options.host}:{app.http.port}/v1"
        await serve_announced("route", app.server, app.port, stop, host=options.host, detail=http)
    await app.router.peers.close()
    if app.router.plane is not None:
        app.router.plane.close()  # NOTE: unlinks the segments of the images' pixels
    return 0
