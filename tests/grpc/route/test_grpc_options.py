"""The OpenAI chat door's answer options through gRPC ``RouteService.Generate``: the same chat sent
to both doors of one router (a fake engine's) with beam search, ``add_generation_prompt`` and
``continue_final_message``, ``include_reasoning``, ``return_prompt_text`` or ``echo`` gets the same
prompt, the same engine requests and the same answer, and the same refusals; likewise
``truncate_prompt_tokens`` and ``truncation_side``, ``return_token_ids``, and what reaches the chat
template (``add_special_tokens``, ``reasoning_effort``, ``documents``, ``chat_template``); the SDK
sends them typed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from epd.client import AsyncEpdClient, EpdClientError, assistant, user
from epd.server.route.openai_schema import to_chat_request
from epd.server.route.options_proto import add_options
from epd.server.route.request import from_proto
from epd.server.route.tools_proto import add_tools
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import route_service_pb2 as pb
from epd.v1 import route_service_pb2_grpc as pb_grpc
from tests.grpc.route.test_grpc_tools import (
    CALL,
    DEEPSEEK,
    THOUGHT,
    Doors,
    StoppingEngine,
    doors_fixture,
    grpc_answer,
    http_answer,
    open_doors,
    thinking_model_dir,  # noqa: F401 - the deepseek doors' model
)
from tests.unit.route.fakes import FakeStream

deepseek = doors_fixture(DEEPSEEK, THOUGHT, "thinking_model_dir")
plain = doors_fixture(None, CALL, "tiny_model_dir")
OPENED = [
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "<think>the sky"},
]


def grpc_chat(chat: list[dict[str, str]]) -> list[pb.ChatMessage]:
    """``chat`` (OpenAI messages with text content) as GenerateRequest messages."""
    return [
        pb.ChatMessage(role=m["role"], content=[pb.ContentPart(text=m["content"])]) for m in chat
    ]


async def generate(
    doors: Doors, sampling: generation_pb2.SamplingParams, **fields: Any
) -> list[pb.GenerateResponse]:
    """``doors``' gRPC answer to the weather question (or ``fields``' messages) with
    ``sampling``."""
    fields.setdefault("messages", grpc_chat([{"role": "user", "content": "weather in Paris?"}]))
    request = pb.GenerateRequest(model="tiny", sampling=sampling, **fields)
    async with grpc.aio.insecure_channel(doors.grpc_endpoint) as channel:
        stub = pb_grpc.RouteServiceStub(channel)
        return [response async for response in stub.Generate(request, timeout=20)]


def http_choices(text: str) -> dict[int, dict[str, Any]]:
    """A streamed OpenAI chat answer's choices by index: content, finish reason, prompt_text,
    the deltas' contents in order and the number of tokens with logprobs."""
    choices: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        payload = json.loads(line[6:])
        for choice in payload["choices"]:
            entry = choices.setdefault(
                choice["index"],
                {"content": "", "finish": None, "prompt_text": None, "parts": [], "logprobs": 0},
            )
            entry["logprobs"] += len((choice.get("logprobs") or {}).get("content") or [])
            content = choice["delta"].get("content") or ""
            entry["content"] += content
            entry["parts"].append(content)
            entry["finish"] = choice["finish_reason"] or entry["finish"]
            if "prompt_text" in payload:
                entry["prompt_text"] = payload["prompt_text"]
    return choices


def grpc_choices(responses: list[pb.GenerateResponse]) -> dict[int, dict[str, Any]]:
    """The same of a gRPC answer (prompt_text: each completion's first chunk's)."""
    choices: dict[int, dict[str, Any]] = {}
    for response in responses:
        entry = choices.setdefault(
            response.index,
            {"content": "", "finish": None, "prompt_text": response.prompt_text, "parts": []},
        )
        entry["logprobs"] = entry.get("logprobs", 0) + len(response.logprobs)
        entry["content"] += response.text
        entry["parts"].append(response.text)
        if response.finish_reason:
            name = generation_pb2.FinishReason.Name(response.finish_reason)
            entry["finish"] = name.removeprefix("FINISH_REASON_").lower()
    return choices


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


async def test_include_reasoning_false_drops_it_as_over_http(deepseek: Doors) -> None:
    status, streamed = await deepseek.post({"include_reasoning": False, "stream": True})
    responses = await generate(
        deepseek, generation_pb2.SamplingParams(max_tokens=64), include_reasoning=False
    )
    assert status == 200, streamed
    assert grpc_answer(responses) == http_answer(streamed)
    assert grpc_answer(responses)[:2] == ("It is sunny.", "")
    shown = await generate(deepseek, generation_pb2.SamplingParams(max_tokens=64))
    assert grpc_answer(shown)[1] == "the sky is clear"


async def test_return_prompt_text_is_on_each_completion_s_first_chunk_as_over_http(
    plain: Doors,
) -> None:
    status, streamed = await plain.post({"return_prompt_text": True, "n": 2, "stream": True})
    responses = await generate(
        plain, generation_pb2.SamplingParams(max_tokens=64, n=2), return_prompt_text=True
    )
    assert status == 200, streamed
    http, answer = http_choices(streamed), grpc_choices(responses)
    assert sorted(answer) == sorted(http) == [0, 1]
    for index in (0, 1):
        assert answer[index]["prompt_text"] == http[index]["prompt_text"]
        assert "weather in Paris?" in answer[index]["prompt_text"]
    assert sum(bool(response.prompt_text) for response in responses) == 2
    plainly = await generate(plain, generation_pb2.SamplingParams(max_tokens=64))
    assert not any(response.prompt_text for response in plainly)


