"""``epd route``: run the public entry point."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from epd.common.options import field_default
from epd.common.server import ServerOptions, serve, stop_signals
from epd.common.server_cli import add_server_arguments, pin_to_cpus, server_options
from epd.common.telemetry_cli import add_telemetry_arguments, configure_from_args
from epd.scheduler.cli import DEFAULT_PORT as SCHEDULER_PORT
from epd.server.media.media_cli import add_media_arguments, media_policy
from epd.server.models.model_cli import add_model_arguments, resolve_model_arguments
from epd.server.route.app import RouteConfig, build_route_server
from epd.server.route.http_guard import HttpOptions, MiB
from epd.server.route.request_check import RequestLimits
from epd.server.transfer.transfer_cli import add_transfer_arguments, transfer_options

DEFAULT_PORT = 50050
DEFAULT_SCHEDULER = f"127.0.0.1:{SCHEDULER_PORT}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Route flags, then media, host id, server and telemetry flags."""
    env = os.environ.get
    add_model_arguments(parser, required=True, what="tokenizer, chat template, processor settings")
    parser.add_argument(
        "--model-id",
        default=field_default(RouteConfig, "model_id"),
        help="model name the workers registered (default: the hub id, or the directory name)",
    )
    parser.add_argument(
        "--scheduler",
        default=env("EPD_SCHEDULER", DEFAULT_SCHEDULER),
        help=f"scheduler host:port (env EPD_SCHEDULER; default {DEFAULT_SCHEDULER})",
    )
    fallback_s = field_default(RouteConfig, "scheduler_fallback_s")
    parser.add_argument(
        "--scheduler-fallback-s",
        type=float,
        default=float(env("EPD_SCHEDULER_FALLBACK_S", fallback_s)),
        help="while the scheduler cannot be reached, route from its last listing of the "
        "workers (health-checked every second, round robin) for up to this many seconds after "
        "it was fetched; then fail UNAVAILABLE; 0 = never (env EPD_SCHEDULER_FALLBACK_S; "
        f"default {fallback_s:g})",
    )
    http_port = env("EPD_HTTP_PORT")
    parser.add_argument(
        "--http-port",
        type=int,
        default=int(http_port) if http_port else None,
        help="also serve OpenAI-compatible HTTP (/v1/chat/completions, /v1/models, "
        "/health) on this port, 0 = a free one (env EPD_HTTP_PORT; default: "
        "off)",
    )
    max_resumptions = field_default(RouteConfig, "max_resumptions")
    parser.add_argument(
        "--max-resumptions",
        type=int,
        default=int(env("EPD_MAX_RESUMPTIONS", max_resumptions)),
        help="times one request's stream may move to another replica when the worker streaming "
        "it dies or drains mid-stream (the new one continues after the tokens already sent); 0: "
        f"such a failure ends the stream (env EPD_MAX_RESUMPTIONS; default {max_resumptions})",
    )
    add_http_arguments(parser)
    add_media_arguments(parser)
    add_transfer_arguments(parser, shm=False, nixl=False)
    add_server_arguments(parser, default_port=DEFAULT_PORT)
    add_telemetry_arguments(parser)


