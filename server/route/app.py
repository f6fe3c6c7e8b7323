"""Assemble a route server."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from epd.common.flags import flag
from epd.common.metrics import new_registry
from epd.common.server import EpdServer, ServerOptions, ServiceBinding, build_server
from epd.server.media.grid import ImageGridder
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_planner import VideoPlanner
from epd.server.route.http_guard import HttpOptions
from epd.server.route.media import DEFAULT_CHUNK_PATCHES
from epd.server.route.metrics import RouteMetrics
from epd.server.route.openai_http import OpenAiHttp
from epd.server.route.peers import Peers
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request_check import RequestLimits
from epd.server.route.resumption import DEFAULT_MAX_RESUMPTIONS
from epd.server.route.router import Router
from epd.server.route.sampling import IS_VLLM_INSTALLED, generation_defaults
from epd.server.route.scheduler_fallback import DEFAULT_FALLBACK_S
from epd.server.route.servicer import RouteServicer
from epd.server.route.tools import ToolCalling, ToolOptions, parser_class
from epd.server.transfer.options import TransferOptions
from epd.server.transfer.plane import DataPlane
from epd.v1 import route_service_pb2_grpc as pb_grpc

SERVICE_NAME = "epd.v1.RouteService"


@dataclass
class RouteConfig:
    """What the route needs: the model's tokenizer and processor settings, the scheduler."""

    model_dir: Path
    # NOTE: epd route's flag defaults to the scheduler on this host (common.ports).
    scheduler: str = field(metadata=flag("scheduler host:port", env="EPD_SCHEDULER"))
    model_id: str = field(
        default="",
        metadata=flag(
            "model name the workers registered",
            default_help="default: the hub id, or the directory name",
            aliases=("served-model-name",),
        ),
    )
    chat_template: str | None = field(
        default=None,
        metadata=flag(
            "chat template used instead of the model's: a file, or the Jinja template itself "
            "(as vLLM's --chat-template); it must render each image part as the model's image "
            "placeholder",
            env="EPD_CHAT_TEMPLATE",
            default_help="default: the model's own",
        ),
    )
    media: MediaPolicy = field(default_factory=MediaPolicy)
    http_port: int | None = field(
        default=None,
        metadata=flag(
            "also serve OpenAI-compatible HTTP (/v1/chat/completions, /v1/models, /health) on "
            "this port, 0 = a free one",
            env="EPD_HTTP_PORT",
            default_help="default: off",
        ),
    )
    http: HttpOptions = field(default_factory=HttpOptions)
    tools: ToolOptions = field(default_factory=ToolOptions)
    limits: RequestLimits = field(default_factory=RequestLimits)
    transfer: TransferOptions = field(default_factory=TransferOptions)
    max_resumptions: int = field(
        default=DEFAULT_MAX_RESUMPTIONS,
        metadata=flag(
            "times one request's stream may move to another replica when the worker streaming "
            "it dies or drains mid-stream (the new one continues after the tokens already "
            "sent); 0: such a failure ends the stream",
            env="EPD_MAX_RESUMPTIONS",
        ),
    )
    video_chunk_patches: int = field(
        default=DEFAULT_CHUNK_PATCHES,
        metadata=flag(
            "temporal patches of a video encoded as one item: a clip is cut into chunks of this "
            "many, which the scheduler spreads over the encoders like images, each cached by "
            "its own content",
            env="EPD_VIDEO_CHUNK_PATCHES",
        ),
    )
    scheduler_fallback_s: float = field(
        default=DEFAULT_FALLBACK_S,
        metadata=flag(
            "while the scheduler cannot be reached, route from its last listing of the workers "
            "(health-checked every second, round robin) for up to this many seconds after it "
            "was fetched; then fail UNAVAILABLE; 0 = never",
            env="EPD_SCHEDULER_FALLBACK_S",
        ),
    )

    def __post_init__(self) -> None:
        if self.video_chunk_patches < 1:
            raise ValueError("--video-chunk-patches must be at least 1")


