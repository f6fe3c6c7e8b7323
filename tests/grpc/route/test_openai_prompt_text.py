"""vLLM's ``return_prompt_text`` on the OpenAI port, over the real router and prompt builder
with fakes behind it: the chat template's text as the route rendered it (each image one
placeholder, as vLLM's answer shows it), on the whole answer and on each choice's first
streamed chunk only; null on a whole answer that did not ask, absent from its stream."""

from __future__ import annotations

from typing import Any

from epd.server.route import openai_schema as schema
from epd.server.route.prompt import PromptBuilder
from tests.grpc.route.test_openai_token_ids import IMAGE, post, prompts, url

__all__ = ["prompts", "url"]
BODY: dict[str, Any] = {"model": "tiny", "max_tokens": 3, "messages": IMAGE}


def template_text(prompts: PromptBuilder, body: dict[str, Any]) -> str:
    """The chat template's text of ``body``'s chat, as the tokenizer renders it."""
    request = schema.to_chat_request(body, "tiny")
    chat = [
        {
            "role": m.role,
            "content": [
                {"type": "image"} if p.image else {"type": "text", "text": p.text} for p in m.parts
            ],
        }
        for m in request.messages
    ]
    return str(
        prompts.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    )


async def test_a_whole_answer_carries_the_rendered_prompt_when_asked(
    url: str, prompts: PromptBuilder
) -> None:
    status, answer = await post(url, {**BODY, "return_prompt_text": True})
    assert status == 200, answer
    text = template_text(prompts, BODY)
    assert answer["prompt_text"] == text and text.count("<|image_pad|>") == 1
    assert text.endswith("<|im_start|>assistant\n")
    status, plain = await post(url, {**BODY, "return_prompt_text": False})
    assert (status, plain["prompt_text"]) == (200, None)


async def test_a_stream_carries_it_on_each_choices_first_chunk(
    url: str, prompts: PromptBuilder
) -> None:
    body = {**BODY, "return_prompt_text": True, "stream": True, "n": 2, "temperature": 1}
    status, chunks = await post(url, body)
    assert status == 200
    shown = [(c["choices"][0]["index"], c.get("prompt_text")) for c in chunks]
    text = template_text(prompts, BODY)
    assert shown[:2] == [(0, text), (1, text)]
    assert all(prompt_text is None for _, prompt_text in shown[2:])
    status, plain = await post(url, {**BODY, "stream": True})
    assert status == 200 and all("prompt_text" not in c for c in plain)
