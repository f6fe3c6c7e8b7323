"""Tools and reasoning on the OpenAI door: vllm serve's flags, vLLM's refusals, the tools'
constraint and template, and vLLM's parsers turning generated text into tool calls and
reasoning, whole and streamed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, cast

import pytest

from epd.common.errors import InvalidArgument
from epd.server.route import openai_schema as schema
from epd.server.route.cli import add_arguments
from epd.server.route.tools import (
    AUTO_NEEDS_FLAGS,
    ToolCalling,
    ToolOptions,
    check_tool_options,
    parser_class,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
BODY = {
    "model": "tiny",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "weather in Paris?"}],
    "tools": TOOLS,
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    return tokenizer


def calling(tokenizer: Any, **options: Any) -> ToolCalling:
    tools = check_tool_options(ToolOptions(**options))
    return ToolCalling(
        parser_class(tools, tokenizer, "tiny"), tools.enable_auto_tool_choice, tokenizer
    )


@pytest.fixture(scope="module")
def hermes(tokenizer: Any) -> ToolCalling:
    return calling(tokenizer, enable_auto_tool_choice=True, tool_call_parser="hermes")


def test_the_flags_are_vllm_serves_and_reach_the_options() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    args = parser.parse_args(["--model", "m", *flags, "--reasoning-parser", "deepseek_r1"])
    assert (args.enable_auto_tool_choice, args.tool_call_parser, args.reasoning_parser) == (
        True,
        "hermes",
        "deepseek_r1",
    )
    assert "--tool-call-parser" in parser.format_help()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"enable_auto_tool_choice": True}, ["--enable-auto-tool-choice requires"]),
        ({"tool_call_parser": "hermez"}, ["--tool-call-parser hermez", "hermes", "llama3_json"]),
        ({"reasoning_parser": "r2"}, ["--reasoning-parser r2", "deepseek_r1", "qwen3"]),
    ],
)
def test_a_bad_flag_is_a_clear_error_listing_vllms_parsers(
    options: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(ValueError) as caught:
        check_tool_options(ToolOptions(**options))
    assert all(word in str(caught.value) for word in words), caught.value


def test_a_parser_the_tokenizer_cannot_serve_is_a_clear_error(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(tiny_model_dir)  # NOTE: no <think> tokens
    with pytest.raises(ValueError, match="--reasoning-parser deepseek_r1"):
        parser_class(ToolOptions(reasoning_parser="deepseek_r1"), plain, "tiny")


def test_no_parser_configured_composes_none(tokenizer: Any) -> None:
    assert parser_class(ToolOptions(), tokenizer, "tiny") is None
    # NOTE: as in vLLM, a tool parser serves only with --enable-auto-tool-choice
    assert parser_class(ToolOptions(tool_call_parser="hermes"), tokenizer, "tiny") is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, AUTO_NEEDS_FLAGS),
        ({"tool_choice": "auto"}, AUTO_NEEDS_FLAGS),
        ({"tool_choice": "required"}, 'tool_choice="required" requires --tool-call-parser'),
        ({"tool_choice": NAMED}, 'function "get_weather" requires --tool-call-parser'),
    ],
)
def test_a_tool_choice_no_parser_serves_is_refused_as_vllm_refuses_it(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        schema.to_chat_request({**BODY, **fields}, "tiny")
    assert message in caught.value.message and caught.value.metadata["param"] == "tool_choice"


def test_vllms_own_validation_refuses_an_unknown_tool_and_empty_tools(hermes: ToolCalling) -> None:
    unknown = {"type": "function", "function": {"name": "nope"}}
    for fields in ({"tool_choice": unknown}, {"tools": []}):
        with pytest.raises(InvalidArgument):
            schema.to_chat_request({**BODY, **fields}, "tiny", tools=hermes)


def test_tools_reach_the_template_and_none_constrains_nothing() -> None:
    chat = schema.to_chat_request({**BODY, "tool_choice": "none"}, "tiny")
    assert chat.template_kwargs["tools"][0]["function"]["name"] == "get_weather"
    assert not chat.sampling.HasField("structured_output") and chat.answer_parsing is None


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_a_forced_choice_constrains_the_output_with_the_parsers_own_constraint(
    hermes: ToolCalling, choice: Any
) -> None:
    chat = schema.to_chat_request({**BODY, "tool_choice": choice}, "tiny", tools=hermes)
    constraint = chat.sampling.structured_output.structural_tag
    assert "<tool_call>" in constraint and "get_weather" in constraint
    assert chat.answer_parsing is not None


def test_a_whole_answer_is_parsed_into_tool_calls_as_vllm_does(
    hermes: ToolCalling, tokenizer: Any
) -> None:
    chat = schema.to_chat_request({**BODY}, "tiny", tools=hermes)
    assert chat.answer_parsing is not None
    text = "Let me look. " + CALL
    message, finish = chat.answer_parsing.message(0, text, tokenizer(text).input_ids, "stop")
    assert finish == "tool_calls" and message["content"] == "Let me look. "
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    plain, finish = chat.answer_parsing.message(1, "no tools", [1, 2], "length")
    assert (plain["content"], plain.get("tool_calls"), finish) == ("no tools", None, "length")


def streamed(chat: Any, tokenizer: Any, text: str) -> list[dict[str, Any] | None]:
    ids = tokenizer(text).input_ids
    return [
        chat.answer_parsing.delta(
            0, tokenizer.decode([token]), [token], "stop" if i == len(ids) - 1 else None
        )
        for i, token in enumerate(ids)
    ]


def test_a_streamed_answer_is_parsed_into_tool_call_deltas_as_vllm_does(
    hermes: ToolCalling, tokenizer: Any
) -> None:
    chat = schema.to_chat_request({**BODY, "stream": True}, "tiny", tools=hermes)
    deltas = [d for d in streamed(chat, tokenizer, "Hi " + CALL) if d]
    content = "".join(d.get("content") or "" for d in deltas)
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert content == "Hi " and calls[0]["function"] == {"name": "get_weather"}
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls[1:])) == {
        "city": "Paris"
    }
    assert chat.answer_parsing.finish_reason(0, "stop") == "tool_calls"


def test_a_named_choice_finishes_with_stop_and_required_with_tool_calls(
    hermes: ToolCalling, tokenizer: Any
) -> None:
    ids = tokenizer(CALL).input_ids
    named = schema.to_chat_request({**BODY, "tool_choice": NAMED}, "tiny", tools=hermes)
    assert named.answer_parsing is not None
    message, finish = named.answer_parsing.message(0, CALL, ids, "stop")
    assert finish == "stop" and message["tool_calls"][0]["function"]["name"] == "get_weather"
    required = schema.to_chat_request({**BODY, "tool_choice": "required"}, "tiny", tools=hermes)
    assert required.answer_parsing is not None
    assert required.answer_parsing.message(0, CALL, ids, "stop")[1] == "tool_calls"


def test_reasoning_is_split_from_the_content_whole_and_streamed(tokenizer: Any) -> None:
    deepseek = calling(tokenizer, reasoning_parser="deepseek_r1")
    body = {"model": "tiny", "messages": BODY["messages"]}
    chat = schema.to_chat_request(body, "tiny", tools=deepseek)
    assert chat.answer_parsing is not None and chat.answer_parsing.needs_prompt
    text = "<think>the sky</think>It is blue."
    message, _ = chat.answer_parsing.message(0, text, tokenizer(text).input_ids, "stop")
    assert (message["reasoning"], message["content"]) == ("the sky", "It is blue.")
    chat = schema.to_chat_request(body, "tiny", tools=deepseek)
    deltas = [d for d in streamed(chat, tokenizer, text) if d]
    assert "".join(d.get("reasoning") or "" for d in deltas) == "the sky"
    assert "".join(d.get("content") or "" for d in deltas) == "It is blue."
    hidden = schema.to_chat_request({**body, "include_reasoning": False}, "tiny", tools=deepseek)
    assert hidden.answer_parsing is not None
    message, _ = hidden.answer_parsing.message(0, text, tokenizer(text).input_ids, "stop")
    assert message["reasoning"] is None and hidden.answer_parsing.hides_metadata


def test_a_tool_conversation_reaches_the_template_as_vllm_gives_it() -> None:
    messages = [
        *BODY["messages"],
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call-1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call-1", "content": [{"type": "text", "text": "sun"}]},
    ]
    chat = schema.to_chat_request({**BODY, "messages": messages, "tool_choice": "none"}, "tiny")
    assistant, tool = chat.messages[1], chat.messages[2]
    assert assistant.parts == [] and assistant.template_fields["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert (tool.role, tool.template_fields) == (
        "tool",
        {"tool_call_id": "call-1", "content": "sun"},
    )


def test_epd_up_hands_the_tool_flags_to_the_route() -> None:
    from epd.launch.up_cli import add_arguments as add_up_arguments
    from epd.server.route.tools_cli import route_tool_flags

    parser = argparse.ArgumentParser()
    add_up_arguments(parser)
    flags = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    assert route_tool_flags(parser.parse_args(list(flags))) == flags
    assert route_tool_flags(parser.parse_args([])) == ()
    with pytest.raises(ValueError, match="--tool-call-parser hermez"):
        route_tool_flags(parser.parse_args(["--tool-call-parser", "hermez"]))


def test_the_chat_template_sees_the_tools_and_the_calls_as_vllm_passes_them(
    tiny_model_dir: Path,
) -> None:
    from epd.server.route.prompt import PromptBuilder

    template = (tiny_model_dir / "chat_template.jinja").read_text() + (
        "{% for tool in tools or [] %}[tool {{ tool.function.name }}]{% endfor %}"
        "{% for m in messages %}{% for call in m.tool_calls or [] %}"
        "[call {{ call.function.arguments.city }}]{% endfor %}"
        "{% if m.tool_call_id %}[result {{ m.tool_call_id }}: {{ m.content }}]{% endif %}"
        "{% endfor %}"
    )
    prompts = PromptBuilder(tiny_model_dir, chat_template=template)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather"}}
    call["function"]["arguments"] = '{"city": "Paris"}'
    messages = [
        *BODY["messages"],
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sun"}]},
    ]
    chat = schema.to_chat_request({**BODY, "messages": messages, "tool_choice": "none"}, "tiny")
    text = prompts.tokenizer.decode(prompts.token_ids(chat.messages, chat.template_kwargs))
    assert "[tool get_weather][call Paris][result c1: sun]" in text


def test_echo_goes_before_the_parsed_content_unparsed_as_vllm_puts_it(
    hermes: ToolCalling, tokenizer: Any
) -> None:
    from epd.server.route.openai_answers import Answer
    from epd.server.route.openai_http import ChatApi

    messages = [*BODY["messages"], {"role": "assistant", "content": CALL}]
    body = {**BODY, "messages": messages, "add_generation_prompt": False}
    body.update(continue_final_message=True, echo=True)
    chat = schema.to_chat_request(body, "tiny", tools=hermes)
    assert chat.echo == CALL
    answer = Answer(["Sunny."], token_ids=tokenizer("Sunny.").input_ids)
    (choice,) = ChatApi(cast(Any, None)).whole(chat, [answer])["choices"]
    assert choice["message"]["content"] == CALL + "Sunny.", "the echo is not parsed"
    assert not choice["message"].get("tool_calls") and choice["finish_reason"] == "stop"
    tool = schema.to_chat_request({**BODY, "echo": True}, "tiny", tools=hermes)
    assert tool.echo == "" and tool.answer_parsing is not None
    answer = Answer([CALL], token_ids=tokenizer(CALL).input_ids)
    (choice,) = ChatApi(cast(Any, None)).whole(tool, [answer])["choices"]
    assert choice["message"]["content"] == "", "vLLM: echo asked, the parsed None made ''"
