"""The generated text split into content, reasoning and tool calls, as ``vllm serve`` splits it
(no I/O).

vLLM's ``OpenAIServingChat`` hands each completion's whole text to its ``Parser.parse`` (a whole
answer) or each delta to ``Parser.parse_delta`` (a stream), one parser per completion, and
writes ``message.tool_calls`` / ``delta.tool_calls``, ``reasoning`` and the ``tool_calls``
finish reason where it decides so. ``AnswerParsing`` does the same with vLLM's own classes, so
answers are vLLM's to the byte but for their ids.
"""

from __future__ import annotations

from typing import Any


class AnswerParsing:
    """The parsing of one request's completions: ``request`` is vLLM's ``ChatCompletionRequest``
    (adjusted by the parser), ``parser_cls`` vLLM's composed ``Parser`` class.
    ``prompt_token_ids``: the prompt, which reasoning parsers look at, as the engine holds it
    (the router's first chunk, as vLLM gives its parsers the engine's prompt_token_ids), or as
    rendered where a structured output's start is judged before the engines answer (None: not
    known yet)."""

    def __init__(
        self, request: Any, parser_cls: Any, enable_auto_tools: bool, tokenizer: Any
    ) -> None:
        self.request = request
        self.parser_cls = parser_cls
        self.enable_auto_tools = enable_auto_tools
        self.tokenizer = tokenizer
        self.prompt_token_ids: list[int] | None = None
        self._parsers: dict[int, Any] = {}
        self._tools_streamed: set[int] = set()

    @property
    def needs_prompt(self) -> bool:
        """Whether the parsers look at the prompt (a reasoning parser is configured)."""
        return self.parser_cls.reasoning_parser_cls is not None

    @property
    def hides_metadata(self) -> bool:
        """Whether logprobs are left out of the answer (reasoning asked hidden), as vLLM does."""
        return not self.request.include_reasoning

    def parser(self, index: int) -> Any:
        """Completion ``index``'s parser (parsers keep state: one per completion)."""
        if index not in self._parsers:
            kwargs = self.request.build_chat_params(None, "auto").chat_template_kwargs
            parser = self.parser_cls(
                self.tokenizer, self.request.tools, chat_template_kwargs=kwargs
            )
            if self.prompt_token_ids is not None:
                parser.set_prompt_token_ids(self.prompt_token_ids)
            self._parsers[index] = parser
        return self._parsers[index]

    def message(
        self, index: int, text: str, token_ids: list[int], finish_reason: str
    ) -> tuple[dict[str, Any], str]:
        """Completion ``index``'s whole message and finish reason (vLLM's
        ``chat_completion_full_generator``)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatMessage

        request = self.request
        reasoning, content, calls = self.parser(index).parse(
            text,
            request,
            enable_auto_tools=self.enable_auto_tools,
            model_output_token_ids=token_ids,
        )
        if not request.include_reasoning:
            reasoning = None
        fields: dict[str, Any] = {"role": "assistant", "reasoning": reasoning, "content": content}
        is_forced = self._is_named() or request.tool_choice == "required"
        is_auto = (
            request.tools
            and request.tool_choice in ("auto", None)
            and self.enable_auto_tools
            and self.parser_cls.tool_parser_cls is not None
        )
        if is_forced:
            fields.update(content=content or "", tool_calls=_tool_calls(calls))
        elif is_auto and calls:
            fields["tool_calls"] = _tool_calls(calls)
        if request.parallel_tool_calls is False and fields.get("tool_calls"):
            fields["tool_calls"] = fields["tool_calls"][:1]
        is_tool_finish = (is_auto and bool(calls)) or (
            request.tool_choice == "required" and finish_reason == "stop"
        )
        return ChatMessage(**fields).model_dump(), "tool_calls" if is_tool_finish else finish_reason

    def delta(
        self, index: int, text: str, token_ids: list[int], finish_reason: str | None
    ) -> dict[str, Any] | None:
        """The ``delta`` of completion ``index``'s next chunk (vLLM's
        ``chat_completion_stream_generator``); None: the parser holds the text back (vLLM then
        sends the chunk only when it ends the completion or carries logprobs, with an empty
        delta)."""
        delta = self.parser(index).parse_delta(
            delta_text=text,
            delta_token_ids=token_ids,
            request=self.request,
            # NOTE: the parser starts on tool calls only once it has seen a prompt.
            prompt_token_ids=self.prompt_token_ids or [],
            finished=finish_reason is not None,
        )
        if delta is not None and delta.tool_calls:
            self._tools_streamed.add(index)
        if delta is None:
            return None
        if self.request.parallel_tool_calls is False and delta.tool_calls:
            delta.tool_calls = [call for call in delta.tool_calls if call.index == 0]
        dumped: dict[str, Any] = delta.model_dump(exclude_unset=True)
        return dumped

    def parse_choices(
        self, choices: list[dict[str, Any]], answers: list[Any], echo: str = ""
    ) -> None:
        """Rewrite the whole answer's ``choices`` (``openai_answers.completion``'s, in the order
        of ``answers``, each an ``openai_answers.Answer``) with each completion's parsed message
        and finish reason; where the request asked for ``echo``, the content starts with
        ``echo``, put there after the parsers, which never see it, as vLLM does."""
        for choice, answer in zip(choices, answers, strict=True):
            text = "".join(answer.texts)
            message, finish = self.message(
                choice["index"], text, answer.token_ids, choice["finish_reason"]
            )
            if self.request.echo:
                message["content"] = echo + (message["content"] or "")
            choice.update(message=message, finish_reason=finish)
            if self.hides_metadata:
                choice["logprobs"] = None

    def parsed_chunk(
        self, payload: dict[str, Any], index: int, text: str, token_ids: list[int]
    ) -> dict[str, Any] | None:
        """A streamed chat chunk ``payload`` of completion ``index`` (``text``, ``token_ids``)
        with its delta and finish reason as vLLM's parsers make them (None: the parser holds
        the text back and the chunk carries nothing else)."""
        entry = payload["choices"][0]
        if self.hides_metadata:
            entry["logprobs"] = None
            entry.pop("token_ids", None)
        delta = self.delta(index, text, token_ids, entry["finish_reason"])
        # NOTE: as vLLM: a chunk with token ids is sent though the parser holds its text back
        is_empty = entry["finish_reason"] is None and entry["logprobs"] is None
        if delta is None and is_empty and entry.get("token_ids") is None:
            return None
        entry["delta"] = delta or {}
        if entry["finish_reason"] is not None:
            entry["finish_reason"] = self.finish_reason(index, entry["finish_reason"])
        return payload

    def finish_reason(self, index: int, finish_reason: str) -> str:
        """Completion ``index``'s streamed finish reason: ``tool_calls`` when tools were streamed
        and the choice was not a named one, as vLLM says."""
        if index in self._tools_streamed and not self._is_named() and finish_reason == "stop":
            return "tool_calls"
        return finish_reason

    def _is_named(self) -> bool:
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionNamedToolChoiceParam,
        )

        return type(self.request.tool_choice) is ChatCompletionNamedToolChoiceParam


def _tool_calls(calls: list[Any] | None) -> list[Any]:
    from vllm.entrypoints.generate.base.protocol import ToolCall
    from vllm.renderers.chat_utils import make_tool_call_id

    return [ToolCall(id=call.id or make_tool_call_id(), function=call) for call in calls or []]
