"""A request's own ``chat_template``: refused as vLLM refuses it, unless the route runs with
``--trust-request-chat-template``; then rendered as vLLM renders it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from epd.common.errors import InvalidArgument
from epd.server.route import openai_answers
from epd.server.route import openai_schema as schema
from epd.server.route.prompt import PromptBuilder

# reads the content as parts (vLLM's "openai" format), with Qwen2-VL's image placeholder
PARTS = (
    "{% for m in messages %}<<{{ m.role }}>>{% for p in m.content %}{% if p.type == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ p.text }}{% endif %}{% endfor %}"
    "\n{% endfor %}<<assistant>>"
)
# reads the content as one string (vLLM's "string" format)
STRING = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"
TEXT = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}


@pytest.fixture(scope="module")
def builder(tiny_model_dir: Path) -> PromptBuilder:
    return PromptBuilder(tiny_model_dir)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 3, "messages": TEXT, **fields}


def prompt(builder: PromptBuilder, request_body: dict[str, Any]) -> str:
    request = schema.to_chat_request(request_body, "tiny", trust_chat_template=True)
    token_ids = builder.token_ids(request.messages, request.template_kwargs, request.chat_template)
    return str(builder.tokenizer.decode(token_ids))


@pytest.mark.parametrize(
    "fields", [{"chat_template": PARTS}, {"chat_template_kwargs": {"chat_template": PARTS}}]
)
def test_an_untrusted_request_template_is_refused_with_vllms_message(
    fields: dict[str, Any],
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        schema.to_chat_request(body(**fields), "tiny")
    assert str(caught.value.message) == (
        "Chat template is passed with request, but --trust-request-chat-template is not set. "
        "Refused request with untrusted chat template."
    )
    assert caught.value.metadata["param"] == "chat_template"
    status, _ = openai_answers.error_body(caught.value)
    assert status == 400


def test_a_trusted_request_template_renders_the_chat(builder: PromptBuilder) -> None:
    # NOTE: transformers renders with trim_blocks, for vLLM as for epd
    assert prompt(builder, body(chat_template=PARTS)) == "<<user>>ab<<assistant>>"
    # NOTE: vLLM gives a template that reads the content as a string the texts joined by "\n"
    assert prompt(builder, body(chat_template=STRING)) == "[user] a\nb\n[assistant]"
    assert prompt(builder, body()).startswith("<|im_start|>")


def test_a_trusted_template_keeps_one_placeholder_per_image(builder: PromptBuilder) -> None:
    chat = [{"role": "user", "content": [IMAGE, {"type": "text", "text": "what?"}]}]
    request = schema.to_chat_request(
        body(messages=chat, chat_template=PARTS), "tiny", trust_chat_template=True
    )
    ids = builder.token_ids(request.messages, request.template_kwargs, request.chat_template)
    assert ids.count(builder.image_pad_id) == 1
    with pytest.raises(InvalidArgument, match="each image or video part") as caught:
        builder.token_ids(request.messages, request.template_kwargs, STRING)
    assert caught.value.metadata["param"] == "chat_template"


@pytest.mark.parametrize(
    ("template", "reason"),
    [("{% for m in messages %}", "does not render"), ("{{ raise_exception('no') }}", "no")],
)
def test_a_request_template_that_does_not_render_is_a_bad_request_naming_it(
    builder: PromptBuilder, template: str, reason: str
) -> None:
    with pytest.raises(InvalidArgument, match=reason) as caught:
        prompt(builder, body(chat_template=template))
    assert caught.value.metadata["param"] == "chat_template"


def test_a_trusted_chat_template_among_the_template_arguments_is_the_template(
    builder: PromptBuilder, tiny_model_dir: Path
) -> None:
    """As vLLM's ``ChatParams.get_apply_chat_template_kwargs``: the body's ``chat_template``,
    else the route's ``--chat-template``, else the arguments' one."""
    in_arguments = body(chat_template_kwargs={"chat_template": PARTS})
    assert prompt(builder, in_arguments) == "<<user>>ab<<assistant>>"
    both = {**in_arguments, "chat_template": STRING}
    assert prompt(builder, both) == "[user] a\nb\n[assistant]"
    custom = PromptBuilder(tiny_model_dir, PARTS.replace("<<", "(("))
    assert prompt(custom, in_arguments) == "((user>>ab((assistant>>"


def test_epd_up_hands_the_trust_flag_to_the_route() -> None:
    from epd.launch.up_cli import add_arguments as add_up_arguments
    from epd.server.route.tools_cli import route_tool_flags

    parser = argparse.ArgumentParser()
    add_up_arguments(parser)
    flags = ("--trust-request-chat-template",)
    assert route_tool_flags(parser.parse_args(list(flags))) == flags
    assert route_tool_flags(parser.parse_args([])) == ()
