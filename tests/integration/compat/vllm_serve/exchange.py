"""A body posted to a server and its answer read: the status and JSON, a stream's chunks, and what
must be equal (choices, logprobs, prompt logprobs, streamed tool calls)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest


async def post(
    url: str, body: dict[str, Any], path: str = "chat/completions"
) -> tuple[int, dict[str, Any]]:
    """The status and JSON answer of ``body`` posted to ``url``/``path`` (nulls left out)."""
    sent = {name: value for name, value in body.items() if value is not None}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/{path}", json=sent) as response,
    ):
        return response.status, await response.json(content_type=None)


async def streamed(url: str, body: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """The chunks of ``body``'s server-sent stream from ``url``/``path`` (which must end with
    ``[DONE]``)."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/{path}", json=body) as response,
    ):
        assert response.status == 200
        raw = (await response.read()).decode()
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


def choices(answer: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What must be equal: each choice's text, reasoning, finish reason, logprobs (tokens, top
    ones) and tool calls (name and arguments; their ids are random)."""
    result = []
    for choice in sorted(answer["choices"], key=lambda c: c["index"]):
        logprobs = (choice.get("logprobs") or {}).get("content") or []
        tokens = [(e["token"], [t["token"] for t in e["top_logprobs"]]) for e in logprobs]
        message = choice["message"]
        calls = [
            (call["type"], call["function"]["name"], call["function"]["arguments"])
            for call in message.get("tool_calls") or []
        ]
        shown = (message["content"], message.get("reasoning"), choice["finish_reason"])
        result.append((*shown, tokens, calls))
    return result


def prompt_logprob_values(reply: dict[str, Any]) -> list[Any]:
    """Each prompt position's candidates (id, rank, text) and their log probabilities, from a
    chat answer's prompt_logprobs or each completion choice's."""
    lists = [reply.get("prompt_logprobs")] + [c.get("prompt_logprobs") for c in reply["choices"]]
    positions = [position for listed in lists for position in listed or []]
    return [
        position and [(i, p["rank"], p["decoded_token"], p["logprob"]) for i, p in position.items()]
        for position in positions
    ]


def logprob_values(answer: dict[str, Any]) -> list[float]:
    return [
        entry["logprob"]
        for choice in sorted(answer["choices"], key=lambda c: c["index"])
        for entry in ((choice.get("logprobs") or {}).get("content") or [])
    ]


def assert_same_prompt_logprobs(answer: dict[str, Any], expected: dict[str, Any]) -> None:
    """The same prompt log probabilities: the same candidates, ranks and texts, and log
    probabilities within float tolerance."""
    shown, wanted = prompt_logprob_values(answer), prompt_logprob_values(expected)
    strip = [p and [c[:3] for c in p] for p in shown]
    assert strip == [p and [c[:3] for c in p] for p in wanted]
    values = [c[3] for p in shown for c in p or []]
    assert values == pytest.approx([c[3] for p in wanted for c in p or []], abs=1e-3)


def streamed_calls(chunks: list[dict[str, Any]]) -> tuple[str, list[Any], str | None]:
    """A streamed answer's content, tool calls (index, type, name, arguments as streamed, all
    but ids) and finish reason."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], [call.get("type"), "", ""])
                function = call.get("function") or {}
                entry[1] += function.get("name") or ""
                entry[2] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return content, sorted(calls.items()), finish
