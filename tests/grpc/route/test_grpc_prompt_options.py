"""The OpenAI chat door's prompt options through gRPC ``RouteService.Generate``, over one router
(a fake engine's): ``add_generation_prompt`` and ``continue_final_message``,
``truncate_prompt_tokens`` and ``truncation_side``, and what reaches the chat template
(``add_special_tokens``, ``reasoning_effort``, ``documents``, ``chat_template``) give the same
prompt as over HTTP and the same refusals; the SDK sends them typed."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from epd.client import AsyncEpdClient, EpdClientError, user
from epd.server.route.openai_schema import to_chat_request
from epd.server.route.options_proto import add_options
from epd.server.route.request import from_proto
from epd.server.route.tools_proto import add_tools
from epd.v1 import generation_pb2
from epd.v1 import route_service_pb2 as pb
from tests.grpc.route.door_answers import generate, grpc_answer, grpc_chat, http_answer
from tests.grpc.route.doors import OPENED, Doors


async def test_continue_final_message_renders_and_answers_as_over_http(deepseek: Doors) -> None:
    await deepseek.post({"messages": OPENED})
    opened_turn = list(deepseek.last_call().prompt.token_ids)
    body = {"messages": OPENED, "add_generation_prompt": False, "continue_final_message": True}
    status, streamed = await deepseek.post({**body, "stream": True})
    http_prompt = list(deepseek.last_call().prompt.token_ids)
    responses = await generate(
        deepseek,
        generation_pb2.SamplingParams(max_tokens=64),
        messages=grpc_chat(OPENED),
        add_generation_prompt=False,
        continue_final_message=True,
    )
    assert status == 200, streamed
    assert list(deepseek.last_call().prompt.token_ids) == http_prompt
    assert http_prompt != opened_turn
    assert deepseek.tokenizer.decode(http_prompt).endswith("<think>the sky")
    assert grpc_answer(responses) == http_answer(streamed)


async def test_add_generation_prompt_false_renders_as_over_http(deepseek: Doors) -> None:
    status, text = await deepseek.post({"add_generation_prompt": False})
    http_prompt = list(deepseek.last_call().prompt.token_ids)
    await generate(deepseek, generation_pb2.SamplingParams(max_tokens=8))
    with_turn = list(deepseek.last_call().prompt.token_ids)
    await generate(
        deepseek, generation_pb2.SamplingParams(max_tokens=8), add_generation_prompt=False
    )
    assert status == 200, text
    assert list(deepseek.last_call().prompt.token_ids) == http_prompt != with_turn


@pytest.mark.parametrize(
    ("fields", "kept"),
    [
        ({"truncate_prompt_tokens": 5}, slice(-5, None)),
        ({"truncate_prompt_tokens": 5, "truncation_side": "left"}, slice(-5, None)),
        ({"truncate_prompt_tokens": 5, "truncation_side": "right"}, slice(5)),
        ({"truncate_prompt_tokens": -1}, slice(None)),
        ({"truncation_side": "right"}, slice(None)),
    ],
)
async def test_truncate_prompt_tokens_cuts_the_prompt_as_over_http(
    plain: Doors, fields: dict[str, Any], kept: slice
) -> None:
    await plain.post({"max_tokens": 8})
    whole = list(plain.last_call().prompt.token_ids)
    status, text = await plain.post({**fields, "max_tokens": 8})
    http_prompt = list(plain.last_call().prompt.token_ids)
    await generate(plain, generation_pb2.SamplingParams(max_tokens=8), **fields)
    assert status == 200, text
    assert list(plain.last_call().prompt.token_ids) == http_prompt == whole[kept]
    assert len(whole) > 10


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(value)
    return message


TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


@pytest.mark.parametrize("trusted", [True, False])
def test_the_template_s_options_are_the_openai_doors(trusted: bool) -> None:
    chat = [{"role": "user", "content": "weather?"}]
    documents = [{"title": "Paris", "text": "sunny"}]
    body = {"messages": chat, "reasoning_effort": "low", "documents": documents}
    body |= {"add_special_tokens": True, "return_token_ids": True}
    request = pb.GenerateRequest(
        messages=grpc_chat(chat),
        reasoning_effort="low",
        documents=[struct(document) for document in documents],
        add_special_tokens=True,
        return_token_ids=True,
    )
    if trusted:
        body["chat_template"] = request.chat_template = TEMPLATE
    http = to_chat_request(body, "tiny", trust_chat_template=trusted)
    answered = from_proto(request)
    add_tools(answered, request, None, trusted)
    add_options(answered, request)
    assert answered.template_kwargs == http.template_kwargs
    assert http.template_kwargs["documents"] == documents
    assert http.template_kwargs["reasoning_effort"] == "low"
    assert answered.chat_template == http.chat_template == (TEMPLATE if trusted else None)
    assert answered.add_special_tokens and answered.return_token_ids
    assert (http.add_special_tokens, http.return_token_ids) == (True, True)


# (name, OpenAI body fields, GenerateRequest fields): both doors refuse them alike.
REFUSED: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "continue_final_message with the generation prompt",
        {"messages": OPENED, "continue_final_message": True},
        {"messages": grpc_chat(OPENED), "continue_final_message": True},
    ),
    (
        "truncate_prompt_tokens beyond the context",
        {"truncate_prompt_tokens": 10**6},
        {"truncate_prompt_tokens": 10**6},
    ),
    (
        "truncate_prompt_tokens below -1",
        {"truncate_prompt_tokens": -2},
        {"truncate_prompt_tokens": -2},
    ),
    (
        "truncation_side neither left nor right",
        {"truncate_prompt_tokens": 5, "truncation_side": "middle"},
        {"truncate_prompt_tokens": 5, "truncation_side": "middle"},
    ),
    ("an unknown reasoning_effort", {"reasoning_effort": "huge"}, {"reasoning_effort": "huge"}),
    (
        "a request's chat_template on an untrusting route",
        {"chat_template": TEMPLATE},
        {"chat_template": TEMPLATE},
    ),
    (
        "a document whose value is no string",
        {"documents": [{"title": 1}]},
        {"documents": [struct({"title": 1})]},
    ),
]


@pytest.mark.parametrize(("name", "body", "fields"), REFUSED, ids=[r[0] for r in REFUSED])
async def test_a_bad_option_is_refused_as_over_http(
    plain: Doors, name: str, body: dict[str, Any], fields: dict[str, Any]
) -> None:
    status, text = await plain.post(body)
    error = json.loads(text)["error"]
    fields = dict(fields)
    sampling = fields.pop("sampling", generation_pb2.SamplingParams(max_tokens=64))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await generate(plain, sampling, **fields)
    refusal = EpdClientError.from_rpc_error(raised.value)
    assert status == 400 and refusal.code == "INVALID_ARGUMENT"
    assert (refusal.message, refusal.reason) == (error["message"], error["code"])
    assert refusal.metadata["param"] == error["param"]


async def test_the_sdk_sends_the_prompt_options_typed(plain: Doors) -> None:
    await plain.post({"max_tokens": 8})
    whole = list(plain.last_call().prompt.token_ids)
    async with AsyncEpdClient(plain.grpc_endpoint) as client:
        answer = await client.generate(
            [user("weather in Paris?")],
            max_tokens=8,
            truncate_prompt_tokens=5,
            truncation_side="right",
            add_special_tokens=True,
            return_token_ids=True,
            reasoning_effort="low",
            documents=[{"title": "Paris", "text": "sunny"}],
        )
        with pytest.raises(EpdClientError) as raised:
            await client.generate([user("weather?")], max_tokens=8, chat_template=TEMPLATE)
    assert answer.prompt_token_ids == list(plain.last_call().prompt.token_ids) == whole[:5]
    assert raised.value.code == "INVALID_ARGUMENT"
    assert raised.value.metadata["param"] == "chat_template"