def add_http_arguments(parser: argparse.ArgumentParser) -> None:
    """Limits of the OpenAI HTTP port and of one request (those hold for gRPC too).
    Token and TLS are the server group's: --auth-token and --tls-* cover both ports."""
    env = os.environ.get
    http, limits = HttpOptions(), RequestLimits()
    group = parser.add_argument_group("OpenAI HTTP port and request limits")
    group.add_argument(
        "--http-max-body-mb",
        type=float,
        default=float(env("EPD_HTTP_MAX_BODY_MB", http.max_body_bytes / MiB)),
        help="largest request body, in MiB; larger ones get 413 (env EPD_HTTP_MAX_BODY_MB; "
        f"default {http.max_body_bytes / MiB:g}: a few images at the media size limit)",
    )
    group.add_argument(
        "--http-max-json-values",
        type=int,
        default=int(env("EPD_HTTP_MAX_JSON_VALUES", http.max_json_values)),
        help="most JSON values (numbers, strings, arrays, objects) in one body, counted before "
        f"parsing (env EPD_HTTP_MAX_JSON_VALUES; default {http.max_json_values})",
    )
    group.add_argument(
        "--http-header-timeout-s",
        type=float,
        default=float(env("EPD_HTTP_HEADER_TIMEOUT_S", http.header_timeout_s)),
        help="seconds from a request's first byte to the end of its headers; slower clients get "
        f"408 and are closed (env EPD_HTTP_HEADER_TIMEOUT_S; default {http.header_timeout_s:g})",
    )
    group.add_argument(
        "--http-body-timeout-s",
        type=float,
        default=float(env("EPD_HTTP_BODY_TIMEOUT_S", http.body_timeout_s)),
        help="seconds a request's body may take to arrive (env EPD_HTTP_BODY_TIMEOUT_S; "
        f"default {http.body_timeout_s:g})",
    )
    group.add_argument(
        "--http-idle-timeout-s",
        type=float,
        default=float(env("EPD_HTTP_IDLE_TIMEOUT_S", http.idle_timeout_s)),
        help="seconds a connection may sit without a request before it is closed "
        f"(env EPD_HTTP_IDLE_TIMEOUT_S; default {http.idle_timeout_s:g})",
    )
    group.add_argument(
        "--http-max-connections",
        type=int,
        default=int(env("EPD_HTTP_MAX_CONNECTIONS", http.max_connections)),
        help="open connections the HTTP port holds; more are answered 503 and closed "
        f"(env EPD_HTTP_MAX_CONNECTIONS; default {http.max_connections})",
    )
    group.add_argument(
        "--http-request-timeout-s",
        type=float,
        default=float(env("EPD_HTTP_REQUEST_TIMEOUT_S", http.request_timeout_s)),
        help="time limit of one chat completion, streaming included (env "
        f"EPD_HTTP_REQUEST_TIMEOUT_S; default {http.request_timeout_s:g})",
    )
    group.add_argument(
        "--max-prompt-chars",
        type=int,
        default=int(env("EPD_MAX_PROMPT_CHARS", limits.max_prompt_chars)),
        help="text characters one request's messages may hold, refused before tokenising, "
        f"over HTTP and gRPC (env EPD_MAX_PROMPT_CHARS; default {limits.max_prompt_chars})",
    )
    group.add_argument(
        "--max-images",
        type=int,
        default=int(env("EPD_MAX_IMAGES", limits.max_images)),
        help="images one request may hold, over HTTP and gRPC (env EPD_MAX_IMAGES; default "
        f"{limits.max_images})",
    )


def http_options(args: argparse.Namespace) -> HttpOptions:
    """HttpOptions from the flags of ``add_http_arguments`` (token and TLS are set later, from
    the server options)."""
    return HttpOptions(
        max_body_bytes=int(args.http_max_body_mb * MiB),
        max_json_values=args.http_max_json_values,
        header_timeout_s=args.http_header_timeout_s,
        body_timeout_s=args.http_body_timeout_s,
        idle_timeout_s=args.http_idle_timeout_s,
        max_connections=args.http_max_connections,
        request_timeout_s=args.http_request_timeout_s,
    )


def request_limits(args: argparse.Namespace) -> RequestLimits:
    """RequestLimits from the flags of ``add_http_arguments``."""
    if args.max_prompt_chars <= 0 or args.max_images < 0:
        raise ValueError("--max-prompt-chars must be positive and --max-images not negative")
    return RequestLimits(max_prompt_chars=args.max_prompt_chars, max_images=args.max_images)


def _fallback_s(seconds: float) -> float:
    if not seconds >= 0:
        raise ValueError(f"--scheduler-fallback-s must be 0 or more, not {seconds:g}")
    return seconds


def route_config(args: argparse.Namespace) -> RouteConfig:
    """The ``RouteConfig`` of the flags (``--model`` resolved by the caller); ValueError names
    a value out of range."""
    return RouteConfig(
        model_dir=args.model,
        scheduler=args.scheduler,
        model_id=args.model_id,
        media=media_policy(args),
        http_port=args.http_port,
        http=http_options(args),
        limits=request_limits(args),
        transfer=transfer_options(args),
        max_resumptions=args.max_resumptions,
        scheduler_fallback_s=_fallback_s(args.scheduler_fallback_s),
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
        print(f"epd route: {e}", file=sys.stderr)
        return 2
    configure_from_args("epd-route", args)
    return asyncio.run(_serve(config, options))


async def _serve(config: RouteConfig, options: ServerOptions) -> int:
    with stop_signals() as stop:
        app = await build_route_server(config, options)
        http = ""
        if app.http:
            http = f", OpenAI HTTP on {app.http.scheme}://{options.host}:{app.http.port}/v1"
        print(f"epd route listening on {options.host}:{app.port}{http}", flush=True)
        await serve(app.server, stop)
    await app.router.peers.close()
    if app.router.plane is not None:
        app.router.plane.close()  # NOTE: unlinks the segments of the images' pixels
    return 0
