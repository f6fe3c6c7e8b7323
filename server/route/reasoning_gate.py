"""Where a chat's structured output starts on a reasoning model, as ``vllm serve
--reasoning-parser`` decides it (no I/O).

vLLM's chat server judges the rendered prompt with its composed ``Parser``
(``ChatCompletionRequest.resolve_reasoning_ended``) and hands the verdict, and the request's
chat template arguments for the engine's own reasoning parser, to the engine beside the
sampling. ``gate_structured_output`` writes the same onto the ``StructuredOutput`` the prefill
and decode workers get (``engine.vllm_inputs.generate_options`` passes it to vLLM).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from epd.server.route.tools_answer import AnswerParsing
from epd.v1 import generation_pb2

if TYPE_CHECKING:
    from epd.server.route.prompt import PromptBuilder
    from epd.server.route.request import ChatRequest


def gate_request(chat: ChatRequest, prompts: PromptBuilder) -> None:
    """Where ``chat``'s structured output starts (``gate_structured_output``), either door's
    request: judged on the prompt ``prompts`` renders, before the engines answer, where a
    reasoning parser reads it (else the parsers get the prompt from the router's first chunk,
    as the engine holds it). Nothing for a request without a structured output."""
    if not chat.sampling.HasField("structured_output"):
        return
    parsing = chat.answer_parsing
    if parsing is not None and parsing.needs_prompt:
        parsing.prompt_token_ids = prompts.token_ids(
            chat.messages, chat.template_kwargs, chat.chat_template, chat.add_special_tokens
        )
    gate_structured_output(chat.sampling, parsing)


def gate_structured_output(
    sampling: generation_pb2.SamplingParams, parsing: AnswerParsing | None
) -> None:
    """Set ``sampling``'s structured output's ``reasoning_ended`` and ``chat_template_kwargs``
    as vLLM's chat server sets them (``parsing.prompt_token_ids``: the rendered prompt). Without
    a reasoning parser on the route the constraint holds from the first token, as ``vllm serve``
    without one constrains, whatever parser the engines have. Called only for a sampling with
    a structured output."""
    constraint = sampling.structured_output
    if parsing is None or parsing.parser_cls.reasoning_parser_cls is None:
        constraint.reasoning_ended = True
        return
    request = parsing.request
    kwargs = request.build_chat_params(None, "auto").chat_template_kwargs
    parser = parsing.parser_cls(parsing.tokenizer, request.tools, chat_template_kwargs=kwargs)
    ended = request.resolve_reasoning_ended(parser, parsing.prompt_token_ids or [])
    if ended is not None:
        constraint.reasoning_ended = ended
    constraint.chat_template_kwargs = json.dumps(kwargs, default=str)
