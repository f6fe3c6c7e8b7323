"""RouteService over gRPC: the public entry."""

from __future__ import annotations

from collections.abc import AsyncIterator

from epd.common.auth import AUTHORIZATION_KEY, bearer_token, token_identity
from epd.common.status import Context, handle_errors
from epd.server.route.choices import generate_choices
from epd.server.route.options_proto import add_options
from epd.server.route.reasoning_gate import gate_request
from epd.server.route.request import from_proto
from epd.server.route.request_check import RequestLimits, check_request
from epd.server.route.route_answers import responses
from epd.server.route.router import Router
from epd.server.route.tools import ToolCalling
from epd.server.route.tools_proto import add_tools
from epd.v1 import route_service_pb2 as pb
from epd.v1 import route_service_pb2_grpc as pb_grpc


class RouteServicer(pb_grpc.RouteServiceServicer):  # type: ignore[misc]
    """Thin adapter over ``Router``; deadlines propagate to every hop."""

    def __init__(
        self,
        router: Router,
        limits: RequestLimits | None = None,
        *,
        has_tenants: bool = False,
        tools: ToolCalling | None = None,
        trust_chat_template: bool = False,
    ) -> None:
        """``limits``: what one request may hold, as over HTTP (None: the defaults with the
        context of the router's model). ``has_tenants``: the server checks bearer tokens, and
        each token's requests get cache keys of their own (``ChatRequest.tenant``). ``tools``:
        the route's tool and reasoning parsers, as the OpenAI door's (None: none);
        ``trust_chat_template``: a request's chat_template_kwargs may name a chat template."""
        self.has_tenants = has_tenants
        self.router = router
        self.limits = limits or RequestLimits().with_context(router.prompts.max_context_tokens)
        self.tools = tools
        self.trust_chat_template = trust_chat_template

    @handle_errors
    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        chat = from_proto(request)
        add_tools(chat, request, self.tools, self.trust_chat_template)
        add_options(chat, request, self.limits.max_context_tokens)
        check_request(chat, self.limits)
        gate_request(chat, self.router.prompts)
        if self.has_tenants:
            chat.tenant = _tenant(context)
        choices = generate_choices(self.router, chat, timeout_s=context.time_remaining())
        async for response in responses(chat, choices):
            yield response

    @handle_errors
    async def ListModels(
        self, request: pb.ListModelsRequest, context: Context
    ) -> pb.ListModelsResponse:
        models = await self.router.list_models()
        cards = [pb.ModelCard(id=model, worker_counts=roles) for model, roles in models.items()]
        return pb.ListModelsResponse(models=cards)


def _tenant(context: Context) -> str:
    """The identity of the bearer token the call was authenticated with."""
    for key, value in context.invocation_metadata() or ():
        if key == AUTHORIZATION_KEY:
            text = value.decode() if isinstance(value, bytes) else value
            return token_identity(bearer_token(text))
    return ""
