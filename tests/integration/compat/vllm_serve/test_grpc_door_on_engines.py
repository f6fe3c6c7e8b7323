"""The route's gRPC door against its HTTP door on real engines: the same tool calls, beam searches
and cut prompts."""

from __future__ import annotations

from typing import Any

import pytest

from epd.client import AsyncEpdClient, user
from epd.client.messages import join
from tests.integration.compat.vllm_serve.bodies import (
    GREEDY,
    IMAGE,
    IMAGE_URL,
    NAMED,
    STRING_TEMPLATE,
    TEXT,
    TOOL_GREEDY,
    VERDICT,
)
from tests.integration.compat.vllm_serve.exchange import post, streamed, streamed_calls
from tests.integration.compat.vllm_serve.servers import GRPC

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("choice", ["required", NAMED, "auto"], ids=["required", "named", "auto"])
async def test_a_tool_call_over_grpc_is_the_http_doors(epd_url: str, choice: Any) -> None:
    """The same chat with the same tool through the route's two doors: the same content, tool
    calls (whole, then as parts) and finish reason, the tiny model held to the call's grammar
    (but for auto) on real engines."""
    body = {**TOOL_GREEDY, "tool_choice": choice, "stream": True}
    http = streamed_calls(await streamed(epd_url, body, "chat/completions"))
    async with AsyncEpdClient(GRPC[epd_url]) as client:
        chunks = [
            chunk
            async for chunk in client.stream(
                [user(TEXT[0]["content"])], max_tokens=40, tools=[VERDICT], tool_choice=choice
            )
        ]
    answer = join(chunks)
    calls = [(call.index, ["function", call.name, call.arguments]) for call in answer.tool_calls]
    assert (answer.text, calls, answer.finish_reason) == http
    if choice != "auto":  # NOTE: the constraint makes even the tiny model call the tool
        assert calls[0][1][1] == "verdict"


@pytest.mark.parametrize("messages", [IMAGE, TEXT], ids=["image", "text"])
async def test_a_beam_search_over_grpc_is_the_http_doors(
    epd_url: str, messages: list[dict[str, Any]]
) -> None:
    """The same beam search (3 beams, length_penalty 0.4, the prompt's text asked for) through
    the route's two doors on real engines: the same beams, best first, with the same texts and
    finish reasons, and the same chat template text."""
    body = {**GREEDY, "messages": messages, "use_beam_search": True, "n": 3}
    body |= {"length_penalty": 0.4, "return_prompt_text": True}
    status, http = await post(epd_url, body)
    content = messages[0]["content"]
    question = content if isinstance(content, str) else content[1]["text"]
    image = IMAGE_URL if messages is IMAGE else None
    async with AsyncEpdClient(GRPC[epd_url]) as client:
        chunks = [
            chunk
            async for chunk in client.stream(
                [user(question, image=image)],
                max_tokens=10,
                n=3,
                use_beam_search=True,
                length_penalty=0.4,
                return_prompt_text=True,
            )
        ]
    assert status == 200, http
    beams = [(c["index"], c["message"]["content"], c["finish_reason"]) for c in http["choices"]]
    assert [(c.index, c.text, c.finish_reason) for c in chunks] == beams
    assert len(beams) == 3 and http["prompt_text"]
    assert [c.prompt_text for c in chunks] == [http["prompt_text"]] * 3


async def test_a_cut_prompt_over_grpc_is_the_http_doors(epd_url: str) -> None:
    """A text chat rendered with the request's own chat template, the tokenizer's special tokens
    added, cut to its first 6 tokens and its token ids asked for, through the route's two doors
    on real engines: the same prompt token ids and the same answer."""
    options: dict[str, Any] = {"truncate_prompt_tokens": 6, "truncation_side": "right"}
    options |= {"add_special_tokens": True, "return_token_ids": True}
    body = {**GREEDY, "messages": TEXT, "chat_template": STRING_TEMPLATE, **options}
    status, http = await post(epd_url, body)
    async with AsyncEpdClient(GRPC[epd_url]) as client:
        answer = await client.generate(
            [user(TEXT[0]["content"])], max_tokens=10, chat_template=STRING_TEMPLATE, **options
        )
    assert status == 200, http
    assert len(http["prompt_token_ids"]) == 6 and http["usage"]["prompt_tokens"] == 6
    assert answer.prompt_token_ids == http["prompt_token_ids"]
    choice = http["choices"][0]
    assert (answer.text, answer.finish_reason) == (
        choice["message"]["content"],
        choice["finish_reason"],
    )
