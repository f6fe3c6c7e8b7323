"""Tool calling and reasoning on both doors: ``vllm serve``'s flags and its parsers.

``ToolOptions`` holds ``--enable-auto-tool-choice``, ``--tool-call-parser`` and
``--reasoning-parser`` with vLLM's names and meanings; ``check_tool_options`` refuses a name
vLLM's registries do not hold, listing the ones they do; ``parser_class`` composes vLLM's own
``Parser`` of them for the model's tokenizer (``vllm.parser.ParserManager``), once at start.
Each request then uses it as ``vllm serve`` does (``chat_step`` here, then ``tools_answer``).

A chat body's tools are taken as ``vllm serve`` takes them (no I/O). vLLM's
``OnlineRenderer.render_chat`` refuses a ``tool_choice`` no configured parser can serve, gives
the chat template the body's tools, and lets its ``Parser`` adjust the request: a ``required`` or
named choice (and, for parsers with a structural tag, ``auto``) constrains the output with a JSON
schema or a structural tag built from the tools, which then reaches the engine as the request's
structured output. ``prepare`` does the same with vLLM's classes, and returns the
``AnswerParsing`` that splits the generated text as vLLM's server does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epd.common.flags import flag
from epd.server.route.request import bad
from epd.server.route.tools_answer import AnswerParsing


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


AUTO_NEEDS_FLAGS = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)
# vLLM's refusal of a request's chat template when not started with --trust-request-chat-template
UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)


@dataclass(frozen=True, slots=True)
class ToolCalling:
    """The route's parsers: ``parser_cls`` is vLLM's composed ``Parser`` class (None: none
    configured), ``tokenizer`` the model's."""

    parser_cls: Any
    enable_auto_tools: bool
    tokenizer: Any

    @property
    def tool_parser_cls(self) -> Any:
        """vLLM's tool parser class, or None."""
        return self.parser_cls.tool_parser_cls if self.parser_cls is not None else None


def chat_step(
    parsed: Any, calling: ToolCalling | None, trust_chat_template: bool, param: str
) -> tuple[dict[str, Any], AnswerParsing | None]:
    """What both doors make of ``parsed`` (vLLM's ``ChatCompletionRequest``) before rendering:
    its chat template arguments and its answer's parsing (``prepare``; None: no tool or parser
    step). A request's own chat template without ``trust_chat_template`` is vLLM's refusal,
    naming ``param``."""
    if not trust_chat_template and (
        parsed.chat_template is not None
        or (parsed.chat_template_kwargs or {}).get("chat_template") is not None
    ):
        raise bad(UNTRUSTED_TEMPLATE, param)
    template_kwargs = parsed.build_chat_params(None, "auto").chat_template_kwargs
    parsing = None
    if calling is not None or parsed.tools is not None:
        parsing = prepare(parsed, calling, template_kwargs)
    return template_kwargs, parsing


def prepare(
    parsed: Any, calling: ToolCalling | None, template_kwargs: dict[str, Any]
) -> AnswerParsing | None:
    """Refuse ``parsed``'s tool choice as vLLM does when no parser serves it, put its tools in
    ``template_kwargs`` and adjust ``parsed`` (vLLM's ``ChatCompletionRequest``) in place with
    the parser's ``adjust_request``; the answer's parsing (None: no parser configured)."""
    _check_tool_choice(parsed, calling)
    if parsed.tools is not None:
        template_kwargs["tools"] = [tool.model_dump() for tool in parsed.tools]
    if calling is None or calling.parser_cls is None:
        return None
    parser_cls = calling.parser_cls
    if (
        parser_cls.always_adjust_request
        or parser_cls.reasoning_parser_cls is not None
        or parsed.tool_choice != "none"
    ):
        parser = parser_cls(calling.tokenizer, parsed.tools, chat_template_kwargs=template_kwargs)
        parser.adjust_request(request=parsed)
    return AnswerParsing(parsed, calling.parser_cls, calling.enable_auto_tools, calling.tokenizer)


def _check_tool_choice(parsed: Any, calling: ToolCalling | None) -> None:
    """vLLM's refusal of a ``tool_choice`` that needs a tool parser the route has not."""
    choice = parsed.tool_choice
    if choice in (None, "none") or (calling is not None and calling.tool_parser_cls is not None):
        return
    if choice == "auto":
        if calling is None or not calling.enable_auto_tools:
            raise bad(AUTO_NEEDS_FLAGS, "tool_choice")
        return
    shown = f'function "{choice.function.name}"' if choice != "required" else '"required"'
    raise bad(f"tool_choice={shown} requires --tool-call-parser to be set", "tool_choice")
