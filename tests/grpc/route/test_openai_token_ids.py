"""vLLM's ``return_token_ids`` on the OpenAI port, over the real router and prompt builder with
fakes behind it: the prompt's token ids as the engine holds them (each image's placeholder
expanded to its tokens) and each choice's generated ids, whole and streamed."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image

from epd.server.route import openai_schema as schema
from epd.server.route.openai_http import OpenAiHttp
from epd.server.route.prompt import PromptBuilder, Rendered
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fakes import FakePeers, model_router

ANSWER = [11, 12, 13]
buffer = io.BytesIO()
Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, format="PNG")
PNG_URL = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
TEXT = [{"role": "user", "content": "hi"}]
IMAGE = [
    {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": PNG_URL}},
            {"type": "text", "text": "what?"},
        ],
    }
]
BODY = {"model": "tiny", "max_tokens": 3, "messages": TEXT, "return_token_ids": True}


@pytest.fixture(scope="module")
def prompts(tiny_model_dir: Path) -> PromptBuilder:
    return PromptBuilder(tiny_model_dir)


@pytest.fixture
async def url(prompts: PromptBuilder, tiny_model_dir: Path) -> AsyncIterator[str]:
    peers = FakePeers(FakeScheduler(encoders=["enc0"]))
    peers.engines["pd0"] = FakeEngine(tokens=ANSWER)
    router = model_router(peers, prompts, tiny_model_dir)
    limits = schema.RequestLimits(max_context_tokens=prompts.max_context_tokens)
    http = OpenAiHttp(router, limits=limits)
    port = await http.start("127.0.0.1", 0)
    yield f"http://127.0.0.1:{port}/v1/chat/completions"
    await http.stop()


async def post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        if body.get("stream"):
            raw = (await response.read()).decode()
            events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
            return response.status, [json.loads(event) for event in events[:-1]]
        return response.status, await response.json()


def text_prompt(prompts: PromptBuilder) -> list[int]:
    request = schema.to_chat_request(BODY, "tiny")
    return prompts.token_ids(request.messages, request.template_kwargs)


async def test_a_whole_answer_carries_the_prompt_and_each_choices_token_ids(
    url: str, prompts: PromptBuilder
) -> None:
    status, answer = await post(url, BODY)
    assert status == 200, answer
    assert answer["prompt_token_ids"] == text_prompt(prompts)
    assert [choice["token_ids"] for choice in answer["choices"]] == [ANSWER]
    status, plain = await post(url, {**BODY, "return_token_ids": False})
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


async def test_the_prompt_holds_each_image_as_the_engine_expands_it(
    url: str, prompts: PromptBuilder
) -> None:
    status, answer = await post(url, {**BODY, "messages": IMAGE})
    assert status == 200, answer
    ids = answer["prompt_token_ids"]
    request = schema.to_chat_request({**BODY, "messages": IMAGE}, "tiny")
    rendered = prompts.token_ids(request.messages, request.template_kwargs)
    num_tokens = ids.count(prompts.image_pad_id)
    assert num_tokens > 1 and rendered.count(prompts.image_pad_id) == 1
    at = rendered.index(prompts.image_pad_id)
    assert ids == [*rendered[:at], *[prompts.image_pad_id] * num_tokens, *rendered[at + 1 :]]


async def test_a_stream_sends_the_prompt_first_and_the_token_ids_with_each_delta(
    url: str, prompts: PromptBuilder
) -> None:
    status, chunks = await post(url, {**BODY, "stream": True, "n": 2, "seed": 1})
    assert status == 200
    openings = [c for c in chunks if c["choices"][0]["delta"].get("role")]
    assert [c["prompt_token_ids"] for c in openings] == [text_prompt(prompts)] * 2
    for index in (0, 1):
        deltas = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert [t for d in deltas[1:] for t in d["token_ids"]] == ANSWER
        assert "token_ids" not in deltas[0]


def test_the_expanded_prompt_repeats_each_placeholder_to_its_tokens(
    prompts: PromptBuilder,
) -> None:
    image, video = prompts.image_pad_id, prompts.video_pad_id
    assert video is not None
    ids = [1, image, 2, video, 3, image]
    expanded = prompts.expanded_ids(ids, [2, 3], [4])
    assert expanded == [1, image, image, 2, *[video] * 4, 3, image, image, image]


async def test_a_truncated_prompt_reaches_the_engine_cut_and_an_image_is_never_cut(
    url: str, prompts: PromptBuilder
) -> None:
    body = {**BODY, "truncate_prompt_tokens": 5, "truncation_side": "left"}
    status, answer = await post(url, body)
    assert status == 200, answer
    assert answer["prompt_token_ids"] == text_prompt(prompts)[-5:]
    status, refused = await post(url, {**body, "messages": IMAGE, "truncate_prompt_tokens": 3})
    assert status == 400
    assert refused["error"]["param"] == "truncate_prompt_tokens"


async def test_a_reasoning_parser_reads_the_engines_prompt_tokenised_once(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As vLLM gives its parsers the engine's prompt_token_ids (each image expanded): the
    router's first chunk carries them, and the prompt is tokenised once, by the router."""
    from epd.server.route.tools import ToolCalling, ToolOptions, check_tool_options, parser_class
    from epd.server.route.tools_answer import AnswerParsing

    prompts = PromptBuilder(tiny_model_dir)
    prompts.tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    peers = FakePeers(FakeScheduler(encoders=["enc0"]))
    peers.engines["pd0"] = FakeEngine(tokens=ANSWER)
    router = model_router(peers, prompts, tiny_model_dir)
    options = check_tool_options(ToolOptions(reasoning_parser="deepseek_r1"))
    parser = parser_class(options, prompts.tokenizer, "tiny")
    tools = ToolCalling(parser, False, prompts.tokenizer)
    limits = schema.RequestLimits(max_context_tokens=prompts.max_context_tokens)
    http = OpenAiHttp(router, limits=limits, tools=tools)
    url = f"http://127.0.0.1:{await http.start('127.0.0.1', 0)}/v1/chat/completions"
    body = {"model": "tiny", "max_tokens": 3, "messages": IMAGE}
    status, answer = await post(url, {**body, "return_token_ids": True})
    assert status == 200, answer
    expanded = answer["prompt_token_ids"]
    assert len(expanded) > len(prompts.token_ids(schema.to_chat_request(body, "tiny").messages))
    tokenised, seen = [], []
    render, parser_of = PromptBuilder.render, AnswerParsing.parser

    def counted(self: PromptBuilder, *args: Any, **kwargs: Any) -> Rendered:
        tokenised.append(1)
        return render(self, *args, **kwargs)

    def watched(self: AnswerParsing, index: int) -> Any:
        seen.append(self.prompt_token_ids)
        return parser_of(self, index)

    monkeypatch.setattr(PromptBuilder, "render", counted)
    monkeypatch.setattr(AnswerParsing, "parser", watched)
    for stream in (False, True):
        tokenised.clear()
        status, _ = await post(url, {**body, "stream": stream})
        assert status == 200 and len(tokenised) == 1, "the router's tokenisation alone"
    assert seen and all(ids == expanded for ids in seen)
    await http.stop()
