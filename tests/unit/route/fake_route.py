"""The real RouteService (servicer, router, prompt, media rules) served over gRPC with in-memory
fakes behind it (``fakes``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from epd.common.server import EpdServer, ServerOptions, ServiceBinding, build_server
from epd.server.route.app import SERVICE_NAME
from epd.server.route.prompt import PromptBuilder
from epd.server.route.router import Router
from epd.server.route.servicer import RouteServicer
from epd.server.route.tools import ToolCalling, ToolOptions, parser_class
from epd.v1 import route_service_pb2_grpc
from tests.unit.route.fakes import FakeEngine, FakePeers, model_router


@dataclass
class FakeRoute:
    """A serving route over fakes and the pieces tests reach into."""

    server: EpdServer
    port: int
    router: Router
    prompts: PromptBuilder
    # the parsers both doors use (None: none)
    calling: ToolCalling | None = None


async def serve_route(
    model_dir: Path,
    peers: FakePeers,
    answer: str,
    options: ServerOptions,
    tools: ToolOptions | None = None,
) -> FakeRoute:
    """The route of ``model_dir``'s model over ``peers``, whose engine ``pd0`` answers the
    tokens of ``answer``, with ``tools``' parsers (None: none); SERVING."""
    prompts = PromptBuilder(model_dir)
    words = prompts.tokenizer(answer, add_special_tokens=False)["input_ids"]
    peers.engines["pd0"] = FakeEngine(tokens=list(words))
    router = model_router(peers, prompts, model_dir)
    calling = None
    if tools is not None:
        tokenizer = prompts.tokenizer
        parser_cls = parser_class(tools, tokenizer, "tiny")
        calling = ToolCalling(parser_cls, tools.enable_auto_tool_choice, tokenizer)
    binding = ServiceBinding(
        SERVICE_NAME,
        RouteServicer(router, tools=calling),
        route_service_pb2_grpc.add_RouteServiceServicer_to_server,
    )
    server, port = await build_server([binding], options)
    await server.mark_serving()
    return FakeRoute(server, port, router, prompts, calling)
