"""The top-level parameters of an OpenAI chat-completions body: one table of name -> check.

Each check takes the JSON value and the parameter's name, and returns the value to use or raises
``InvalidArgument`` naming the parameter. Ranges fit the protobuf fields the values land in
(``SamplingParams``: uint32, uint64, float), so a body that passes never fails to serialize.
A null value is the same as an absent one. ``messages`` is checked by ``openai_schema``. The
sampling ranges here are also those ``request_check`` holds a gRPC request to.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from epd.common.errors import InvalidArgument

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
MAX_NAME_CHARS = 256
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_METADATA_PAIRS = 16
LONE_SURROGATE = re.compile("[\ud800-\udfff]")

Check = Callable[[Any, str], Any]


def bad(message: str, param: str, reason: str = "BAD_REQUEST") -> InvalidArgument:
    """The error for a refused ``param`` (reported as the OpenAI error's ``param``)."""
    return InvalidArgument(message, reason=reason, metadata={"param": param})


def boolean(value: Any, param: str) -> bool:
    """A JSON true or false (not 0 or 1)."""
    if not isinstance(value, bool):
        raise bad(f"{param} must be true or false", param)
    return value


def anything(value: Any, param: str) -> Any:
    return value


def mapping(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad(f"{param} must be an object", param)
    return value


def integer(low: int, high: int) -> Check:
    """An integer in [low, high]; a JSON bool is not one (Python's bool is an int)."""

    def check(value: Any, param: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise bad(f"{param} must be an integer in [{low}, {high}]", param)
        return value

    return check


def number(low: float, high: float, *, is_low_open: bool = False) -> Check:
    """A finite number in [low, high] ((low, high] if ``is_low_open``); NaN never passes."""

    def check(value: Any, param: str) -> float:
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if not is_number or not (low < value if is_low_open else low <= value) or value > high:
            bracket = "(" if is_low_open else "["
            raise bad(f"{param} must be a number in {bracket}{low}, {high}]", param)
        return float(value)

    return check


def text(max_chars: int) -> Check:
    """A string of at most ``max_chars`` characters without lone surrogates."""

    def check(value: Any, param: str) -> str:
        if not isinstance(value, str) or len(value) > max_chars:
            raise bad(f"{param} must be a string of at most {max_chars} characters", param)
        return clean(value, param)

    return check


def clean(value: str, param: str) -> str:
    """``value`` if it is valid Unicode (JSON's \\ud800 escapes decode to lone surrogates, which
    protobuf refuses to serialize)."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"{param} holds a lone surrogate (invalid Unicode)", param) from None
    return value


def items(check: Check, max_items: int, *, is_single_allowed: bool = False) -> Check:
    """A list of at most ``max_items`` values passing ``check`` (or one such value alone)."""

    def check_list(value: Any, param: str) -> list[Any]:
        if is_single_allowed and not isinstance(value, list):
            return [check(value, param)]
        if not isinstance(value, list) or len(value) > max_items:
            raise bad(f"{param} must be a list of at most {max_items} items", param)
        return [check(item, f"{param}[{index}]") for index, item in enumerate(value)]

    return check_list


def unsupported(check: Check, *no_ops: Any) -> Check:
    """A parameter epd does not implement: accepted only at a value that changes nothing."""

    def check_no_op(value: Any, param: str) -> Any:
        value = check(value, param)
        if value not in no_ops:
            raise bad(f"{param} is not supported", param, reason="UNSUPPORTED_PARAMETER")
        return value

    return check_no_op


def metadata(value: Any, param: str) -> dict[str, Any]:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 and values up to 512 chars."""
    pairs = mapping(value, param)
    is_valid = len(pairs) <= MAX_METADATA_PAIRS and all(
        isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in pairs.items()
    )
    if not is_valid:
        raise bad(f"{param} must be at most 16 pairs of short strings", param)
    return pairs


def stream_options(value: Any, param: str) -> dict[str, Any]:
    options = mapping(value, param)
    if options.get("include_usage") is not None:
        boolean(options["include_usage"], f"{param}.include_usage")
    return options


# NOTE: the order of the groups is the documentation's (docs/route.md).
PARAMS: dict[str, Check] = {
    # Used.
    "model": text(MAX_NAME_CHARS),
    "max_tokens": integer(1, UINT32_MAX),
    "max_completion_tokens": integer(1, UINT32_MAX),
    "temperature": number(0, 2),
    "top_p": number(0, 1, is_low_open=True),
    "seed": integer(0, UINT64_MAX),
    "stop": items(text(MAX_STOP_CHARS), MAX_STOP_STRINGS, is_single_allowed=True),
    "stream": boolean,
    "stream_options": stream_options,
    # vLLM's extensions, used (top_k: -1 or 0 disable; vLLM keeps k in an int32 tensor).
    "top_k": integer(-1, INT32_MAX),
    "ignore_eos": boolean,
    "stop_token_ids": items(integer(0, UINT32_MAX), MAX_STOP_TOKEN_IDS),
    # Accepted and ignored: they change no token of the answer.
    "user": text(MAX_NAME_CHARS),
    "safety_identifier": text(MAX_NAME_CHARS),
    "prompt_cache_key": text(MAX_NAME_CHARS),
    "metadata": metadata,
    "store": boolean,
    "service_tier": text(MAX_NAME_CHARS),
    "parallel_tool_calls": boolean,
    # Not implemented: refused unless at their no-op value.
    "n": unsupported(integer(1, 128), 1),
    "logprobs": unsupported(boolean, False),
    "top_logprobs": unsupported(integer(0, 20), 0),
    "presence_penalty": unsupported(number(-2, 2), 0.0),
    "frequency_penalty": unsupported(number(-2, 2), 0.0),
    "logit_bias": unsupported(mapping, {}),
    "tools": unsupported(anything, []),
    "tool_choice": unsupported(anything, "none", "auto"),
    "functions": unsupported(anything, []),
    "function_call": unsupported(anything, "none", "auto"),
    "response_format": unsupported(anything, {"type": "text"}),
    "modalities": unsupported(anything, ["text"]),
    "audio": unsupported(anything),
    "prediction": unsupported(anything),
    "reasoning_effort": unsupported(anything),
    "web_search_options": unsupported(anything),
    "min_tokens": unsupported(integer(0, UINT32_MAX), 0),
    "min_p": unsupported(number(0, 1), 0.0),
    "repetition_penalty": unsupported(number(0, 2, is_low_open=True), 1.0),
}


def check_params(body: dict[str, Any]) -> dict[str, Any]:
    """The checked values of ``body``'s parameters but ``messages``, nulls left out."""
    values = {}
    for name, value in body.items():
        if name == "messages" or value is None:
            continue
        check = PARAMS.get(name)
        if check is None:
            shown = LONE_SURROGATE.sub("\ufffd", name[:MAX_NAME_CHARS])
            raise bad(f"unknown parameter {shown!r}", shown, "UNKNOWN_PARAMETER")
        values[name] = check(value, name)
    return values