@dataclass
class RouteApp:
    """A running route server."""

    server: EpdServer
    port: int
    router: Router
    http: OpenAiHttp | None = None

    async def stop(self, grace: float | None = 0) -> None:
        """Stop HTTP, drain gRPC, close channels."""
        if self.http is not None:
            await self.http.stop()
        await self.server.drain_and_stop(grace)
        await self.router.peers.close()
        if self.router.plane is not None:
            self.router.plane.close()


async def build_route_server(config: RouteConfig, options: ServerOptions | None = None) -> RouteApp:
    """Start a route for ``config.model_dir`` talking to ``config.scheduler``."""
    options = options or ServerOptions()
    model_id = config.model_id or config.model_dir.name
    loader = MediaLoader.for_model(config.media, config.model_dir, model_id=model_id)
    # NOTE: shared memory only: the pixels are for encoders on this host; others load the source.
    plane = DataPlane.from_options(config.transfer, kinds=("shm",))
    plane.start_reaper()
    prompts = PromptBuilder(config.model_dir, config.chat_template)
    # NOTE: before any port opens: a parser the tokenizer cannot serve is a ValueError
    calling = _tool_calling(config.tools, prompts.tokenizer, model_id)
    # NOTE: one set of limits for both doors: gRPC and HTTP judge a request alike.
    limits = config.limits.with_context(prompts.max_context_tokens)
    registry = new_registry() if options.exports_metrics else None
    metrics = None if registry is None else RouteMetrics(registry, loader=loader, plane=plane)
    peers = Peers(
        config.scheduler,
        options.auth_token,
        keepalive_s=options.keepalive_s,
        scheduler_fallback_s=config.scheduler_fallback_s,
        metrics=metrics,
    )
    peers.start()
    router = Router(
        peers,
        prompts,
        loader,
        model_id=model_id,
        host_id=plane.host_id,
        grids=ImageGridder(config.model_dir),
        plane=plane,
        metrics=metrics,
        max_resumptions=config.max_resumptions,
        videos=VideoLoader(VideoPlanner(config.model_dir, model_id), config.media),
        video_chunk_patches=config.video_chunk_patches,
    )
    trusted = config.tools.trust_request_chat_template
    servicer = RouteServicer(
        router,
        limits,
        has_tenants=bool(options.auth_token),
        tools=calling,
        trust_chat_template=trusted,
    )
    binding = ServiceBinding(SERVICE_NAME, servicer, pb_grpc.add_RouteServiceServicer_to_server)
    server, port = await build_server([binding], options, registry)
    http = None
    if config.http_port is not None:
        http = await _open_http(config, config.http_port, options, router, limits, calling)
        server.add_drain_callback(http.start_draining)
    await server.mark_serving()
    return RouteApp(server, port, router, http)


async def _open_http(
    config: RouteConfig,
    http_port: int,
    options: ServerOptions,
    router: Router,
    limits: RequestLimits,
    calling: ToolCalling | None,
) -> OpenAiHttp:
    """The OpenAI door on ``http_port``, serving through ``router``."""
    if not IS_VLLM_INSTALLED:
        raise ValueError(
            "--http-port: the OpenAI door parses bodies with vLLM's own request models; "
            "install vLLM, or serve gRPC alone (no --http-port)"
        )
    defaults = generation_defaults(config.model_dir)
    secured = _secured_like(config.http, options)
    trusted = config.tools.trust_request_chat_template
    http = OpenAiHttp(router, secured, limits, defaults, calling, trusted)
    await http.start(options.host, http_port)
    return http


def _tool_calling(options: ToolOptions, tokenizer: Any, model_id: str) -> ToolCalling | None:
    """The route's parsers, which both doors use (None: none configured, and a request
    without tools takes the plain path)."""
    parser_cls = parser_class(options, tokenizer, model_id)
    if parser_cls is None:
        return None
    return ToolCalling(parser_cls, options.enable_auto_tool_choice, tokenizer)


def _secured_like(http: HttpOptions, options: ServerOptions) -> HttpOptions:
    """The HTTP port takes the gRPC port's token and TLS settings: one is never open while the
    other is closed. ValueError for tenant tokens without the deployment's token."""
    if http.tenant_tokens_file and not options.auth_token:
        raise ValueError("--tenant-tokens-file needs --auth-token (the deployment's own)")
    return replace(http, auth_token=options.auth_token, tls=options.tls)
