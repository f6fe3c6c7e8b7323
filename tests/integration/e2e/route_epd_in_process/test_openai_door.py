"""The deployment's OpenAI door through the ``openai`` client: a chat completion, whole and
streamed, and a parsed structured output equal the gRPC door's answers; bad requests get 400
with an error body."""

from __future__ import annotations

import json
from typing import Literal

import pytest

from tests.integration.e2e.route_epd_deployment import chat_request, openai_messages
from tests.pictures import picture

pytestmark = pytest.mark.vllm


async def test_openai_client_chat_completion_equals_the_grpc_answer(deployment) -> None:
    import openai

    stub, _, route, _ = deployment
    images = [picture(1, 96, 64), picture(2, 60, 90)]
    expected = [
        r async for r in stub.Generate(chat_request(images, "describe this picture", max_tokens=12))
    ]
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{route.http.port}/v1", api_key="-")
    reply = await client.chat.completions.create(
        model="tiny",
        messages=openai_messages(images, "describe this picture"),
        max_tokens=12,
        temperature=0,
    )
    assert reply.choices[0].message.content == "".join(r.text for r in expected)
    assert reply.usage.completion_tokens == expected[-1].usage.completion_tokens
    stream = await client.chat.completions.create(
        model="tiny",
        messages=openai_messages(images, "describe this picture"),
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    assert [m.id for m in (await client.models.list()).data] == ["tiny"]
    await client.close()


async def test_openai_structured_output_parses_and_equals_the_grpc_answer(
    deployment, tiny_model_dir
) -> None:
    """The openai client's ``parse`` with a pydantic model: vLLM's response_format through the
    HTTP door, the same constraint as the gRPC door's StructuredOutput, the same tokens."""
    import openai
    from pydantic import BaseModel
    from transformers import AutoTokenizer

    class Verdict(BaseModel):
        is_picture: bool
        colour: Literal["red", "green", "blue"]

    stub, _, route, _ = deployment
    images = [picture(3, 64, 64)]
    # NOTE: the random tiny model would fill the JSON's optional whitespace up to max_tokens
    # (vLLM 0.32 takes disable_any_whitespace from the engine's config only): bias it away.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    blanks = [i for i in range(len(tokenizer)) if not tokenizer.decode([i]).strip()]
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{route.http.port}/v1", api_key="-")
    reply = await client.chat.completions.parse(
        model="tiny",
        messages=openai_messages(images, "judge this picture"),
        max_tokens=64,
        temperature=0,
        response_format=Verdict,
        logit_bias={str(i): -100 for i in blanks},
    )
    await client.close()
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, Verdict)
    schema = json.dumps(Verdict.model_json_schema() | {"additionalProperties": False})
    request = chat_request(
        images, "judge this picture", max_tokens=64, logit_bias={i: -100 for i in blanks}
    )
    request.sampling.structured_output.json_schema = schema
    expected = "".join([r.text async for r in stub.Generate(request)])
    assert Verdict.model_validate_json(expected) == parsed


async def test_openai_bad_requests_get_400_with_an_error_body(deployment) -> None:
    import openai

    _, encoders, route, _ = deployment
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{route.http.port}/v1", api_key="-")
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="tiny", messages=[], max_tokens=4)
    # NOTE: the reason the gRPC door gives too (one check for both: request_check.py)
    assert caught.value.body["code"] == "EMPTY_CHAT"
    bad_image = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}},
                {"type": "text", "text": "hi"},
            ],
        }
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="tiny", messages=bad_image, max_tokens=4)
    assert caught.value.body["code"] == "PRIVATE_ADDRESS"
    await client.close()
    assert all(encoder.worker.plane.held() == [] for encoder in encoders)
