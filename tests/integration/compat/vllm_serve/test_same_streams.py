"""Streams from ``vllm serve`` and from epd: a streamed chat answer or completion is the whole one,
and ``stream_interval`` batches the deltas as vLLM does."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.compat.vllm_serve.bodies import GREEDY, PROMPT, TEXT
from tests.integration.compat.vllm_serve.exchange import post, streamed

pytestmark = pytest.mark.vllm


async def test_a_streamed_answer_is_the_whole_answer(vllm_url: str, epd_url: str) -> None:
    body = {**GREEDY, "stream": True, "stream_options": {"include_usage": True}}
    texts = []
    for url in (vllm_url, epd_url):
        chunks = await streamed(url, body, "chat/completions")
        deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
        texts.append(("".join(deltas), chunks[-1]["usage"]["completion_tokens"]))
    assert texts[1] == texts[0]
    status, whole = await post(epd_url, GREEDY)
    assert status == 200 and whole["choices"][0]["message"]["content"] == texts[0][0]


async def test_a_streamed_completion_is_the_whole_one(vllm_url: str, epd_url: str) -> None:
    body = {**PROMPT, "echo": True, "stream": True, "stream_options": {"include_usage": True}}
    texts = []
    for url in (vllm_url, epd_url):
        chunks = await streamed(url, body, "completions")
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        texts.append((text, chunks[-1]["usage"]["completion_tokens"]))
    assert texts[1] == texts[0]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("chat/completions", {**GREEDY, "messages": TEXT, "n": 2, "temperature": 1, "seed": 5}),
        ("completions", {**PROMPT, "echo": True, "logprobs": 1}),
    ],
    ids=["chat", "completions"],
)
async def test_stream_interval_batches_the_deltas_as_vllm_does(
    vllm_url: str, epd_url: str, path: str, body: dict[str, Any]
) -> None:
    """The first output at once, then at least k tokens a chunk, the last with what is left.
    NOTE: neither the exact chunks nor the first one's size are compared: vLLM's own reader joins
    outputs it has not taken yet (RequestOutputCollector), and epd's engines hand the route tokens
    likewise, so a first chunk may hold two tokens (CI saw [2, 3, 3, 3] from one of them)."""
    stream = {**body, "max_tokens": 11, "ignore_eos": True, "stream": True, "stream_interval": 3}
    stream["return_token_ids"] = True
    joined = []
    for url in (vllm_url, epd_url):
        groups: dict[int, list[list[int]]] = {}
        for chunk in await streamed(url, stream, path):
            for choice in chunk["choices"]:
                if choice.get("token_ids"):
                    groups.setdefault(choice["index"], []).append(choice["token_ids"])
        for ids in groups.values():
            assert all(len(group) >= 3 for group in ids[1:-1]), ids
            assert len(ids) <= 5, ids
        joined.append({index: sum(ids, []) for index, ids in groups.items()})
    assert joined[1] == joined[0]
