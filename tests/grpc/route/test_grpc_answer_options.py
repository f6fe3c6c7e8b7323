"""The OpenAI chat door's answer options through gRPC ``RouteService.Generate``, over one router
(a fake engine's): ``include_reasoning``, ``return_prompt_text``, ``echo``,
``return_token_ids``, ``stream_interval`` and beam search give the same engine requests and the
same answer as over HTTP; the SDK sends them typed."""

from __future__ import annotations

import json

import pytest

from epd.client import AsyncEpdClient, assistant, user
from epd.v1 import generation_pb2
from tests.grpc.route.door_answers import (
    generate,
    grpc_answer,
    grpc_chat,
    grpc_choices,
    http_answer,
    http_choices,
)
from tests.grpc.route.doors import OPENED, Doors


async def test_stream_interval_gathers_chunks_as_over_http(plain: Doors) -> None:
    status, streamed = await plain.post({"stream": True, "stream_interval": 4})
    http_chunks = [line for line in streamed.splitlines() if line.startswith("data: {")]
    responses = await plain.generate(stream_interval=4)
    num_tokens = len(plain.engine.tokens)
    assert status == 200 and num_tokens > 8
    sizes = [len(response.token_ids) for response in responses]
    assert sum(sizes) == num_tokens and all(size >= 4 for size in sizes[1:-1])
    assert len(responses) == len(http_chunks) - 1  # NOTE: HTTP's first chunk is the role's
    assert len(await plain.generate()) == num_tokens


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
