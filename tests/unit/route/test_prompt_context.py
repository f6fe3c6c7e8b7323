"""A prompt whose images expand beyond the model's context is refused at the route, as the
engines refuse it (400 PROMPT_TOO_LONG), before any image is sent to an encoder; one that fits
is encoded and answered."""

from __future__ import annotations

from pathlib import Path

import pytest

from epd.common.errors import InvalidArgument
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart, ChatRequest, ImageSource
from tests.pictures import picture, png
from tests.unit.route.fake_encoder import FakeEncoder
from tests.unit.route.fakes import FakePeers, model_router

# NOTE: the tiny Qwen2-VL's chat around one picture and "hi", the picture's rows
# included: 28 tokens at 56x56 (4 rows), 88 at 224x224 (64 rows)
CONTEXT = 50


def image_chat(size: int) -> ChatRequest:
    parts = [ChatPart(image=ImageSource(data=png(picture(3, size, size)))), ChatPart(text="hi")]
    return ChatRequest(f"r{size}", "tiny", [ChatMessage("user", parts)], return_token_ids=True)


async def test_an_image_beyond_the_context_is_refused_before_it_is_encoded(
    tiny_model_dir: Path,
) -> None:
    prompts = PromptBuilder(tiny_model_dir)
    prompts.max_context_tokens = CONTEXT
    encoder = FakeEncoder("enc0")
    router = model_router(FakePeers(encoders={"enc0": encoder}), prompts, tiny_model_dir)
    fits = [chunk async for chunk in router.generate(image_chat(56), timeout_s=5)]
    assert len(fits[0].prompt_token_ids or []) < CONTEXT and len(encoder.requests) == 1
    with pytest.raises(InvalidArgument) as caught:
        _ = [chunk async for chunk in router.generate(image_chat(224), timeout_s=5)]
    assert caught.value.reason == "PROMPT_TOO_LONG"
    assert caught.value.metadata["param"] == "messages"
    assert "expands to 88 tokens; the model's context is 50 tokens" in str(caught.value)
    assert len(encoder.requests) == 1
