"""A chat body's tools, as ``vllm serve`` takes them (no I/O).

vLLM's ``OnlineRenderer.render_chat`` refuses a ``tool_choice`` no configured parser can serve,
gives the chat template the body's tools, and lets its ``Parser`` adjust the request: a
``required`` or named choice (and, for parsers with a structural tag, ``auto``) constrains the
output with a JSON schema or a structural tag built from the tools, which then reaches the
engine as the request's structured output. ``prepare`` does the same with vLLM's classes, and
returns the ``AnswerParsing`` that splits the generated text as vLLM's server does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from epd.server.route.request import bad
from epd.server.route.tools_answer import AnswerParsing

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
