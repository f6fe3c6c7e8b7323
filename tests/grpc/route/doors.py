"""Both doors of one route (the OpenAI HTTP port and gRPC ``RouteService``) over one Router
whose fake engine answers a set text, then its end of sequence."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from epd.common.server import EpdServer, ServiceBinding, build_server
from epd.server.route.app import SERVICE_NAME
from epd.server.route.http_guard import HttpOptions
from epd.server.route.openai_http import OpenAiHttp
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request_check import RequestLimits
from epd.server.route.servicer import RouteServicer
from epd.server.route.tools import ToolCalling, ToolOptions, parser_class
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import route_service_pb2 as pb
from epd.v1 import route_service_pb2_grpc as pb_grpc
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fake_stream import FakeStream
from tests.unit.route.fakes import FakePeers, model_router

CALL = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THOUGHT = "the sky is clear</think>It is sunny."
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}},
    "required": ["city"],
}
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "today's weather", "parameters": PARAMETERS},
}
QUESTION = [{"role": "user", "content": "weather in Paris?"}]
HERMES = ToolOptions(enable_auto_tool_choice=True, tool_call_parser="hermes")
DEEPSEEK = ToolOptions(reasoning_parser="deepseek_r1")


class StoppingEngine(FakeEngine):
    """A fake engine whose stream ends as a model's does at its end of sequence (STOP)."""

    def _stream(self, tokens: list[int], response_type: Callable[..., Any]) -> Any:
        stream = super()._stream(tokens, response_type)
        stream.responses[-1].finish_reason = generation_pb2.FINISH_REASON_STOP
        return stream


@dataclass
class Doors:
    """One route's two doors over one router, whose engine ``engine`` answers every request."""

    http_url: str
    grpc_endpoint: str
    engine: FakeEngine
    tokenizer: Any

    async def post(self, body: dict[str, Any]) -> tuple[int, str]:
        body = {"model": "tiny", "max_tokens": 64, "messages": QUESTION, **body}
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.http_url, json=body) as response,
        ):
            return response.status, await response.text()

    async def generate(self, **fields: Any) -> list[pb.GenerateResponse]:
        message = pb.ChatMessage(role="user", content=[pb.ContentPart(text="weather in Paris?")])
        fields.setdefault("messages", [message])
        request = pb.GenerateRequest(
            model="tiny", sampling=generation_pb2.SamplingParams(max_tokens=64), **fields
        )
        async with grpc.aio.insecure_channel(self.grpc_endpoint) as channel:
            stub = pb_grpc.RouteServiceStub(channel)
            return [response async for response in stub.Generate(request, timeout=20)]

    def last_call(self) -> Any:
        """The request the engine got last."""
        return self.engine.calls[-1][1]


async def open_doors(
    model_dir: Path, options: ToolOptions | None, answer: str
) -> tuple[Doors, OpenAiHttp, EpdServer]:
    """Both doors over one router whose engine answers ``answer``, then its end of sequence."""
    prompts = PromptBuilder(model_dir)
    tokenizer = prompts.tokenizer
    calling = None
    if options is not None:
        parser_cls = parser_class(options, tokenizer, "tiny")
        calling = ToolCalling(parser_cls, options.enable_auto_tool_choice, tokenizer)
    peers = FakePeers(FakeScheduler(encoders=["enc0"]))
    tokens = [*tokenizer(answer, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
    engine = peers.engines["pd0"] = StoppingEngine(tokens=tokens)
    router = model_router(peers, prompts, model_dir)
    limits = RequestLimits(max_context_tokens=prompts.max_context_tokens)
    servicer = RouteServicer(router, limits, tools=calling)
    binding = ServiceBinding(SERVICE_NAME, servicer, pb_grpc.add_RouteServiceServicer_to_server)
    server, port = await build_server([binding])
    await server.mark_serving()
    http = OpenAiHttp(router, HttpOptions(), limits, tools=calling)
    http_port = await http.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{http_port}/v1/chat/completions"
    return Doors(url, f"127.0.0.1:{port}", engine, tokenizer), http, server


OPENED = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "<think>the sky"},
]


class BeamEngine(StoppingEngine):
    """A fake engine answering each beam step with its one token and the step's most likely
    candidates (its tokens, in order), whose log probabilities grow with the prompt's length
    modulo 3 (so beams diverge)."""

    def PrefillDecode(self, request: Any, timeout: float | None = None) -> FakeStream:
        self.calls.append(("PrefillDecode", request))
        scale = 1 + 0.3 * (len(request.prompt.token_ids) % 3)
        found = [
            generation_pb2.Logprob(token_id=token, logprob=-(rank - 0.95) * scale, rank=rank)
            for rank, token in enumerate(self.tokens[: request.sampling.logprobs], 1)
        ]
        response = prefill_pb.PrefillDecodeResponse(
            token_ids=[found[0].token_id],
            finish_reason=generation_pb2.FINISH_REASON_LENGTH,
            logprobs=[generation_pb2.TokenLogprobs(candidates=found)],
        )
        response.usage.completion_tokens = 1
        return FakeStream([response], None)
