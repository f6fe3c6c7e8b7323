"""OpenAI chat-completions JSON -> the route's ChatRequest (no I/O).

The whole body is checked before any work, as ``vllm serve`` checks it: vLLM's own
``ChatCompletionRequest`` parses it (types, ranges, its defaults; unknown fields are accepted and
logged, as vLLM does), vLLM's ``to_sampling_params`` makes and judges its sampling
(``sampling.py`` carries it), the messages' shape is checked here, and
``request_check.check_content`` judges what vLLM leaves to epd in the ``ChatRequest`` they make
(the gRPC door's ``check_request`` makes that check too). A field epd does not implement yet is
refused at any value but its default. Anything malformed, out of range or not implemented is an
``InvalidArgument`` naming the parameter, which ``openai_answers.error_body`` turns into a 400
OpenAI error object. Writing the answers is ``openai_answers``'s job.
"""

from __future__ import annotations

from typing import Any

from epd.common.generation import SAMPLING_DEFAULTS
from epd.server.media.video_overrides import REQUEST_FIELDS, MediaKwargs
from epd.server.route.chat_echo import echo_text
from epd.server.route.request import (
    MAX_NAME_CHARS,
    ChatMessage,
    ChatPart,
    ChatRequest,
    ImageSource,
    bad,
    check_name,
    new_request_id,
    valid_unicode,
)
from epd.server.route.request_check import RequestLimits, check_content, check_request_id
from epd.server.route.sampling import beam_sampling_to_proto, sampling_to_proto
from epd.server.route.tools import ToolCalling, chat_step
from epd.v1 import generation_pb2

MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "reasoning"})
# Roles whose messages carry fields for the chat template beyond their content.
TOOL_ROLES = ("assistant", "tool")
# vLLM's ChatCompletionRequest fields epd implements (or that change nothing it answers); any
# other field is refused at a value other than its default.
# The fields vLLM's chat and completions requests share that epd implements (or that change
# nothing it answers).
SAMPLING_FIELDS = frozenset(
    {
        "model",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "logit_bias",
        "max_tokens",
        "response_format",
        "structured_outputs",
        "seed",
        "stop",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "allowed_token_ids",
        "bad_words",
        "stream",
        "stream_options",
        "stream_interval",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "user",
        "request_id",
        "logprobs",
        "n",
        "prompt_logprobs",
        "logprob_token_ids",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "return_tokens_as_token_ids",
        "priority",
        "cache_salt",
        "thinking_token_budget",
        "repetition_detection",
        "vllm_xargs",
        "use_beam_search",
        "length_penalty",
    }
)
# vLLM's ChatCompletionRequest fields epd implements; any other is refused at a value other than
# its default.
IMPLEMENTED_FIELDS = (
    SAMPLING_FIELDS
    | {
        "messages",
        "echo",
        "max_completion_tokens",
        "parallel_tool_calls",
        "top_logprobs",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
        "documents",
        "reasoning_effort",
        "tools",
        "tool_choice",
        "include_reasoning",
        "chat_template",
        "return_token_ids",
        "return_prompt_text",
        "truncate_prompt_tokens",
        "truncation_side",
        "add_special_tokens",
    }
    | REQUEST_FIELDS
)
# vLLM's request fields that its generation endpoints take and do nothing with for a deployment
# like epd's: the render endpoints' (token offsets, the multimodal payload and its deprecated
# alias), the routed experts of a model started to return them, the watermark of an engine
# given a watermark config (vLLM warns and goes on without), the session id that vLLM
# writes only into KV cache events, and the KV and encoder-cache transfer parameters of an
# external P/D or E/PD proxy, which ``vllm serve`` without a KV or EC connector warns about and
# disables (``EngineCore.add_request``): epd's route makes every hand-off itself. Accepted at any
# valid value, as vLLM accepts them.
IGNORED_FIELDS = frozenset(
    {
        "return_token_offsets",
        "mm_payload",
        "return_mm_kwargs",
        "routed_experts_prompt_start",
        "watermarking",
        "session_id",
        "kv_transfer_params",
        "ec_transfer_params",
    }
)
IMAGE_DETAILS = ("auto", "low", "high")


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise bad(f"{param} must be a string", param)
    return valid_unicode(value, param)


def _media(part: dict[str, Any], key: str, param: str) -> ImageSource:
    """The source of an ``image_url`` or ``video_url`` part (``key``): its object's ``url`` or
    the URL alone (an http(s), ``data:`` or ``file:`` URL); an image's ``detail``, if given, one
    of ``IMAGE_DETAILS``."""
    value = part.get(key)
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise bad(f"{key} parts need {key}.url", f"{param}.{key}")
    detail = value.get("detail") if key == "image_url" and isinstance(value, dict) else None
    if detail is not None and detail not in IMAGE_DETAILS:
        raise bad("image_url.detail must be auto, low or high", f"{param}.image_url.detail")
    return ImageSource(url=valid_unicode(url, f"{param}.{key}.url"))


