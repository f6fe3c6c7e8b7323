"""The OpenAI port with vLLM's hermes tool parser, in-process over a Router stand-in that
streams a tool call token by token: the whole answer's tool_calls and finish reason, the stream's
tool-call deltas, and a route without the parser refusing automatic tool choice."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from epd.server.route.openai_http import OpenAiHttp
from epd.server.route.router import RouteChunk
from epd.server.route.tools import AUTO_NEEDS_FLAGS, ToolCalling, ToolOptions, parser_class
from epd.v1 import generation_pb2

CALL = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
BODY = {
    "model": "tiny",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "weather in Paris?"}],
    "tools": [TOOL],
}


class CallingWorker:
    """A Router stand-in streaming ``CALL`` one token a chunk."""

    model_id = "tiny"

    def __init__(self, tokenizer: Any) -> None:
        self.token_ids: list[int] = tokenizer(CALL, add_special_tokens=False).input_ids
        self.tokenizer = tokenizer

    async def generate(
        self, request: Any, timeout_s: float | None = None
    ) -> AsyncIterator[RouteChunk]:
        for index, token in enumerate(self.token_ids):
            is_last = index == len(self.token_ids) - 1
            finish = generation_pb2.FINISH_REASON_STOP if is_last else 0
            usage = generation_pb2.Usage(prompt_tokens=9, completion_tokens=index + 1)
            yield RouteChunk(
                self.tokenizer.decode([token]), [token], finish, usage if is_last else None
            )


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


async def started(tokenizer: Any, with_parser: bool) -> tuple[OpenAiHttp, str]:
    calling = None
    if with_parser:
        options = ToolOptions(enable_auto_tool_choice=True, tool_call_parser="hermes")
        calling = ToolCalling(parser_class(options, tokenizer, "tiny"), True, tokenizer)
    http = OpenAiHttp(CallingWorker(tokenizer), tools=calling)  # type: ignore[arg-type]
    port = await http.start("127.0.0.1", 0)
    return http, f"http://127.0.0.1:{port}/v1/chat/completions"


async def post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.text()


async def test_a_whole_answer_carries_the_parsed_tool_call(tokenizer: Any) -> None:
    http, url = await started(tokenizer, with_parser=True)
    try:
        status, text = await post(url, {**BODY})
    finally:
        await http.stop()
    assert status == 200, text
    (choice,) = json.loads(text)["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Sure. "
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


async def test_a_stream_carries_tool_call_deltas(tokenizer: Any) -> None:
    http, url = await started(tokenizer, with_parser=True)
    try:
        status, text = await post(url, {**BODY, "stream": True})
    finally:
        await http.stop()
    assert status == 200, text
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event)["choices"][0] for event in events[:-1]]
    deltas = [chunk["delta"] for chunk in chunks]
    calls = [call for delta in deltas for call in delta.get("tool_calls") or []]
    arguments = "".join(call["function"].get("arguments") or "" for call in calls)
    assert "".join(delta.get("content") or "" for delta in deltas) == "Sure. "
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1]["finish_reason"] == "tool_calls"
    # NOTE: the parser holds back the tag's text: fewer chunks than tokens
    assert len(chunks) < len(CallingWorker(tokenizer).token_ids) + 1


async def test_without_the_parser_automatic_tool_choice_is_vllms_400(tokenizer: Any) -> None:
    http, url = await started(tokenizer, with_parser=False)
    try:
        status, text = await post(url, {**BODY})
        plain_status, plain = await post(url, {**BODY, "tool_choice": "none"})
    finally:
        await http.stop()
    assert (status, json.loads(text)["error"]["message"]) == (400, AUTO_NEEDS_FLAGS)
    message = json.loads(plain)["choices"][0]["message"]
    assert plain_status == 200 and message == {"role": "assistant", "content": CALL}
