"""What every side of a generation agrees on: the sampling defaults (one table) and the names of
finish reasons (one map), read by the OpenAI HTTP door, the gRPC door, the SDK and the workers.

A ``SamplingParams`` field at its zero value means its default here. ``max_tokens`` is the one
default that depends on the model: the route (either door) gives an unset ``max_tokens`` the rest
of the model's context, as OpenAI's API and vLLM do, and ``SAMPLING_DEFAULTS.max_tokens`` only
where the context is unknown; a worker called directly with 0 takes ``SAMPLING_DEFAULTS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from epd.v1 import generation_pb2


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """The value of each sampling field left unset (greedy decoding)."""

    # tokens to generate where the model's context is unknown
    max_tokens: int = 16
    # 0: greedy (argmax)
    temperature: float = 0.0
    # nucleus mass; 1: disabled
    top_p: float = 1.0
    # 0: disabled
    top_k: int = 0


SAMPLING_DEFAULTS = SamplingDefaults()

# Finish reasons as engines, the SDK and OpenAI's API name them -> FinishReason values.
FINISH_REASONS: dict[str, int] = {
    "stop": generation_pb2.FINISH_REASON_STOP,
    "length": generation_pb2.FINISH_REASON_LENGTH,
    "abort": generation_pb2.FINISH_REASON_ABORT,
    # the route's answer only, with a tool parser: the model called tools
    "tool_calls": generation_pb2.FINISH_REASON_TOOL_CALLS,
}
_FINISH_NAMES = {value: name for name, value in FINISH_REASONS.items()}


def finish_reason_value(name: str | None) -> int:
    """The FinishReason value of ``name`` (None: not finished, UNSPECIFIED; a name this map does
    not know: STOP)."""
    if name is None:
        return generation_pb2.FINISH_REASON_UNSPECIFIED
    return FINISH_REASONS.get(name, generation_pb2.FINISH_REASON_STOP)


def finish_reason_name(value: int) -> str | None:
    """The name of FinishReason ``value`` (UNSPECIFIED: None, not finished; a value this version
    does not know, from a newer peer: "stop")."""
    if value == generation_pb2.FINISH_REASON_UNSPECIFIED:
        return None
    return _FINISH_NAMES.get(value, "stop")
