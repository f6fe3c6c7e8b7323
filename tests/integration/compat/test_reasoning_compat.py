"""Structured outputs on a reasoning model: ``vllm serve --reasoning-parser deepseek_r1`` and
epd (E/PD and E/P/D, the route and every engine started with the same parser) answer the same
bodies alike.

The model is the tiny one with ``<think>`` and ``</think>`` in its vocabulary. Its random weights
would hardly ever end their reasoning, so the bodies decide it: the assistant's turn is continued
after an opened ``<think>`` and ``thinking_token_budget`` makes the engine close the reasoning
after so many tokens (0: at once, on the prefill worker's first token), after which the grammar
holds; a prompt that closed its reasoning, or an answer that hides it (``include_reasoning``
false), is constrained from its first token. Engines that do not know the parser refuse the
budget, and constrain from the first token where vLLM lets the model reason."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from epd.common.roles import Role
from epd.launch.launcher import Deployment
from epd.scheduler.app import build_scheduler_server
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.server.route.tools import ToolOptions
from epd.v1 import generation_pb2
from epd.v1 import route_service_pb2 as pb
from epd.v1 import route_service_pb2_grpc as pb_grpc
from tests.integration.compat.vllm_serve.bodies import NAMED, TEXT, VERDICT
from tests.integration.compat.vllm_serve.exchange import choices, post, streamed
from tests.integration.compat.vllm_serve.servers import TOOL_FLAGS
from tests.integration.conftest import KV_CACHE_BYTES
from tests.integration.registered import until_registered
from tests.unit.scripts.loader import load

pytestmark = pytest.mark.vllm

PARSER = "deepseek_r1"
COLOURS = ["red", "green", "blue"]
OPEN = [*TEXT, {"role": "assistant", "content": "<think>"}]
CLOSED = [*TEXT, {"role": "assistant", "content": "<think>the sea</think>"}]
CONTINUED = {"add_generation_prompt": False, "continue_final_message": True}
THINKING = {"model": "tiny", "messages": OPEN, **CONTINUED, "max_tokens": 12, "temperature": 0}
CHOICE = {"structured_outputs": {"choice": COLOURS}}

# (name, body): both answer 200 with the same choices.
SAME_ANSWER: list[tuple[str, dict[str, Any]]] = [
    ("choice_after_a_budget", {**THINKING, **CHOICE, "thinking_token_budget": 3}),
    (
        "json_after_the_first_token",
        {**THINKING, "thinking_token_budget": 0, "response_format": {"type": "json_object"}},
    ),
    (
        "seeded_choice",
        {**THINKING, **CHOICE, "thinking_token_budget": 2, "temperature": 1.0, "seed": 7},
    ),
    ("budget_alone", {**THINKING, "thinking_token_budget": 4}),
    (
        "json_schema_after_a_budget",
        {
            **THINKING,
            "max_tokens": 20,
            "thinking_token_budget": 1,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": VERDICT["function"]["parameters"]},
            },
        },
    ),
    ("reasoning_closed_in_the_prompt", {**THINKING, **CHOICE, "messages": CLOSED}),
    ("reasoning_hidden", {**THINKING, **CHOICE, "include_reasoning": False}),
    (
        "named_tool_after_a_budget",
        {
            **THINKING,
            "max_tokens": 40,
            "thinking_token_budget": 2,
            "tools": [VERDICT],
            "tool_choice": NAMED,
        },
    ),
    (
        "required_tool_after_a_budget",
        {
            **THINKING,
            "max_tokens": 40,
            "thinking_token_budget": 2,
            "tools": [VERDICT],
            "tool_choice": "required",
        },
    ),
]


@pytest.fixture(scope="module")
def thinking_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with ``<think>`` and ``</think>`` in its vocabulary (not special tokens:
    their text stays in the answer, as a reasoning model's)."""
    from epd.server.models.tiny.build import build_tiny_model, preset

    config = preset("tiny", added_tokens=("<think>", "</think>"))
    return build_tiny_model(tmp_path_factory.mktemp("thinking") / "tiny-thinking", config)


