"""A text's token ids straight from the Rust tokenizer: the ids transformers' call gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from epd.server.route.text_tokens import text_token_ids

CHAT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
TEXTS = [CHAT, "", " ", "  two  spaces\n\n\ttab", "日本語のテキスト 🙂", "a" * 3000]


@pytest.fixture
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def wrapper_ids(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def direct_ids(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    """``text_token_ids`` with transformers' wrapper made to fail: the Rust tokenizer's ids."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("went through transformers' call")

    tokenizer._encode_plus = refuse
    try:
        return text_token_ids(tokenizer, text, add_special_tokens)
    finally:
        del tokenizer._encode_plus


@pytest.mark.parametrize("add_special_tokens", [False, True])
@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_the_wrappers(tokenizer: Any, text: str, add_special_tokens: bool) -> None:
    expected = wrapper_ids(tokenizer, text, add_special_tokens)
    assert direct_ids(tokenizer, text, add_special_tokens) == expected


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=200))
def test_any_text_gets_the_wrappers_ids(tiny_model_dir: Path, text: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert direct_ids(tokenizer, text, False) == wrapper_ids(tokenizer, text, False)


def test_a_truncation_left_by_an_earlier_call_does_not_cut(tokenizer: Any) -> None:
    """transformers leaves a truncating call's setting on the Rust tokenizer until its next
    call; the ids are still the untruncated call's."""
    tokenizer(TEXTS[-1], truncation=True, max_length=3)
    assert tokenizer._tokenizer.truncation is not None
    ids = text_token_ids(tokenizer, TEXTS[-1], False)
    assert len(ids) > 3 and ids == wrapper_ids(tokenizer, TEXTS[-1], False)


def test_special_token_splitting_is_the_wrappers(tokenizer: Any) -> None:
    whole = text_token_ids(tokenizer, CHAT, False)
    tokenizer.split_special_tokens = True
    split = wrapper_ids(tokenizer, CHAT, False)
    tokenizer._tokenizer.encode_special_tokens = False
    assert text_token_ids(tokenizer, CHAT, False) == split != whole


def test_a_class_with_its_own_call_goes_through_it(tokenizer: Any) -> None:
    class Shifted(type(tokenizer)):  # type: ignore[misc]
        def __call__(self, text: str, **kwargs: Any) -> Any:
            return {"input_ids": [7, *super().__call__(text, **kwargs)["input_ids"]]}

    tokenizer.__class__ = Shifted
    assert text_token_ids(tokenizer, "hi", False)[0] == 7
