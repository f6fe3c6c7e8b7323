"""The prompt as ``vllm serve`` shows it, from epd alike: ``return_token_ids``,
``return_prompt_text``, and cuts (``truncate_prompt_tokens``) around an image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.compat.vllm_serve.bodies import BEAMS, CHAT, GREEDY, TEXT
from tests.integration.compat.vllm_serve.exchange import post, streamed

pytestmark = pytest.mark.vllm


def token_ids_shown(answer: dict[str, Any]) -> tuple[Any, ...]:
    """A whole answer's prompt token ids and each choice's generated ids."""
    choices = sorted(answer["choices"], key=lambda c: c["index"])
    return answer["prompt_token_ids"], [c["token_ids"] for c in choices]


def streamed_token_ids(chunks: list[dict[str, Any]]) -> tuple[Any, ...]:
    """A stream's prompt token ids (on each choice's first chunk) and each choice's ids."""
    prompts = [c["prompt_token_ids"] for c in chunks if c.get("prompt_token_ids") is not None]
    ids: dict[int, list[int]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            ids.setdefault(choice["index"], []).extend(choice.get("token_ids") or [])
    return prompts, sorted(ids.items())


@pytest.mark.parametrize(
    "body",
    [
        {**GREEDY, "return_token_ids": True},
        {**GREEDY, "messages": TEXT, "return_token_ids": True, "n": 2, "temperature": 1, "seed": 4},
        {**BEAMS, "n": 3, "return_token_ids": True, "include_stop_str_in_output": True},
    ],
    ids=["image", "text_n", "beam_search"],
)
async def test_return_token_ids_are_vllms(
    vllm_url: str, epd_url: str, body: dict[str, Any]
) -> None:
    await assert_same_token_ids(vllm_url, epd_url, body)


async def assert_same_token_ids(vllm_url: str, epd_url: str, body: dict[str, Any]) -> None:
    """``body`` (with return_token_ids) gets the same prompt and generated ids from both, whole
    and streamed."""
    answers = [await post(url, body) for url in (vllm_url, epd_url)]
    assert [status for status, _ in answers] == [200, 200], answers
    expected, answer = (token_ids_shown(reply) for _, reply in answers)
    assert answer == expected
    assert len(answer[0]) == answers[1][1]["usage"]["prompt_tokens"]
    stream = {**body, "stream": True}
    chunks = [await streamed(url, stream, "chat/completions") for url in (vllm_url, epd_url)]
    assert streamed_token_ids(chunks[1]) == streamed_token_ids(chunks[0])


@pytest.mark.parametrize("side", ["left", "right"])
async def test_a_truncated_image_prompt_is_vllms(vllm_url: str, epd_url: str, side: str) -> None:
    """Two tokens less than the whole prompt (the image expanded), on either side: the image
    is kept whole, the prompt's ids are vLLM's."""
    status, whole = await post(vllm_url, {**GREEDY, "return_token_ids": True})
    assert status == 200
    keep = len(whole["prompt_token_ids"]) - 2
    body = {**GREEDY, "return_token_ids": True, "truncate_prompt_tokens": keep}
    await assert_same_token_ids(vllm_url, epd_url, {**body, "truncation_side": side})


@pytest.mark.parametrize(
    "body",
    [
        {**GREEDY, "return_prompt_text": True},
        {**GREEDY, "messages": TEXT, "return_prompt_text": True, "n": 2, "temperature": 1},
        {
            **GREEDY,
            "messages": CHAT,
            "add_generation_prompt": False,
            "continue_final_message": True,
            "return_prompt_text": True,
        },
        {**GREEDY, "messages": TEXT, "truncate_prompt_tokens": 5, "return_prompt_text": True},
        {**GREEDY, "return_prompt_text": False},
        {**BEAMS, "n": 2, "return_prompt_text": True},
    ],
    ids=["image", "text_n", "continued", "truncated", "not_asked", "beam_search"],
)
async def test_return_prompt_text_is_vllms(
    vllm_url: str, epd_url: str, body: dict[str, Any]
) -> None:
    """The chat template's text as vLLM shows it: on the whole answer, and on each choice's
    first streamed chunk."""
    answers = [await post(url, body) for url in (vllm_url, epd_url)]
    assert [status for status, _ in answers] == [200, 200], answers
    expected, answer = (reply.get("prompt_text") for _, reply in answers)
    assert answer == expected
    assert (expected is not None) == bool(body["return_prompt_text"])
    stream = {**body, "stream": True}
    shown = []
    for url in (vllm_url, epd_url):
        chunks = await streamed(url, stream, "chat/completions")
        texts = [c.get("prompt_text") for c in chunks if c["choices"] and c.get("prompt_text")]
        shown.append(texts)
    assert shown[1] == shown[0]
    assert len(shown[0]) == (max(body.get("n", 1), 1) if body["return_prompt_text"] else 0)


async def test_a_cut_through_an_image_is_refused(
    vllm_url: str, epd_url: str, tiny_model_dir: Path
) -> None:
    """A bound that keeps the image's placeholder but not its expanded first token: vLLM's 400,
    naming truncate_prompt_tokens. One that drops the placeholder before expansion: vLLM fails
    with a 500 (its processor finds no placeholder), epd with the same 400."""
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(tiny_model_dir).convert_tokens_to_ids("<|image_pad|>")
    status, whole = await post(vllm_url, {**GREEDY, "return_token_ids": True})
    prompt = whole["prompt_token_ids"]
    assert status == 200 and prompt.count(pad) >= 2
    body = {**GREEDY, "truncation_side": "left"}
    through = {**body, "truncate_prompt_tokens": len(prompt) - prompt.index(pad) - 1}
    dropped = {**body, "truncate_prompt_tokens": 3}
    replies = [await post(url, sent) for sent in (through, dropped) for url in (vllm_url, epd_url)]
    assert [status for status, _ in replies] == [400, 400, 500, 400], replies
    assert [reply["error"]["param"] for _, reply in replies[1::2]] == ["truncate_prompt_tokens"] * 2
