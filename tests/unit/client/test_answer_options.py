"""The SDK's answer options (beam search, the generation prompt, reasoning, the prompt's text,
echo) on the GenerateRequest it builds, and the prompt's text on the chunks it returns."""

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


def test_absent_answer_options_leave_the_route_s_defaults() -> None:
    request = build_request([user("hi")])
    for name in ("length_penalty", "add_generation_prompt", "include_reasoning"):
        assert not request.HasField(name)
    assert not (request.use_beam_search or request.echo or request.return_prompt_text)


def test_the_prompt_text_is_the_first_chunk_s() -> None:
    first = to_chunk(pb.GenerateResponse(text="a", prompt_text="<user>hi"))
    later = to_chunk(pb.GenerateResponse(text="b"))
    assert (first.prompt_text, later.prompt_text) == ("<user>hi", "")
    assert join([first, later]).prompt_text == "<user>hi"
