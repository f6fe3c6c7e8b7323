"""Tool calls from ``vllm serve`` and from epd (both with the hermes parser): the same streamed
calls; the ``openai`` client's structured-output and tool-call flows run unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from tests.integration.compat.vllm_serve.bodies import NAMED, TEXT, TOOL_GREEDY
from tests.integration.compat.vllm_serve.exchange import streamed, streamed_calls

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("choice", ["required", NAMED, "auto"], ids=["required", "named", "auto"])
async def test_a_streamed_tool_call_is_vllms(vllm_url: str, epd_url: str, choice: Any) -> None:
    body = {**TOOL_GREEDY, "tool_choice": choice, "stream": True}
    answers = [
        streamed_calls(await streamed(url, body, "chat/completions")) for url in (vllm_url, epd_url)
    ]
    assert answers[1] == answers[0]
    if choice != "auto":  # NOTE: the constraint makes even the tiny model call the tool
        assert answers[0][1][0][1][1] == "verdict"


class Verdict(BaseModel):
    """The answer the openai client's flows parse."""

    ok: bool


async def test_the_openai_clients_structured_output_and_tool_call_flows(
    vllm_url: str, epd_url: str, tiny_model_dir: Path
) -> None:
    """``parse`` with a pydantic model, and a named tool call whose arguments parse into it."""
    from transformers import AutoTokenizer

    # NOTE: the random tiny model would fill JSON's optional whitespace up to max_tokens (vLLM
    # 0.32 takes disable_any_whitespace from the engine's config only): bias it away.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    blanks = {str(i): -100 for i in range(len(tokenizer)) if not tokenizer.decode([i]).strip()}
    named = {"type": "function", "function": {"name": "Verdict"}}
    kwargs: dict[str, Any] = {"model": "tiny", "messages": TEXT, "temperature": 0}
    kwargs.update(max_tokens=64, logit_bias=blanks)
    answers = []
    for url in (vllm_url, epd_url):
        client = openai.AsyncOpenAI(base_url=url, api_key="unused")
        structured = await client.chat.completions.parse(response_format=Verdict, **kwargs)
        tool = openai.pydantic_function_tool(Verdict)
        called = await client.chat.completions.parse(tools=[tool], tool_choice=named, **kwargs)
        await client.close()
        (call,) = called.choices[0].message.tool_calls or []
        answers.append((structured.choices[0].message.parsed, call.function.parsed_arguments))
    assert answers[1] == answers[0]
    assert isinstance(answers[0][0], Verdict) and isinstance(answers[0][1], Verdict)
