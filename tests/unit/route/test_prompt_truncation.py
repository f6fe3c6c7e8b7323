"""vLLM's ``truncate_prompt_tokens``, ``truncation_side`` and ``add_special_tokens`` on a chat:
the prompt cut as vLLM cuts it (before the images are expanded and after), a cut through an
image refused as vLLM refuses it, and the tokenizer's special tokens added when asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from epd.common.errors import InvalidArgument
from epd.server.route import openai_schema as schema
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
CONTEXT = schema.RequestLimits(max_context_tokens=100)


@pytest.fixture(scope="module")
def builder(tiny_model_dir: Path) -> PromptBuilder:
    return PromptBuilder(tiny_model_dir)


def converted(**fields: Any) -> Any:
    return schema.to_chat_request({**BODY, **fields}, "tiny", limits=CONTEXT)


def test_the_bound_is_vllms_and_minus_one_is_the_context() -> None:
    assert converted(truncate_prompt_tokens=7).truncate_prompt_tokens == 7
    assert converted().truncate_prompt_tokens is None
    # NOTE: vLLM keeps one token of the context for the answer when max_tokens is set
    assert converted(truncate_prompt_tokens=-1).truncate_prompt_tokens == 100
    assert converted(truncate_prompt_tokens=-1, max_tokens=5).truncate_prompt_tokens == 99
    request = converted(truncate_prompt_tokens=3, truncation_side="left")
    assert request.truncation_side == "left"
    with pytest.raises(InvalidArgument) as caught:
        converted(truncate_prompt_tokens=101)
    assert caught.value.message == (
        "truncate_prompt_tokens=101 cannot be greater than max_model_len = 100. Please request "
        "a smaller truncation size."
    )
    assert caught.value.metadata["param"] == "truncate_prompt_tokens"
    with pytest.raises(InvalidArgument):
        converted(truncate_prompt_tokens=-2)


def test_text_is_cut_on_the_side_asked_or_vllms(builder: PromptBuilder) -> None:
    ids = list(range(100, 110))
    assert builder.truncated(ids, 4, "left", [], []) == ids[-4:]
    assert builder.truncated(ids, 4, "right", [], []) == ids[:4]
    # NOTE: vLLM gives a generating model's tokenizer truncation_side left, whatever its own
    assert builder.tokenizer.truncation_side == "right"
    assert builder.truncated(ids, 4, None, [], []) == ids[-4:]
    assert builder.truncated(ids, 20, "left", [], []) == ids


def test_an_image_counts_its_expanded_tokens_and_is_never_cut(builder: PromptBuilder) -> None:
    pad = builder.image_pad_id
    ids = [1, 2, 3, pad, 4, 5, 6, 7]  # NOTE: the image expands to 4 tokens: 11 in all
    assert builder.truncated(ids, 9, "left", [4], []) == [3, pad, 4, 5, 6, 7]
    assert builder.truncated(ids, 9, "right", [4], []) == [1, 2, 3, pad, 4, 5]
    for keep, side in ((5, "left"), (6, "right"), (2, "left")):
        with pytest.raises(InvalidArgument, match="would split or drop") as caught:
            builder.truncated(ids, keep, side, [4], [])
        assert caught.value.metadata["param"] == "truncate_prompt_tokens"


class RecordingTokenizer:
    """A tokenizer that records the ``add_special_tokens`` it is called with."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, text: str, **kwargs: Any) -> Any:
        self.calls.append(kwargs["add_special_tokens"])
        return self.inner(text, **kwargs)


def test_special_tokens_are_added_only_when_asked(tiny_model_dir: Path) -> None:
    """As vLLM's chat: none by default (the template writes its own), the tokenizer's when the
    request asks (the tiny Qwen2 tokenizer adds none, so the call is what is checked)."""
    builder = PromptBuilder(tiny_model_dir)
    recording = RecordingTokenizer(builder.tokenizer)
    builder.tokenizer = recording
    chat = [ChatMessage("user", [ChatPart(text="hi")])]
    assert builder.token_ids(chat) == builder.token_ids(chat, add_special_tokens=True)
    assert recording.calls == [False, True]
    assert converted().add_special_tokens is False
    assert converted(add_special_tokens=True).add_special_tokens is True