@pytest.fixture(scope="module")
async def servers(
    thinking_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[str, Any, Any]]:
    """``vllm serve`` with the parser, and a KV producer and consumer engine with it, started
    together: (vLLM's URL, producer, consumer)."""
    from epd.server.engine.vllm_engine import VllmEngine
    from epd.server.engine.vllm_options import VllmOptions

    def options(role: str) -> VllmOptions:
        return VllmOptions(
            kv_role=role, kv_cache_bytes=KV_CACHE_BYTES, max_model_len=2048, reasoning_parser=PARSER
        )

    deployment = Deployment(tmp_path_factory.mktemp("vllm-thinking"), dict(os.environ))
    flags = ("--reasoning-parser", PARSER, *TOOL_FLAGS)
    try:
        url, producer, consumer = await asyncio.gather(
            load("vllm_servers").start_vllm(deployment, thinking_model_dir, "vllm", *flags),
            VllmEngine.start(thinking_model_dir, model_id="tiny", options=options("kv_producer")),
            VllmEngine.start(thinking_model_dir, model_id="tiny", options=options("kv_consumer")),
        )
        yield url, producer, consumer
        await asyncio.gather(producer.close(), consumer.close())
    finally:
        deployment.stop()


# epd's route URL -> the same route's gRPC endpoint.
GRPC: dict[str, str] = {}


@pytest.fixture(scope="module", params=["e-pd", "e-p-d"])
async def urls(
    request: pytest.FixtureRequest, thinking_model_dir: Path, servers: tuple[str, Any, Any]
) -> AsyncIterator[tuple[str, str]]:
    """(vLLM's URL, epd's): epd's route with the parser, on one prefill+decode worker or a
    prefill worker handing its KV to a decode worker (text bodies: no encoder)."""
    vllm_url, producer, consumer = servers
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    is_split = request.param == "e-p-d"
    mode = Role.PREFILL if is_split else Role.PREFILL_DECODE
    config = PrefillConfig(thinking_model_dir, mode=mode, scheduler=endpoint)
    workers = [await build_prefill_server(config, producer)]
    if is_split:
        workers.append(await build_decode_server(DecodeConfig(scheduler=endpoint), consumer))
    tools = ToolOptions(
        enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser=PARSER
    )
    route = await build_route_server(
        RouteConfig(thinking_model_dir, endpoint, "tiny", http_port=0, tools=tools)
    )
    await until_registered(endpoint, len(workers))
    assert route.http is not None
    epd_url = f"http://127.0.0.1:{route.http.port}/v1"
    GRPC[epd_url] = f"127.0.0.1:{route.port}"
    yield vllm_url, epd_url
    await route.stop()
    for worker in reversed(workers):
        await worker.stop()
    await scheduler.drain_and_stop(0)


@pytest.mark.parametrize(("name", "body"), SAME_ANSWER, ids=[c[0] for c in SAME_ANSWER])
async def test_a_structured_output_after_reasoning_is_vllms(
    urls: tuple[str, str], name: str, body: dict[str, Any]
) -> None:
    (vllm_status, expected), (status, answer) = [await post(url, body) for url in urls]
    assert (status, vllm_status) == (200, 200), (answer, expected)
    assert choices(answer) == choices(expected)
    for key in ("prompt_tokens", "completion_tokens"):
        assert answer["usage"][key] == expected["usage"][key], key


async def test_the_budget_ends_the_reasoning_and_the_grammar_holds_after_it(
    urls: tuple[str, str],
) -> None:
    """The outcome is decided: three tokens of reasoning, then one of the choices."""
    body = {**THINKING, **CHOICE, "thinking_token_budget": 3, "return_token_ids": True}
    for url in urls:
        status, answer = await post(url, body)
        (choice,) = answer["choices"]
        assert status == 200 and choice["message"]["content"] in COLOURS, answer
        assert choice["message"]["reasoning"] is not None


