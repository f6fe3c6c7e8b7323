"""Chat rendering, image grids and multimodal block hashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from epd.server.route.prompt import BLOCK_SIZE, PromptBuilder
from epd.server.route.request import ChatMessage, ChatPart, ImageSource

IMAGE = ImageSource(url="u")


@pytest.fixture(scope="module")
def builder(tiny_model_dir: Path) -> PromptBuilder:
    return PromptBuilder(tiny_model_dir)


def test_prompt_has_one_placeholder_group_per_image(builder: PromptBuilder) -> None:
    ids = builder.token_ids(
        [
            ChatMessage(
                "user", [ChatPart(image=IMAGE), ChatPart(image=IMAGE), ChatPart(text="compare")]
            )
        ]
    )
    assert ids.count(builder.image_pad_id) == 2
    text = builder.tokenizer.decode(ids)
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 2
    assert text.rstrip().endswith("assistant")


def test_block_hashes_share_prefixes_and_tell_images_apart(builder: PromptBuilder) -> None:
    pad = builder.image_pad_id
    prompt = [1] * 20 + [pad] + [2] * 40
    same = builder.block_hashes(prompt, [("aa11", 24)])
    assert len(same) == (20 + 24 + 40) // BLOCK_SIZE
    assert same == builder.block_hashes(prompt, [("aa11", 24)])
    other = builder.block_hashes(prompt, [("bb22", 24)])
    assert other[0] == same[0] and other[1:] != same[1:]  # block 0 is text only
    longer = builder.block_hashes(prompt + [3] * 16, [("aa11", 24)])
    assert longer[: len(same)] == same  # chained: a longer prompt extends the same chain
    changed_text = builder.block_hashes([9] + prompt[1:], [("aa11", 24)])
    assert all(a != b for a, b in zip(changed_text, same, strict=True))


def test_the_builder_knows_the_models_context_and_counts_characters(
    builder: PromptBuilder,
) -> None:
    """(Chats are checked before they reach the builder: ``test_request_check``.)"""
    chat = [
        ChatMessage("system", [ChatPart(text="x" * 60)]),
        ChatMessage("user", [ChatPart(text="y" * 41)]),
    ]
    assert builder.num_chars(chat) == 101
    assert builder.max_context_tokens == 4096


def test_llava_prompts_hold_one_image_token_per_image_and_hash_images_apart(
    tiny_family_dir,
) -> None:
    """LLaVA-1.5's template emits ``<image>`` alone per image (its images first); each is one
    image's placeholder, expanded to its rows for the block hashes."""
    llava = PromptBuilder(tiny_family_dir("llava"))
    parts = [ChatPart(text="compare"), ChatPart(image=IMAGE), ChatPart(image=IMAGE)]
    ids = llava.token_ids([ChatMessage("user", parts)])
    assert ids.count(llava.image_pad_id) == 2
    assert llava.tokenizer.decode(ids).count("<image>") == 2
    rows = 64
    same = llava.block_hashes(ids, [("aa11", rows), ("bb22", rows)])
    assert len(same) == (len(ids) - 2 + 2 * rows) // BLOCK_SIZE
    swapped = llava.block_hashes(ids, [("bb22", rows), ("aa11", rows)])
    assert swapped != same


def test_internvl_prompts_hash_each_image_between_its_delimiters(tiny_family_dir) -> None:
    """InternVL's template emits ``<IMG_CONTEXT>`` alone per image; engines expand it to
    ``<img>``, the rows, ``</img>``, so the block hashes count the two delimiters too."""
    internvl = PromptBuilder(tiny_family_dir("internvl"))
    parts = [ChatPart(image=IMAGE), ChatPart(text="compare"), ChatPart(image=IMAGE)]
    ids = internvl.token_ids([ChatMessage("user", parts)])
    assert ids.count(internvl.image_pad_id) == 2
    assert internvl.tokenizer.decode(ids).count("<IMG_CONTEXT>\n") == 2
    start, end = internvl.tokenizer.convert_tokens_to_ids(["<img>", "</img>"])
    assert (internvl.image_start_ids, internvl.image_end_ids) == ([start], [end])
    rows = [80, 48]
    same = internvl.block_hashes(ids, [("aa11", rows[0]), ("bb22", rows[1])])
    # NOTE: 15 text tokens + 128 rows fill 8 blocks; with the 4 delimiters, 9.
    assert len(ids) - 2 + sum(rows) == 143
    assert len(same) == (143 + 2 * 2) // BLOCK_SIZE == 9
    assert internvl.block_hashes(ids, [("aa11", rows[0]), ("cc33", rows[1])]) != same
    assert same[0] != internvl.block_hashes(ids, [("bb22", rows[0]), ("bb22", rows[1])])[0]


def test_the_request_s_template_arguments_shape_the_prompt_as_vllm_passes_them(
    builder: PromptBuilder,
) -> None:
    from epd.server.route import openai_schema as schema

    def prompt(**fields: object) -> str:
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello the"},
        ]
        body = {"model": "tiny", "max_tokens": 2, "messages": messages, **fields}
        request = schema.to_chat_request(body, "tiny")
        return str(
            builder.tokenizer.decode(builder.token_ids(request.messages, request.template_kwargs))
        )

    opened = prompt()
    assert opened.endswith("Hello the<|im_end|>\n<|im_start|>assistant\n")
    assert prompt(add_generation_prompt=False).endswith("Hello the<|im_end|>\n")
    continued = prompt(add_generation_prompt=False, continue_final_message=True)
    assert continued.endswith("<|im_start|>assistant\nHello the")
    assert prompt(chat_template_kwargs={"not_a_variable": 1}) == opened


def test_a_template_that_refuses_the_chat_is_a_bad_request(builder: PromptBuilder) -> None:
    from epd.common.errors import InvalidArgument

    user = ChatMessage("user", [ChatPart(text="hi")])
    with pytest.raises(InvalidArgument) as caught:
        builder.token_ids([user], {"continue_final_message": True})
    assert caught.value.metadata["param"] == "messages"