def _part(part: Any, param: str) -> ChatPart:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        return ChatPart(text=_text(part.get("text"), f"{param}.text"))
    if kind == "image_url":
        return ChatPart(image=_media(part, kind, param))
    if kind == "video_url":
        return ChatPart(video=_media(part, kind, param))
    raise bad(
        f"unsupported content part type {str(kind)[:64]!r} (use text, image_url or video_url)",
        param,
    )


def _content(content: Any, param: str) -> list[ChatPart]:
    if isinstance(content, str):
        return [ChatPart(text=valid_unicode(content, param))]
    if not isinstance(content, list):
        raise bad("message content must be a string or a non-empty list of parts", param)
    return [_part(part, f"{param}[{index}]") for index, part in enumerate(content)]


def _message(message: Any, param: str) -> ChatMessage:
    if not isinstance(message, dict):
        raise bad("each message must be an object with a role and content", param)
    for key, value in message.items():
        # NOTE: clients echoing an assistant message send its unused fields as null.
        if key not in MESSAGE_KEYS and value is not None:
            shown = f"{param}.{str(key)[:MAX_NAME_CHARS]}"
            raise bad(
                f"{valid_unicode(shown, param)} is not supported", shown, "UNSUPPORTED_PARAMETER"
            )
    role = _text(message.get("role"), f"{param}.role")
    if message.get("name") is not None:
        check_name(message["name"], f"{param}.name")
    if message.get("content") is None and message.get("tool_calls") and role == "assistant":
        return ChatMessage(role, [], template_fields(message, role, [], param))
    content = _content(message.get("content"), f"{param}.content")
    fields = template_fields(message, role, content, param) if role in TOOL_ROLES else {}
    return ChatMessage(role, content, fields)


def template_fields(
    message: dict[str, Any], role: str, parts: list[ChatPart], param: str
) -> dict[str, Any]:
    """What vLLM gives the chat template of an assistant's or a tool's message beside its role
    and content (``vllm.renderers.chat_utils``): an assistant's tool calls with their arguments
    as objects and its reasoning; a tool result's call id, and its text as one string."""
    fields: dict[str, Any] = {}
    if role == "assistant" and message.get("tool_calls") is not None:
        fields.update(_tool_calls(message["tool_calls"], f"{param}.tool_calls"))
    if role == "assistant" and message.get("reasoning") is not None:
        fields["reasoning"] = fields["reasoning_content"] = message["reasoning"]
    if role == "tool":
        if message.get("tool_call_id") is not None:
            fields["tool_call_id"] = message["tool_call_id"]
        if all(part.text is not None for part in parts):
            fields["content"] = "\n".join(part.text or "" for part in parts)
    return fields


def _tool_calls(calls: Any, param: str) -> dict[str, Any]:
    """An assistant's ``tool_calls`` as vLLM gives them to the template (none: no field)."""
    import copy

    from vllm.exceptions import VLLMClientError
    from vllm.renderers.chat_utils import _postprocess_messages

    if not isinstance(calls, list):
        raise bad("tool_calls must be a list of tool calls", param)
    message = {"role": "assistant", "tool_calls": copy.deepcopy(calls)}
    try:
        _postprocess_messages([message])  # type: ignore[list-item]
    except (ValueError, TypeError, AttributeError, VLLMClientError) as e:
        raise bad(f"{param}: {e}"[:1024], param) from None
    return {"tool_calls": message["tool_calls"]} if "tool_calls" in message else {}


def _chat(messages: Any) -> list[ChatMessage]:
    if not isinstance(messages, list):
        raise bad("messages must be a non-empty list", "messages")
    return [_message(m, f"messages[{index}]") for index, m in enumerate(messages)]


def to_chat_request(
    body: Any,
    default_model: str,
    request_id: str | None = None,
    limits: RequestLimits | None = None,
    defaults: dict[str, Any] | None = None,
    tools: ToolCalling | None = None,
    trust_chat_template: bool = False,
) -> ChatRequest:
    """Check a chat-completions body whole, as vLLM's OpenAI server does, and convert it;
    ``request_id`` (the X-Request-Id header) names the request in every hop and trace, a fresh
    one is made when it is None. ``limits``: the request's limits (None: the defaults, the
    context unknown); ``defaults``: the model's default sampling values
    (``sampling.generation_defaults``); ``tools``: the route's tool and reasoning parsers (None:
    none configured); ``trust_chat_template``: render with the body's own ``chat_template``
    (vLLM's ``--trust-request-chat-template``; otherwise refused as vLLM refuses it)."""
    if request_id is not None:
        check_request_id(request_id, "X-Request-Id")
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object", "body")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    messages = _chat(body.get("messages"))
    parsed = parse_with(ChatCompletionRequest, body)
    refuse_unimplemented(parsed, IMPLEMENTED_FIELDS)
    template_kwargs, parsing = chat_step(parsed, tools, trust_chat_template, "chat_template")
    limits = limits or RequestLimits()
    max_tokens = answer_bound(parsed, limits.max_context_tokens)
    request = ChatRequest(
        new_request_id(request_id),
        parsed.model or default_model,
        messages,
        vllm_sampling(parsed, max_tokens, defaults or {}),
        template_kwargs=template_kwargs,
        answer_parsing=parsing,
        chat_template=parsed.chat_template,
    )
    if parsed.echo:
        request.echo = echo_text(messages, parsed.add_generation_prompt)
    request.tokens_as_ids = bool(parsed.return_tokens_as_token_ids)
    request.stream_interval = parsed.stream_interval or 1
    request.media_kwargs = MediaKwargs(parsed.mm_processor_kwargs, parsed.media_io_kwargs)
    request.return_token_ids = bool(parsed.return_token_ids)
    request.return_prompt_text = bool(parsed.return_prompt_text)
    request.add_special_tokens = bool(parsed.add_special_tokens)
    if parsed.use_beam_search:
        take_beam_search(parsed, request)
    if parsed.truncate_prompt_tokens is not None:
        request.truncate_prompt_tokens = kept_tokens(parsed, limits.max_context_tokens)
        request.truncation_side = parsed.truncation_side
    check_content(request, limits)
    return request


