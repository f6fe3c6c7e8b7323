"""The deployment's OpenAI door's sampling against the gRPC door's: penalties and biases,
logprobs, n parallel samples, stop strings."""

from __future__ import annotations

import pytest

from tests.integration.e2e.route_epd_deployment import chat_request, openai_messages
from tests.pictures import picture

pytestmark = pytest.mark.vllm


async def test_openai_penalties_and_biases_equal_the_grpc_answer(deployment) -> None:
    import openai

    stub, _, route, _ = deployment
    images = [picture(4, 64, 64)]
    fields = {"frequency_penalty": -2.0, "presence_penalty": 1.5, "seed": 11}
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{route.http.port}/v1", api_key="-")
    reply = await client.chat.completions.create(
        model="tiny",
        messages=openai_messages(images, "go on"),
        max_tokens=12,
        temperature=1.0,
        logit_bias={"7": 3.0},
        extra_body={"min_p": 0.05, "repetition_penalty": 1.3, "ignore_eos": True},
        **fields,
    )
    await client.close()
    request = chat_request(
        images,
        "go on",
        max_tokens=12,
        temperature=1.0,
        logit_bias={7: 3.0},
        min_p=0.05,
        repetition_penalty=1.3,
        ignore_eos=True,
        **fields,
    )
    expected = "".join([r.text async for r in stub.Generate(request)])
    assert reply.choices[0].message.content == expected


async def test_openai_logprobs_stream_and_whole_equal_the_grpc_answer(deployment) -> None:
    import openai

    stub, _, route, _ = deployment
    images = [picture(5, 64, 64)]
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{route.http.port}/v1", api_key="-")
    fields = {"max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    messages = openai_messages(images, "name it")
    reply = await client.chat.completions.create(model="tiny", messages=messages, **fields)
    stream = await client.chat.completions.create(
        model="tiny", messages=messages, stream=True, **fields
    )
    streamed = [c async for c in stream]
    plain = await client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=2, temperature=0
    )
    await client.close()
    assert plain.choices[0].logprobs is None
    whole = reply.choices[0].logprobs.content
    assert len(whole) == reply.usage.completion_tokens == 8
    assert all(len(entry.top_logprobs) == 2 for entry in whole)
    assert all(entry.top_logprobs[0].token == entry.token for entry in whole)
    pieces = [
        e
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in pieces] == [(e.token, e.logprob) for e in whole]

    request = chat_request(images, "name it", max_tokens=8, logprobs=2)
    answer = [r async for r in stub.Generate(request)]
    positions = [p for r in answer for p in r.logprobs]
    assert [p.candidates[0].token for p in positions] == [e.token for e in whole]
    assert [p.candidates[0].logprob for p in positions] == pytest.approx([e.logprob for e in whole])


async def test_n_completions_are_vllms_parallel_samples_over_both_doors(deployment) -> None:
    """n choices, completion i sampled with seed + i (vLLM's parallel sampling), whole and
    streamed over HTTP and tagged by index over gRPC; usage counts the prompt once."""
    import openai

    stub, _, route, _ = deployment
    images = [picture(6, 64, 64)]
    singles = []
    for index in range(3):
        request = chat_request(images, "go", max_tokens=6, temperature=1.0, seed=40 + index)
        singles.append("".join([r.text async for r in stub.Generate(request)]))
    assert len(set(singles)) > 1, "the seeds must give different answers for this to mean much"

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{route.http.port}/v1", api_key="-")
    fields = {"max_tokens": 6, "temperature": 1.0, "seed": 40, "n": 3}
    messages = openai_messages(images, "go")
    reply = await client.chat.completions.create(model="tiny", messages=messages, **fields)
    stream = await client.chat.completions.create(
        model="tiny",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        **fields,
    )
    chunks = [c async for c in stream]
    await client.close()
    assert [c.message.content for c in sorted(reply.choices, key=lambda c: c.index)] == singles
    assert reply.usage.completion_tokens == 18
    streamed = ["", "", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == singles
    assert chunks[-1].usage.completion_tokens == 18

    request = chat_request(images, "go", max_tokens=6, temperature=1.0, seed=40, n=2)
    tagged = ["", ""]
    async for response in stub.Generate(request):
        tagged[response.index] += response.text
    assert tagged == singles[:2]


async def test_a_stop_string_ends_the_text_as_vllm_ends_it(deployment) -> None:
    """vLLM cuts the text before the stop string (after it with include_stop_str_in_output),
    wherever the string falls inside a token."""
    import openai

    stub, _, route, _ = deployment
    images = [picture(7, 64, 64)]
    request = chat_request(images, "stop", max_tokens=16, ignore_eos=True)
    text = "".join([r.text async for r in stub.Generate(request)])
    stop = text[5:8]
    assert len(stop) == 3 and stop.strip(), text
    cut = text.index(stop)
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{route.http.port}/v1", api_key="-")
    fields = {"max_tokens": 16, "temperature": 0, "stop": [stop]}
    messages = openai_messages(images, "stop")
    reply = await client.chat.completions.create(model="tiny", messages=messages, **fields)
    kept = await client.chat.completions.create(
        model="tiny",
        messages=messages,
        extra_body={"include_stop_str_in_output": True, "ignore_eos": True},
        **fields,
    )
    await client.close()
    assert (reply.choices[0].message.content, reply.choices[0].finish_reason) == (
        text[:cut],
        "stop",
    )
    assert kept.choices[0].message.content == text[: cut + len(stop)]
