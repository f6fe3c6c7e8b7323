"""Route -> Scheduler -> Encode -> Prefill(+decode) in one process over real gRPC: the answer to
a chat with two images equals the transformers reference token for token."""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

import grpc
import pytest
from PIL import Image

from epd.common.channels import create_channel
from epd.common.status import from_rpc_error
from epd.scheduler.app import build_scheduler_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.engine.reference import ReferenceEngine
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, route_service_pb2_grpc
from tests.integration.registered import until_registered
from tests.pictures import picture, png

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
async def deployment(tiny_model_dir, engines):
    """The services around the session's vLLM producer (which serves whole generations too)."""
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    encoders = [
        await build_encode_server(
            EncodeConfig(tiny_model_dir, model_id="tiny", scheduler=endpoint, worker_id=f"enc{i}")
        )
        for i in range(2)
    ]
    engine = engines[0]
    prefill = await build_prefill_server(PrefillConfig(tiny_model_dir, scheduler=endpoint), engine)
    route = await build_route_server(RouteConfig(tiny_model_dir, endpoint, "tiny", http_port=0))
    await until_registered(endpoint, 3)
    channel = create_channel(f"127.0.0.1:{route.port}")
    yield route_service_pb2_grpc.RouteServiceStub(channel), encoders, route, prefill
    await channel.close()
    await route.stop()
    await prefill.stop()
    for encoder in encoders:
        await encoder.stop()
    await scheduler.drain_and_stop(0)


def chat_request(
    images: list[Image.Image], text: str, **sampling
) -> route_service_pb2.GenerateRequest:
    content = [
        route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=png(image)))
        for image in images
    ]
    content.append(route_service_pb2.ContentPart(text=text))
    return route_service_pb2.GenerateRequest(
        request_id="req-1",
        model="tiny",
        messages=[route_service_pb2.ChatMessage(role="user", content=content)],
        sampling=generation_pb2.SamplingParams(**sampling),
    )


async def test_two_images_answer_equals_the_reference(deployment, tiny_model_dir) -> None:
    stub, encoders, _, _ = deployment
    images = [picture(1, 96, 64), picture(2, 60, 90)]
    request = chat_request(images, "describe this picture", max_tokens=12, ignore_eos=True)
    responses = [r async for r in stub.Generate(request)]
    tokens = [t for r in responses for t in r.token_ids]
    reference = ReferenceEngine(tiny_model_dir)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "image"},
                {"type": "text", "text": "describe this picture"},
            ],
        }
    ]
    expected = reference.generate(messages, images, max_tokens=12, ignore_eos=True)
    assert tokens == expected.token_ids
    assert "".join(r.text for r in responses) == expected.text
    assert responses[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert responses[-1].usage.completion_tokens == 12
    assert all(encoder.worker.plane.held() == [] for encoder in encoders)
    assert_pixels_shared_and_released(deployment)


def assert_pixels_shared_and_released(deployment) -> None:
    """The encoders read the route's pixels (they decoded nothing), which it no longer holds."""
    _, encoders, route, _ = deployment
    assert all(len(encoder.worker.loader.cache) == 0 for encoder in encoders)
    assert route.router.plane.held() == []


async def test_list_models_shows_the_deployment(deployment) -> None:
    stub, _, _, _ = deployment
    reply = await stub.ListModels(route_service_pb2.ListModelsRequest())
    (card,) = reply.models
    assert card.id == "tiny" and dict(card.worker_counts) == {"encode": 2, "prefill_decode": 1}


async def test_bad_image_is_a_clear_error_and_holds_nothing(deployment) -> None:
    stub, encoders, route, _ = deployment
    request = chat_request([], "hi")
    request.messages[0].content.insert(
        0, route_service_pb2.ContentPart(image=multimodal_pb2.MediaItem(data=b"not an image"))
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        _ = [r async for r in stub.Generate(request)]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(caught.value).reason == "BAD_IMAGE"
    assert all(encoder.worker.plane.held() == [] for encoder in encoders)
    assert route.router.plane.held() == []


def data_url(image: Image.Image) -> str:
    return "data:image/png;base64," + base64.b64encode(png(image)).decode()


def openai_messages(images: list[Image.Image], text: str) -> list[dict[str, object]]:
    parts: list[dict[str, object]] = [
        {"type": "image_url", "image_url": {"url": data_url(i)}} for i in images
    ]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


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


def counted(counts: Counter[str], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, counting its calls in ``counts[name]``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return function(*args, **kwargs)

    return call


def count_decodes_and_hashes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts of the media loader's image decodes ("decode") and hash walks ("hash") in this
    process (every service of the in-process deployments), from now on."""
    from epd.server.media import loader

    counts: Counter[str] = Counter()
    monkeypatch.setattr(loader, "decode_image", counted(counts, "decode", loader.decode_image))
    monkeypatch.setattr(loader, "mm_hash", counted(counts, "hash", loader.mm_hash))
    return counts


async def test_each_image_is_decoded_and_hashed_once_in_the_deployment(
    deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route decodes and hashes a picture; its encoder takes the pixels the route shared,
    tagged with their mm_hash, and neither decodes nor hashes them again; the prefill worker
    takes the embeddings the encoder tagged with it and names them by it, unhashed."""
    from epd.server.engine import vllm_embeds

    counts = count_decodes_and_hashes(monkeypatch)
    monkeypatch.setattr(
        vllm_embeds,
        "embeddings_hash",
        counted(counts, "embeddings hash", vllm_embeds.embeddings_hash),
    )
    stub, encoders, _, _ = deployment
    request = chat_request([picture(31, 300, 260)], "describe", max_tokens=2, ignore_eos=True)
    responses = [r async for r in stub.Generate(request)]
    assert sum(len(r.token_ids) for r in responses) == 2
    assert counts == {"decode": 1, "hash": 1}  # NOTE: and no "embeddings hash"
    assert sum(encoder.worker.loader.num_decoded for encoder in encoders) == 0