async def test_echo_starts_each_completion_as_over_http(plain: Doors) -> None:
    chat = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "Well,"}]
    status, streamed = await plain.post({"messages": chat, "echo": True, "n": 2, "stream": True})
    responses = await generate(
        plain,
        generation_pb2.SamplingParams(max_tokens=64, n=2),
        messages=grpc_chat(chat),
        echo=True,
    )
    assert status == 200, streamed
    http, answer = http_choices(streamed), grpc_choices(responses)
    for index in (0, 1):
        assert answer[index]["content"] == http[index]["content"]
        assert answer[index]["content"].startswith("Well,Sure.")
        assert answer[index]["parts"][0] == "Well,"
    assert [(r.text, list(r.token_ids)) for r in responses[:2]] == [("Well,", [])] * 2


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


def http_prompt_ids(text: str) -> list[tuple[int, list[int]]]:
    """A streamed OpenAI chat answer's prompt_token_ids, with the index of the choice whose
    chunk carried them."""
    shown = []
    for line in text.splitlines():
        if line.startswith("data: {") and "prompt_token_ids" in (payload := json.loads(line[6:])):
            shown.append((payload["choices"][0]["index"], payload["prompt_token_ids"]))
    return shown


async def test_return_token_ids_is_on_each_completion_s_first_chunk_as_over_http(
    plain: Doors,
) -> None:
    status, streamed = await plain.post({"return_token_ids": True, "n": 2, "stream": True})
    responses = await generate(
        plain, generation_pb2.SamplingParams(max_tokens=64, n=2), return_token_ids=True
    )
    engine_prompt = list(plain.last_call().prompt.token_ids)
    shown = [(r.index, list(r.prompt_token_ids)) for r in responses if r.prompt_token_ids]
    assert status == 200, streamed
    assert (
        sorted(shown)
        == sorted(http_prompt_ids(streamed))
        == [(0, engine_prompt)] + [(1, engine_prompt)]
    )
    plainly = await generate(plain, generation_pb2.SamplingParams(max_tokens=64))
    assert not any(response.prompt_token_ids for response in plainly)


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


@pytest.fixture
async def beams(tiny_model_dir: Path) -> AsyncIterator[Doors]:
    """Both doors of a route whose engine answers beam steps (``BeamEngine``): its candidates
    two word pieces, the end of sequence, then others."""
    opened, http, server = await open_doors(tiny_model_dir, None, "sunny cloudy rain snow")
    first, second, *others = opened.engine.tokens[:-1]
    opened.engine.__class__ = BeamEngine  # NOTE: the router's engine object, its calls kept
    opened.engine.tokens = [first, second, opened.tokenizer.eos_token_id, *others]
    yield opened
    await http.stop()
    await server.drain_and_stop(0)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_beam_search_is_the_openai_doors(beams: Doors, stream: bool) -> None:
    body = {"use_beam_search": True, "n": 2, "max_tokens": 4, "temperature": 0}
    body |= {"length_penalty": 0.7, "logprobs": True, "top_logprobs": 2, "top_p": 0.5}
    status, text = await beams.post({**body, "stream": stream})
    http_steps = [call.sampling for _, call in beams.engine.calls]
    sampling = generation_pb2.SamplingParams(max_tokens=4, n=2, logprobs=2, top_p=0.5)
    del beams.engine.calls[:]
    responses = await generate(beams, sampling, use_beam_search=True, length_penalty=0.7)
    assert status == 200, text
    assert [call.sampling for _, call in beams.engine.calls] == http_steps
    assert len(http_steps) > 2 and {s.logprobs for s in http_steps} == {4}
    answer = grpc_choices(responses)
    if stream:
        http = {
            i: (c["content"], c["finish"], c["logprobs"]) for i, c in http_choices(text).items()
        }
    else:
        http = {
            c["index"]: (c["message"]["content"], c["finish_reason"], len(c["logprobs"]["content"]))
            for c in json.loads(text)["choices"]
        }
    assert {i: (c["content"], c["finish"], c["logprobs"]) for i, c in answer.items()} == http
    assert len(answer) == 2 and answer[0]["content"] != answer[1]["content"]
    assert sum(c["logprobs"] for c in answer.values()) > 2


async def test_the_sdk_sends_the_options_typed(deepseek: Doors, beams: Doors) -> None:
    chat = [user("weather?"), assistant("<think>the sky")]
    await deepseek.post(
        {"messages": OPENED, "add_generation_prompt": False, "continue_final_message": True}
    )
    http_prompt = list(deepseek.last_call().prompt.token_ids)
    async with AsyncEpdClient(deepseek.grpc_endpoint) as client:
        answer = await client.generate(
            chat,
            max_tokens=64,
            add_generation_prompt=False,
            continue_final_message=True,
            include_reasoning=False,
            return_prompt_text=True,
            echo=True,
        )
    assert list(deepseek.last_call().prompt.token_ids) == http_prompt
    assert answer.reasoning == "" and answer.text.startswith("<think>the sky")
    assert answer.prompt_text.endswith("<think>the sky")
    status, text = await beams.post(
        {"use_beam_search": True, "n": 2, "max_tokens": 4, "temperature": 0}
    )
    expected = [choice["message"]["content"] for choice in json.loads(text)["choices"]]
    async with AsyncEpdClient(beams.grpc_endpoint) as client:
        chunks = [
            chunk
            async for chunk in client.stream(
                [user("weather in Paris?")],
                max_tokens=4,
                n=2,
                use_beam_search=True,
                length_penalty=1.0,
            )
        ]
    assert status == 200, text
    assert [chunk.text for chunk in chunks] == expected


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
