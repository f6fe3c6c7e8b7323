"""An image under a request's pixel budget (vLLM 0.32's ``mm_processor_kwargs``: ``max_pixels``)
through a route started with ``--trust-request-mm-kwargs``, on the session's vLLM engine, token
for token what monolithic vLLM answers given the same image and kwargs, the prompt's ids too:
E/PD and E/P/D (the encoder resizes within the item's budget; the decode worker lays out the
prefill's grids) and EPD (the encode_prefill worker's vLLM processor resizes). The budget
shrinks the image's tokens, so the answer without it differs. With an encoder the same image
under two budgets is encoded twice, under one budget once (E/PD, E/P/D)."""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from epd.common.roles import Role
from epd.scheduler.app import build_scheduler_server
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.media.policy import MediaPolicy
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart, ImageSource
from tests.integration.registered import until_registered
from tests.pictures import picture

pytestmark = pytest.mark.vllm
MAX_TOKENS = 10
TEXT = "describe this picture"
IMAGE = picture(44, 150, 100)
BUDGET = {"max_pixels": 5000}


@pytest.fixture(scope="module", params=["e-pd", "e-p-d", "epd"])
async def deployment(request, tiny_model_dir, engines) -> AsyncIterator[dict[str, Any]]:
    """A trusting route over an encoder and a prefill+decode worker (E/PD) or a prefill worker
    handing its KV to a decode worker (E/P/D), or over an encode_prefill worker (EPD), on the
    session's engines."""
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    workers = []
    if request.param != "epd":
        config = EncodeConfig(tiny_model_dir, model_id="tiny", scheduler=endpoint)
        workers.append(await build_encode_server(config))
    modes = {"e-pd": Role.PREFILL_DECODE, "e-p-d": Role.PREFILL, "epd": Role.ENCODE_PREFILL}
    prefill = PrefillConfig(tiny_model_dir, mode=modes[request.param], scheduler=endpoint)
    workers.append(await build_prefill_server(prefill, engines[0]))
    if request.param == "e-p-d":
        workers.append(await build_decode_server(DecodeConfig(scheduler=endpoint), engines[1]))
    trusting = MediaPolicy(trust_request_mm_kwargs=True)
    route = await build_route_server(
        RouteConfig(tiny_model_dir, endpoint, "tiny", http_port=0, media=trusting)
    )
    await until_registered(endpoint, len(workers))
    assert route.http is not None
    yield {
        "url": f"http://127.0.0.1:{route.http.port}/v1/chat/completions",
        "encoder": workers[0] if request.param != "epd" else None,
    }
    await route.stop()
    for worker in reversed(workers):
        await worker.stop()
    await scheduler.drain_and_stop(0)


async def vllm_reference(engine: Any, model_dir: Any, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Monolithic vLLM's prompt ids and greedy tokens for the chat (the image, then ``TEXT``)
    with the image raw and ``kwargs`` as the request's ``mm_processor_kwargs``: its processor
    resizes the image, its tower encodes it."""
    from vllm import SamplingParams

    prompt_ids = PromptBuilder(model_dir).token_ids(
        [ChatMessage("user", [ChatPart(image=ImageSource(data=b"-")), ChatPart(text=TEXT)])]
    )
    prompt = {
        "prompt_token_ids": prompt_ids,
        "multi_modal_data": {"image": [IMAGE]},
        "mm_processor_kwargs": kwargs,
    }
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    final = None
    async for output in engine._llm.generate(prompt, params, f"vllm-budget-{len(kwargs)}"):
        final = output
    assert final is not None
    return list(final.prompt_token_ids), list(final.outputs[0].token_ids)


def body(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    buffer = io.BytesIO()
    IMAGE.save(buffer, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    sent: dict[str, Any] = {
        "model": "tiny",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": TEXT},
                ],
            }
        ],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    if kwargs is not None:
        sent["mm_processor_kwargs"] = kwargs
    return sent


async def answer(url: str, kwargs: dict[str, Any] | None) -> tuple[Any, ...]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body(kwargs)) as response,
    ):
        reply = await response.json()
    assert response.status == 200, reply
    return reply["prompt_token_ids"], reply["choices"][0]["token_ids"]


async def test_a_budgeted_image_is_token_exact_with_vllm(
    deployment, engines, tiny_model_dir
) -> None:
    expected = await vllm_reference(engines[0], tiny_model_dir, BUDGET)
    plain = await vllm_reference(engines[0], tiny_model_dir, {})
    assert len(expected[0]) < len(plain[0])
    assert await answer(deployment["url"], BUDGET) == expected
    assert await answer(deployment["url"], {"images_kwargs": BUDGET}) == expected
    assert await answer(deployment["url"], None) == plain


async def test_one_image_under_two_budgets_is_encoded_twice_and_under_one_once(
    deployment,
) -> None:
    encoder = deployment["encoder"]
    if encoder is None:
        pytest.skip("EPD has no encoder: its engine's processor resizes")
    cache = encoder.worker.cache
    before = (len(cache), cache.num_hits)
    for kwargs in ({"max_pixels": 6000}, {"max_pixels": 7000}, {"max_pixels": 6000}):
        await answer(deployment["url"], kwargs)
    assert (len(cache) - before[0], cache.num_hits - before[1]) == (2, 1)
