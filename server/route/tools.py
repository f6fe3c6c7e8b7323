"""Tool calling and reasoning on both doors: ``vllm serve``'s flags and its parsers.

``ToolOptions`` holds ``--enable-auto-tool-choice``, ``--tool-call-parser`` and
``--reasoning-parser`` with vLLM's names and meanings; ``check_tool_options`` refuses a name
vLLM's registries do not hold, listing the ones they do; ``parser_class`` composes vLLM's own
``Parser`` of them for the model's tokenizer (``vllm.parser.ParserManager``), once at start.
Each request then uses it as ``vllm serve`` does (``tools_request``, ``tools_answer``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epd.common.flags import flag


@dataclass(frozen=True, slots=True)
class ToolOptions:
    """How the route (either door) parses tool calls and reasoning out of the generated text,
    and whether it trusts a request's chat template (flags in ``epd route --help``, as ``vllm
    serve``'s)."""

    enable_auto_tool_choice: bool = field(
        default=False,
        metadata=flag(
            "let the model choose when to call tools (tool_choice auto, the default when a "
            "request has tools), as vllm serve's flag; needs --tool-call-parser",
            env="EPD_ENABLE_AUTO_TOOL_CHOICE",
        ),
    )
    tool_call_parser: str | None = field(
        default=None,
        metadata=flag(
            "vLLM's tool call parser for the model's output (hermes, llama3_json, mistral, "
            "...), as vllm serve's flag: it turns the generated text into tool_calls",
            env="EPD_TOOL_CALL_PARSER",
            default_help="default: none",
        ),
    )
    reasoning_parser: str | None = field(
        default=None,
        metadata=flag(
            "vLLM's reasoning parser for the model's output (deepseek_r1, qwen3, ...), as vllm "
            "serve's flag: answers carry the model's reasoning apart from its content; the "
            "engines take the same flag, for structured outputs to start after the reasoning "
            "(epd up passes it to them)",
            env="EPD_REASONING_PARSER",
            default_help="default: none",
        ),
    )

    trust_request_chat_template: bool = field(
        default=False,
        metadata=flag(
            "render a chat request with its own chat_template (or chat_template_kwargs' "
            "chat_template), as vllm serve's flag; without it such a request is refused with "
            "vLLM's 400",
            env="EPD_TRUST_REQUEST_CHAT_TEMPLATE",
        ),
    )

    @property
    def is_set(self) -> bool:
        """Whether any parser is configured."""
        return bool(self.tool_call_parser or self.reasoning_parser)


def check_tool_options(options: ToolOptions) -> ToolOptions:
    """``options`` if vLLM would start with them; ValueError naming the flag (and, for an
    unknown parser, the names vLLM's registries hold) otherwise."""
    if options.enable_auto_tool_choice and not options.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
    if options.tool_call_parser:
        from vllm.tool_parsers import ToolParserManager

        _check_name("--tool-call-parser", options.tool_call_parser, ToolParserManager)
    if options.reasoning_parser:
        from vllm.reasoning import ReasoningParserManager

        _check_name("--reasoning-parser", options.reasoning_parser, ReasoningParserManager)
    return options


def _check_name(flag_name: str, name: str, registry: Any) -> None:
    names = registry.list_registered()
    if name not in names:
        choices = ", ".join(names)
        raise ValueError(f"{flag_name} {name}: no such parser in vLLM; choose from {choices}")


def parser_class(options: ToolOptions, tokenizer: Any, model_name: str) -> Any:
    """vLLM's ``Parser`` class composed of ``options``' parsers and checked against
    ``tokenizer`` (None: no parser configured, or a tool parser without
    ``--enable-auto-tool-choice``, which vLLM leaves unused too); ValueError when the tokenizer
    lacks what a parser needs."""
    if not options.is_set:
        return None
    from vllm.parser import ParserManager

    try:
        return ParserManager.get_parser(
            tool_parser_name=options.tool_call_parser,
            reasoning_parser_name=options.reasoning_parser,
            enable_auto_tools=options.enable_auto_tool_choice,
            model_name=model_name,
            tokenizer=tokenizer,
        )
    except (TypeError, KeyError, ValueError) as e:
        raise ValueError(str(e)) from None