def answer_bound(parsed: Any, context: int | None) -> int:
    """The bound on ``parsed``'s answer (a chat's or a completion's request): as vLLM, none, or
    one beyond the ``context``, is the rest of the context."""
    max_tokens = getattr(parsed, "max_completion_tokens", None) or parsed.max_tokens
    if max_tokens is None or (context is not None and max_tokens > context):
        max_tokens = context or SAMPLING_DEFAULTS.max_tokens
    return int(max_tokens)


def kept_tokens(parsed: Any, context: int | None) -> int | None:
    """The prompt tokens ``parsed``'s ``truncate_prompt_tokens`` keeps, as vLLM's
    ``TokenizeParams`` reads it: -1 is the context (less the one token an answer needs when
    ``max_tokens`` is set); None: no cut (-1 with the context unknown). A bound beyond the
    context is vLLM's 400."""
    keep = int(parsed.truncate_prompt_tokens)
    if context is not None and keep > context:
        raise bad(
            f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = {context}. "
            "Please request a smaller truncation size.",
            "truncate_prompt_tokens",
        )
    if keep >= 0 or context is None:
        return keep if keep >= 0 else None
    max_tokens = getattr(parsed, "max_completion_tokens", None) or parsed.max_tokens
    return context if not max_tokens else max(0, context - 1)


def parse_with(model: Any, body: dict[str, Any]) -> Any:
    """vLLM's request ``model`` (``ChatCompletionRequest``, ``CompletionRequest``) of ``body``;
    its validation errors name the field."""
    from pydantic import ValidationError
    from vllm.exceptions import VLLMClientError

    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise _invalid(e) from None
    except (ValueError, VLLMClientError) as e:
        raise bad(valid_unicode(str(e), "body"), getattr(e, "parameter", None) or "body") from None


def _invalid(error: Any) -> Exception:
    from vllm.entrypoints.serve.exception_handling.handlers.validation import (
        clean_loc_for_param,
    )

    first = error.errors()[0]
    param = clean_loc_for_param(tuple(first.get("loc", ()))) or "body"
    message = str(first.get("msg", "invalid request"))
    if isinstance(context := first.get("ctx", {}).get("error"), ValueError):
        param = getattr(context, "parameter", None) or param
    return bad(f"{valid_unicode(param, 'body')}: {valid_unicode(message, 'body')}"[:1024], param)


def refuse_unimplemented(parsed: Any, implemented: frozenset[str]) -> None:
    """Refuse each field of ``parsed`` but ``implemented`` and ``IGNORED_FIELDS`` at a value
    other than its default."""
    for name in type(parsed).model_fields:
        if name in implemented or name in IGNORED_FIELDS or name not in parsed.model_fields_set:
            continue
        default = type(parsed).model_fields[name].get_default(call_default_factory=True)
        if getattr(parsed, name) != default:
            raise bad(f"{name} is not supported by epd yet", name, "UNSUPPORTED_PARAMETER")


def take_beam_search(parsed: Any, request: ChatRequest) -> None:
    """vLLM's ``use_beam_search`` and ``length_penalty`` of ``parsed`` (which asks for beam
    search) onto ``request``."""
    request.use_beam_search = True
    request.length_penalty = float(parsed.length_penalty)


def vllm_sampling(
    parsed: Any, max_tokens: int, defaults: dict[str, Any]
) -> generation_pb2.SamplingParams:
    """epd's ``SamplingParams`` of vLLM's ``to_sampling_params`` for ``parsed``."""
    from vllm.exceptions import VLLMClientError

    try:
        if parsed.use_beam_search:
            beams = parsed.to_beam_search_params(max_tokens, defaults)
            return beam_sampling_to_proto(beams, parsed)
        params = parsed.to_sampling_params(max_tokens, defaults)
    except (ValueError, VLLMClientError) as e:
        raise bad(
            valid_unicode(str(e), "body"), getattr(e, "parameter", None) or "sampling"
        ) from None
    return sampling_to_proto(params, parsed)
