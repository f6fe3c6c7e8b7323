"""The SDK's answer options (beam search, the generation prompt, reasoning, the prompt's text and
token ids, echo, truncation, special tokens, reasoning effort, the chat template, documents) on
the GenerateRequest it builds, and the prompt's text and token ids on the chunks it returns."""

from __future__ import annotations

from epd.client import user
from epd.client.messages import build_request, join, to_chunk
from epd.v1 import route_service_pb2 as pb


def test_the_answer_options_land_on_the_request_as_given() -> None:
    request = build_request(
        [user("hi")],
        use_beam_search=True,
        length_penalty=0.5,
        add_generation_prompt=False,
        continue_final_message=True,
        include_reasoning=False,
        return_prompt_text=True,
        echo=True,
    )
    assert (request.use_beam_search, request.length_penalty) == (True, 0.5)
    assert request.HasField("add_generation_prompt") and not request.add_generation_prompt
    assert request.HasField("include_reasoning") and not request.include_reasoning
    assert request.continue_final_message and request.return_prompt_text and request.echo


def test_the_prompt_and_template_options_land_on_the_request_as_given() -> None:
    documents = [{"title": "Paris", "text": "sunny"}, {"text": "rain"}]
    request = build_request(
        [user("hi")],
        truncate_prompt_tokens=-1,
        truncation_side="right",
        add_special_tokens=True,
        return_token_ids=True,
        reasoning_effort="low",
        chat_template="{{ messages }}",
        documents=documents,
    )
    assert request.HasField("truncate_prompt_tokens") and request.truncate_prompt_tokens == -1
    assert (request.truncation_side, request.reasoning_effort) == ("right", "low")
    assert request.add_special_tokens and request.return_token_ids
    assert request.chat_template == "{{ messages }}"
    assert [dict(document) for document in request.documents] == documents


def test_absent_answer_options_leave_the_route_s_defaults() -> None:
    request = build_request([user("hi")])
    for name in ("length_penalty", "add_generation_prompt", "include_reasoning"):
        assert not request.HasField(name)
    assert not request.HasField("truncate_prompt_tokens")
    assert not (request.use_beam_search or request.echo or request.return_prompt_text)
    assert not (request.add_special_tokens or request.return_token_ids or request.documents)
    assert request.truncation_side == request.reasoning_effort == request.chat_template == ""


def test_the_prompt_text_is_the_first_chunk_s() -> None:
    first = to_chunk(pb.GenerateResponse(text="a", prompt_text="<user>hi"))
    later = to_chunk(pb.GenerateResponse(text="b"))
    assert (first.prompt_text, later.prompt_text) == ("<user>hi", "")
    assert join([first, later]).prompt_text == "<user>hi"


def test_the_prompt_token_ids_are_the_first_chunk_s() -> None:
    first = to_chunk(pb.GenerateResponse(text="a", prompt_token_ids=[7, 8, 9]))
    later = to_chunk(pb.GenerateResponse(text="b"))
    assert (first.prompt_token_ids, later.prompt_token_ids) == ([7, 8, 9], [])
    assert join([first, later]).prompt_token_ids == [7, 8, 9]
