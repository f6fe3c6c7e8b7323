"""A GenerateRequest's answer options, taken as the OpenAI chat door takes a body's (no I/O, no
grpc).

``echo``, ``return_prompt_text``, ``return_token_ids``, ``add_special_tokens``,
``truncate_prompt_tokens``, ``truncation_side``, ``use_beam_search`` and ``length_penalty`` mean
what an OpenAI chat body's fields of those names mean: ``add_options`` sets them on the
``ChatRequest`` with the OpenAI door's own code (``chat_echo.echo_text``; vLLM's
``ChatCompletionRequest`` parsing the truncation's and the beam search's fields,
``openai_schema.kept_tokens`` reading the truncation and ``openai_schema.vllm_sampling`` making
a beam search's sampling, so a beam search reads of the request's sampling what vLLM's does).
The chat template and its own options (``chat_template``, ``add_generation_prompt``,
``continue_final_message``, ``reasoning_effort``, ``documents``) and ``include_reasoning`` go
with the tool fields through the door's chat step (``tools_proto``).
"""

from __future__ import annotations

from typing import Any

from epd.server.route.chat_echo import echo_text
from epd.server.route.openai_schema import (
    kept_tokens,
    parse_with,
    take_beam_search,
    vllm_sampling,
)
from epd.server.route.request import ChatRequest, bad
from epd.server.route.sampling import IS_VLLM_INSTALLED
from epd.v1 import generation_pb2
from epd.v1 import route_service_pb2 as pb


def add_options(chat: ChatRequest, request: pb.GenerateRequest, context: int | None = None) -> None:
    """Give ``chat`` (``request.from_proto``'s of ``request``, its tool fields taken) what the
    OpenAI chat door makes of ``request``'s echo, return_prompt_text, return_token_ids,
    add_special_tokens, truncation and beam search. ``context``: the model's context in tokens
    (None: unknown), the bound of truncate_prompt_tokens."""
    chat.return_prompt_text = request.return_prompt_text
    chat.return_token_ids = request.return_token_ids
    chat.add_special_tokens = request.add_special_tokens
    if request.HasField("truncate_prompt_tokens") or request.truncation_side:
        _take_truncation(chat, request, context)
    if request.echo:
        chat.echo = echo_text(chat.messages, adds_generation_prompt(request))
    if request.use_beam_search:
        _take_beam_search(chat, request)


def adds_generation_prompt(request: pb.GenerateRequest) -> bool:
    """``request``'s add_generation_prompt (unset: true, vLLM's default)."""
    return not request.HasField("add_generation_prompt") or request.add_generation_prompt


def _take_truncation(chat: ChatRequest, request: pb.GenerateRequest, context: int | None) -> None:
    """``chat``'s prompt cut as the OpenAI door cuts a body's (vLLM's checks, then
    ``kept_tokens``); a truncation_side without truncate_prompt_tokens is checked, not used."""
    if not IS_VLLM_INSTALLED:
        raise bad("truncate_prompt_tokens needs vLLM on the route", "truncate_prompt_tokens")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    fields: dict[str, Any] = {"messages": [], "max_tokens": chat.sampling.max_tokens or None}
    if request.HasField("truncate_prompt_tokens"):
        fields["truncate_prompt_tokens"] = request.truncate_prompt_tokens
    if request.truncation_side:
        fields["truncation_side"] = request.truncation_side
    parsed = parse_with(ChatCompletionRequest, fields)
    if parsed.truncate_prompt_tokens is not None:
        chat.truncate_prompt_tokens = kept_tokens(parsed, context)
        chat.truncation_side = parsed.truncation_side


def _take_beam_search(chat: ChatRequest, request: pb.GenerateRequest) -> None:
    """``chat``'s sampling made a beam search's, as the OpenAI door makes it of a body."""
    if not IS_VLLM_INSTALLED:
        raise bad("use_beam_search needs vLLM on the route", "use_beam_search")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    parsed = parse_with(ChatCompletionRequest, {"messages": [], **beam_fields(chat, request)})
    chat.sampling = vllm_sampling(parsed, chat.sampling.max_tokens, {})
    take_beam_search(parsed, chat)


def beam_fields(chat: ChatRequest, request: pb.GenerateRequest) -> dict[str, Any]:
    """The fields of ``chat``'s sampling a beam search reads (vLLM's ``to_beam_search_params``
    and the log probabilities it shows), and ``request``'s length_penalty, as an OpenAI chat
    body spells them."""
    sampling: generation_pb2.SamplingParams = chat.sampling
    fields: dict[str, Any] = {
        "use_beam_search": True,
        "n": sampling.n or 1,
        "temperature": sampling.temperature,
        "ignore_eos": sampling.ignore_eos,
        "include_stop_str_in_output": sampling.include_stop_str_in_output,
    }
    if sampling.HasField("skip_special_tokens"):
        fields["skip_special_tokens"] = sampling.skip_special_tokens
    if sampling.HasField("logprobs"):
        fields.update(logprobs=True, top_logprobs=sampling.logprobs)
    if sampling.cache_salt:
        fields["cache_salt"] = sampling.cache_salt
    if request.HasField("length_penalty"):
        fields["length_penalty"] = request.length_penalty
    return fields
