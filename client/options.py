"""The SDK's request options: one typed set of keywords, vLLM's sampling options among them, and
their ``SamplingParams``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from epd.client.tools import Tool
from epd.common.generation import SAMPLING_DEFAULTS
from epd.v1 import generation_pb2


class RequestOptions(TypedDict, total=False):
    """Keywords of ``build_request``, ``stream`` and ``generate``; each means what it means in
    vLLM's ``SamplingParams``, and an absent one takes the default stated.

    - ``model``: the deployment's only model when empty.
    - ``max_tokens``: None, the route's default (the rest of the model's context).
    - ``temperature`` (0: greedy), ``top_p`` (1), ``top_k`` (0: off), ``min_p`` (0: off),
      ``seed`` (None: random).
    - ``stop``, ``stop_token_ids``, ``ignore_eos``, ``min_tokens``,
      ``include_stop_str_in_output``.
    - ``presence_penalty``, ``frequency_penalty`` (0), ``repetition_penalty`` (1).
    - ``logit_bias`` (token id -> bias), ``bad_words``, ``allowed_token_ids``.
    - ``logprobs``: None for none, k for the generated token's with the k most likely beside it
      (``Chunk.logprobs``); ``prompt_logprobs`` likewise for each prompt token
      (``Chunk.prompt_logprobs``, computed by the prefill worker); ``logprob_token_ids``: the
      generated token's with these ids' beside it instead of the most likely ones.
    - ``skip_special_tokens``, ``spaces_between_special_tokens`` (True): special tokens left out
      of the text, or kept with or without a space between two of them.
    - ``priority`` (0; lower first, where the engine schedules by priority), ``cache_salt``
      ("": unsalted; requests share cached KV only with the same salt).
    - ``n``: completions to generate (``Chunk.index`` tells them apart).
    - One structured output at most: ``json_schema`` (a schema, as a dict or JSON text),
      ``json_object``, ``regex``, ``choice`` or ``grammar``.
    - ``mm_processor_kwargs``, ``media_io_kwargs``: vLLM's per-request multimodal options (a
      video's sampling and pixel budget, as vLLM's fields; the route takes them only when
      started with ``--trust-request-mm-kwargs``).
    - ``tools``: functions the model may call, each a ``Tool`` or an OpenAI ``tools`` entry
      (``{"type": "function", "function": {...}}``); the calls come back as
      ``Chunk.tool_calls`` where the route has a tool parser (``--tool-call-parser``).
    - ``tool_choice``: "none", "auto" (the default with tools; needs the route's
      ``--enable-auto-tool-choice``), "required", or a named function as OpenAI writes it
      (``{"type": "function", "function": {"name": ...}}``).
    - ``parallel_tool_calls`` (True): whether one answer may call several tools.
    - ``chat_template_kwargs``: arguments for the chat template and the route's parsers, as
      vLLM's (``{"enable_thinking": False}``).
    - ``stream_interval`` (1): each completion streamed at least this many tokens a chunk.
    - ``use_beam_search`` (False): vLLM's beam search, ``n`` beams wide, its ``n`` best beams
      the completions (each in one chunk), ranked with ``length_penalty`` (1.0); of the other
      options it reads what vLLM's does (max_tokens, temperature, ignore_eos,
      include_stop_str_in_output, skip_special_tokens, logprobs, cache_salt).
    - ``add_generation_prompt`` (True): the chat template opens the assistant's turn;
      ``continue_final_message`` (False): the answer continues the chat's last message (an
      assistant's opened ``<think>``, say), which needs ``add_generation_prompt=False``.
    - ``include_reasoning`` (True): the answer carries ``Chunk.reasoning`` where the route has
      a reasoning parser; False drops it.
    - ``return_prompt_text`` (False): each completion's first chunk carries the prompt as the
      chat template wrote it (``Chunk.prompt_text``).
    - ``echo`` (False): each completion starts with the last message's text when its role is
      the answer's (a chunk of its own), as vLLM's chat ``echo``.
    - ``truncate_prompt_tokens`` (None: no cut): how many of the prompt's tokens the engine
      keeps, -1 for the model's context; ``truncation_side``: "left" (the default) keeps the
      last ones, "right" the first.
    - ``add_special_tokens`` (False): the tokenizer's special tokens (a BOS) added to the
      prompt on top of the chat template's.
    - ``return_token_ids`` (False): each completion's first chunk carries the prompt's token
      ids as the engine holds them (``Chunk.prompt_token_ids``).
    - ``reasoning_effort``: given to the chat template ("none", "minimal", "low", "medium",
      "high", "xhigh", "max"), as vLLM's.
    - ``chat_template``: a Jinja chat template for this request (the route takes it only when
      started with ``--trust-request-chat-template``).
    - ``documents``: documents for the chat template's retrieval-augmented generation, each a
      mapping of strings (``{"title": ..., "text": ...}``).
    - ``encoder_policy``: "per_image", "per_request", "adaptive" or "" (the deployment's).
    - ``request_id``: the route makes one up when empty.
    """

    model: str
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None
    stop: Sequence[str]
    stop_token_ids: Sequence[int]
    ignore_eos: bool
    min_tokens: int
    include_stop_str_in_output: bool
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    logit_bias: Mapping[int, float]
    bad_words: Sequence[str]
    allowed_token_ids: Sequence[int]
    logprobs: int | None
    prompt_logprobs: int | None
    logprob_token_ids: Sequence[int]
    skip_special_tokens: bool
    spaces_between_special_tokens: bool
    priority: int
    cache_salt: str
    n: int
    json_schema: Mapping[str, Any] | str
    json_object: bool
    regex: str
    choice: Sequence[str]
    grammar: str
    mm_processor_kwargs: Mapping[str, Any]
    media_io_kwargs: Mapping[str, Any]
    tools: Sequence[Tool | Mapping[str, Any]]
    tool_choice: str | Mapping[str, Any]
    parallel_tool_calls: bool
    chat_template_kwargs: Mapping[str, Any]
    stream_interval: int
    use_beam_search: bool
    length_penalty: float
    add_generation_prompt: bool
    continue_final_message: bool
    include_reasoning: bool
    return_prompt_text: bool
    echo: bool
    truncate_prompt_tokens: int
    truncation_side: str
    add_special_tokens: bool
    return_token_ids: bool
    reasoning_effort: str
    chat_template: str
    documents: Sequence[Mapping[str, str]]
    encoder_policy: str
    request_id: str


# The options that land in SamplingParams as they are.
_PLAIN = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "ignore_eos",
    "min_tokens",
    "include_stop_str_in_output",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "n",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "priority",
    "cache_salt",
)
_LISTS = ("stop", "stop_token_ids", "bad_words", "allowed_token_ids", "logprob_token_ids")
_CONSTRAINTS = ("json_schema", "json_object", "regex", "choice", "grammar")
_REQUEST = ("model", "encoder_policy", "request_id")
# The GenerateRequest's own answer options, set as they are.
_ANSWER = (
    "use_beam_search",
    "length_penalty",
    "add_generation_prompt",
    "continue_final_message",
    "include_reasoning",
    "return_prompt_text",
    "echo",
    "truncate_prompt_tokens",
    "truncation_side",
    "add_special_tokens",
    "return_token_ids",
    "reasoning_effort",
    "chat_template",
)


def check_options(options: Mapping[str, Any]) -> None:
    """TypeError for a keyword ``RequestOptions`` does not name; ValueError for more than one
    structured output or a ``max_tokens`` below 1."""
    unknown = set(options) - set(RequestOptions.__annotations__)
    if unknown:
        raise TypeError(f"unknown option(s) {sorted(unknown)}; see RequestOptions")
    constraints = [name for name in _CONSTRAINTS if options.get(name) not in (None, False)]
    if len(constraints) > 1:
        raise ValueError(f"one structured output at most, not {constraints}")
    max_tokens = options.get("max_tokens")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1 (None: the route's default): {max_tokens}")


def sampling_of(options: Mapping[str, Any]) -> generation_pb2.SamplingParams:
    """The ``SamplingParams`` of checked ``options``."""
    sampling = generation_pb2.SamplingParams(
        max_tokens=options.get("max_tokens") or 0,
        temperature=options.get("temperature", SAMPLING_DEFAULTS.temperature),
        top_p=options.get("top_p", SAMPLING_DEFAULTS.top_p),
        top_k=options.get("top_k", SAMPLING_DEFAULTS.top_k),
    )
    for name in _PLAIN:
        if name in options:
            setattr(sampling, name, options[name])  # type: ignore[literal-required]
    for name in _LISTS:
        getattr(sampling, name).extend(options.get(name, ()))  # type: ignore[misc]
    sampling.logit_bias.update(options.get("logit_bias", {}))
    for name in ("seed", "logprobs", "prompt_logprobs"):
        if options.get(name) is not None:
            setattr(sampling, name, options[name])  # type: ignore[literal-required]
    constraint = _structured_output(options)
    if constraint is not None:
        sampling.structured_output.CopyFrom(constraint)
    return sampling


def _structured_output(options: Mapping[str, Any]) -> generation_pb2.StructuredOutput | None:
    schema = options.get("json_schema")
    if schema is not None:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return generation_pb2.StructuredOutput(json_schema=text)
    if options.get("json_object"):
        return generation_pb2.StructuredOutput(json_object=True)
    if options.get("choice") is not None:
        return generation_pb2.StructuredOutput(
            choice=generation_pb2.Choices(values=list(options["choice"]))
        )
    for name in ("regex", "grammar"):
        if options.get(name) is not None:
            return generation_pb2.StructuredOutput(**{name: options[name]})
    return None


def request_fields(options: Mapping[str, Any]) -> dict[str, str]:
    """The GenerateRequest's own fields among ``options`` (model, encoder policy, request id)."""
    return {name: options.get(name, "") for name in _REQUEST}


def answer_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """The GenerateRequest's answer options among ``options`` (beam search, the chat template
    and its generation prompt, reasoning, the prompt's text and token ids, echo, truncation,
    special tokens); an absent one is left unset."""
    return {name: options[name] for name in _ANSWER if options.get(name) is not None}