async def test_a_streamed_answer_after_reasoning_is_vllms(urls: tuple[str, str]) -> None:
    body = {**THINKING, **CHOICE, "thinking_token_budget": 3, "stream": True}
    shown = []
    for url in urls:
        chunks = await streamed(url, body, "chat/completions")
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        shown.append(
            (
                "".join(d.get("reasoning") or "" for d in deltas),
                "".join(d.get("content") or "" for d in deltas),
            )
        )
    assert shown[1] == shown[0] and shown[0][1] in COLOURS


async def test_reasoning_over_grpc_is_the_http_doors(urls: tuple[str, str]) -> None:
    """The same chat through the route's two doors, the engine closing the reasoning the user's
    ``<think>`` opened after its budget (the prompt's 5 tokens after it count) and the choice
    holding after it: the same reasoning and content, streamed apart."""
    question = "tell me about the sea<think>"
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 20,
        "temperature": 0,
        "thinking_token_budget": 8,
        "stream": True,
        **CHOICE,
    }
    chunks = await streamed(urls[1], body, "chat/completions")
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    http = tuple("".join(d.get(key) or "" for d in deltas) for key in ("reasoning", "content"))
    sampling = generation_pb2.SamplingParams(
        max_tokens=20,
        thinking_token_budget=8,
        structured_output=generation_pb2.StructuredOutput(
            choice=generation_pb2.Choices(values=COLOURS)
        ),
    )
    message = pb.ChatMessage(role="user", content=[pb.ContentPart(text=question)])
    request = pb.GenerateRequest(model="tiny", messages=[message], sampling=sampling)
    async with grpc.aio.insecure_channel(GRPC[urls[1]]) as channel:
        responses = [r async for r in pb_grpc.RouteServiceStub(channel).Generate(request)]
    shown = tuple("".join(getattr(r, key) for r in responses) for key in ("reasoning", "text"))
    assert shown == http and http[1] in COLOURS and http[0], (shown, http)


async def test_a_continued_think_over_grpc_is_the_http_doors(urls: tuple[str, str]) -> None:
    """An assistant's opened ``<think>`` continued (add_generation_prompt false,
    continue_final_message) through the route's two doors, the budget closing the reasoning and
    the choice holding after it: the same reasoning and content (the HTTP door's is vLLM's:
    ``choice_after_a_budget``)."""
    body = {**THINKING, **CHOICE, "thinking_token_budget": 3, "stream": True}
    chunks = await streamed(urls[1], body, "chat/completions")
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    http = tuple("".join(d.get(key) or "" for d in deltas) for key in ("reasoning", "content"))
    sampling = generation_pb2.SamplingParams(
        max_tokens=12,
        thinking_token_budget=3,
        structured_output=generation_pb2.StructuredOutput(
            choice=generation_pb2.Choices(values=COLOURS)
        ),
    )
    messages = [
        pb.ChatMessage(role=m["role"], content=[pb.ContentPart(text=m["content"])]) for m in OPEN
    ]
    request = pb.GenerateRequest(
        model="tiny",
        messages=messages,
        sampling=sampling,
        add_generation_prompt=False,
        continue_final_message=True,
    )
    async with grpc.aio.insecure_channel(GRPC[urls[1]]) as channel:
        responses = [r async for r in pb_grpc.RouteServiceStub(channel).Generate(request)]
    shown = tuple("".join(getattr(r, key) for r in responses) for key in ("reasoning", "text"))
    assert shown == http and http[1] in COLOURS, (shown, http)


async def test_a_completion_after_reasoning_is_vllms(urls: tuple[str, str]) -> None:
    """/v1/completions sends no verdict (as vLLM's completions server): the engines' parser
    judges the prompt, which opens the reasoning."""
    body = {
        "model": "tiny",
        "prompt": "the sea<think>",
        "max_tokens": 12,
        "temperature": 0,
        "thinking_token_budget": 2,
        **CHOICE,
    }
    (vllm_status, expected), (status, answer) = [
        await post(url, body, "completions") for url in urls
    ]
    assert (status, vllm_status) == (200, 200), (answer, expected)
    texts = [reply["choices"][0]["text"] for reply in (answer, expected)]
    assert texts[0] == texts[1] and "</think>" in texts[0], texts
    assert texts[0].rsplit("</think>", 1)[1] in COLOURS
