"""What a vLLM engine started with a reasoning parser does with a request, as ``vllm serve
--reasoning-parser`` does: the parser's name checked against vLLM's registry, and the request
options beside the sampling that vLLM's engine reads (its thinking budget, repetition stop,
custom arguments, and where a structured output starts).

An engine with a reasoning parser (``AsyncEngineArgs.reasoning_parser``) constrains a structured
output only once reasoning has ended (vLLM's ``StructuredOutputManager``), and gives itself a
reasoning config, which ``thinking_token_budget`` needs. The route judges the rendered prompt with
the same parser (vLLM's ``reasoning_ended``); on a P/D split both engines get that verdict and the
same prompt, and the decode engine samples the first token again, so its grammar starts where
the prefill engine's did and latches the end of reasoning on the same token.
"""

from __future__ import annotations

import json
from typing import Any

from epd.common.errors import InvalidArgument
from epd.server.engine.base import Sampling

# SamplingParams.extra_args keys the engine owns (the KV handoff); a request's own are refused.
OWNED_EXTRA_ARGS = ("kv_transfer_params", "ec_transfer_params")


def check_reasoning_parser(name: str | None) -> str | None:
    """``name`` if vLLM's registry holds such a reasoning parser (None: none asked); ValueError
    naming the flag and the parsers it holds otherwise (this imports vLLM when a name is
    given)."""
    if not name:
        return None
    from vllm.reasoning import ReasoningParserManager

    names = ReasoningParserManager.list_registered()
    if name not in names:
        raise ValueError(
            f"--reasoning-parser {name}: no such parser in vLLM; choose from {', '.join(names)}"
        )
    return name


def request_options(
    sampling: Sampling, kv_transfer_params: dict[str, Any] | None
) -> dict[str, Any]:
    """``SamplingParams`` arguments beyond the sampling proper: the thinking budget, the
    repetition stop, and ``extra_args`` (the request's ``vllm_xargs`` with the engine's KV
    handoff); InvalidArgument when ``vllm_xargs`` is not a JSON object or names a key the engine
    owns."""
    from vllm.sampling_params import RepetitionDetectionParams

    extra_args = _json_object(sampling.vllm_xargs, "vllm_xargs") if sampling.vllm_xargs else {}
    if owned := [key for key in OWNED_EXTRA_ARGS if key in extra_args]:
        raise InvalidArgument(
            f"vllm_xargs.{owned[0]}: epd passes the KV handoff itself",
            reason="BAD_SAMPLING",
            metadata={"param": "vllm_xargs"},
        )
    if kv_transfer_params:
        extra_args["kv_transfer_params"] = kv_transfer_params
    detection = sampling.repetition_detection
    return {
        "thinking_token_budget": sampling.thinking_token_budget,
        "repetition_detection": None
        if detection is None
        else RepetitionDetectionParams(
            max_pattern_size=detection.max_pattern_size,
            min_pattern_size=detection.min_pattern_size,
            min_count=detection.min_count,
        ),
        "extra_args": extra_args or None,
    }


def generate_options(sampling: Sampling) -> dict[str, Any]:
    """``AsyncLLM.generate`` arguments of a structured output's start, as vLLM's chat server
    passes them: ``reasoning_ended`` and ``reasoning_parser_kwargs`` (none without a structured
    output, where the engine does not read them)."""
    constraint = sampling.structured_output
    if constraint is None:
        return {}
    options: dict[str, Any] = {"reasoning_ended": constraint.reasoning_ended}
    if constraint.chat_template_kwargs:
        kwargs = _json_object(constraint.chat_template_kwargs, "chat_template_kwargs")
        options["reasoning_parser_kwargs"] = {"chat_template_kwargs": kwargs}
    return options


def _json_object(text: str, name: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidArgument(
            f"{name} must be a JSON object", reason="BAD_SAMPLING", metadata={"param": name}
        )
    return value
