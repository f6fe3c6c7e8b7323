"""Sampling as vLLM's OpenAI server makes it, carried as epd's ``SamplingParams`` (no grpc).

The HTTP door lets vLLM's own ``ChatCompletionRequest.to_sampling_params`` turn a body into
vLLM's ``SamplingParams`` (its defaults, the model's generation config over them, its checks),
and ``sampling_to_proto`` carries the result to the workers field by field: vLLM has judged it.
A ``SamplingParams`` vLLM's request models did not make (the gRPC door's, a beam search's steps)
is held by ``check_sampling`` to what the engine will accept, with the engine's own conversion,
before any work.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from epd.common.errors import EpdError
from epd.server.engine.vllm_inputs import OWNED_EXTRA_ARGS, sampling_params
from epd.server.route.request import bad
from epd.server.worker.convert import sampling_from_proto
from epd.v1 import generation_pb2

# vLLM is an optional extra: without it the route serves gRPC for transformers engines.
IS_VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
# The sampling fields a model's generation_config.json may set as defaults (vLLM's
# ``ModelConfig.get_diff_sampling_param``, max_new_tokens as max_tokens).
GENERATION_DEFAULTS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)
# vLLM's candidates per beam and step of a beam search: twice the beams (as transformers').
CANDIDATES_PER_BEAM = 2


def generation_defaults(model_dir: Path) -> dict[str, Any]:
    """The default sampling values ``model_dir``'s generation config sets, as ``vllm serve``
    takes them by default (``--generation-config auto``)."""
    from transformers import GenerationConfig

    try:
        values = GenerationConfig.from_pretrained(model_dir).to_diff_dict()
    except OSError:  # NOTE: no generation_config.json: vLLM's defaults alone
        values = {}
    defaults = {name: values[name] for name in GENERATION_DEFAULTS if values.get(name) is not None}
    if "max_new_tokens" in defaults:
        defaults["max_tokens"] = defaults.pop("max_new_tokens")
    return defaults


def sampling_to_proto(params: Any, request: Any = None) -> generation_pb2.SamplingParams:
    """epd's ``SamplingParams`` of vLLM's ``params`` and, where given, of the engine options
    vLLM's OpenAI ``request`` passes beside them (priority, cache_salt); a value epd's fields
    cannot hold, such as a negative seed, is an InvalidArgument naming the field."""
    fields: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": max(params.top_k, 0),
        "seed": params.seed,
        "stop": list(params.stop or []),
        "stop_token_ids": list(params.stop_token_ids or []),
        "ignore_eos": params.ignore_eos,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "min_p": params.min_p,
        "min_tokens": params.min_tokens,
        "logit_bias": {int(token): bias for token, bias in (params.logit_bias or {}).items()},
        "bad_words": list(params.bad_words or []),
        "allowed_token_ids": list(params.allowed_token_ids or []),
        "include_stop_str_in_output": params.include_stop_str_in_output,
        "structured_output": structured_output_to_proto(params.structured_outputs),
        "logprobs": params.logprobs,
        "n": params.n,
        "prompt_logprobs": params.prompt_logprobs,
        "logprob_token_ids": list(params.logprob_token_ids or []),
        # NOTE: unset is true: an ordinary request's message stays as it was
        "skip_special_tokens": None if params.skip_special_tokens else False,
        "spaces_between_special_tokens": None if params.spaces_between_special_tokens else False,
        "priority": getattr(request, "priority", 0),
        "cache_salt": getattr(request, "cache_salt", None),
        "thinking_token_budget": params.thinking_token_budget,
        "repetition_detection": _repetition_detection(params.repetition_detection),
        "vllm_xargs": json.dumps(xargs) if (xargs := _xargs(params, request)) else None,
    }
    message = generation_pb2.SamplingParams()
    for name, value in fields.items():
        try:
            _set(message, name, value)
        except (TypeError, ValueError):
            raise bad(f"{name} is out of the range epd carries", name) from None
    return message


def beam_sampling_to_proto(params: Any, request: Any = None) -> generation_pb2.SamplingParams:
    """epd's ``SamplingParams`` of vLLM's ``BeamSearchParams`` (its ``to_beam_search_params``):
    the beam width as ``n``, the fields a beam search reads, and the log probabilities vLLM's
    OpenAI ``request`` shows beside each token; its steps' sampling is
    ``beam_step_sampling``'s."""
    sampling = generation_pb2.SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        n=params.beam_width,
        ignore_eos=params.ignore_eos,
        include_stop_str_in_output=params.include_stop_str_in_output,
        cache_salt=getattr(request, "cache_salt", None),
    )
    if not params.skip_special_tokens:
        sampling.skip_special_tokens = False
    logprobs = getattr(request, "logprobs", None)
    if isinstance(logprobs, bool):  # NOTE: chat's: top_logprobs beside each token, when true
        logprobs = request.top_logprobs if logprobs else None
    try:
        _set(sampling, "logprobs", logprobs)
    except (TypeError, ValueError):
        raise bad("logprobs is out of the range epd carries", "logprobs") from None
    return sampling


def beam_step_sampling(sampling: generation_pb2.SamplingParams) -> generation_pb2.SamplingParams:
    """vLLM's sampling of one step of a beam search's beam: one token, the log probabilities of
    twice the beams' number of most likely candidates, at the search's temperature (and its
    cache salt, which names its prompt's cache entries)."""
    return generation_pb2.SamplingParams(
        max_tokens=1,
        temperature=sampling.temperature,
        logprobs=CANDIDATES_PER_BEAM * max(sampling.n, 1),
        cache_salt=sampling.cache_salt,
    )


def _set(message: generation_pb2.SamplingParams, name: str, value: Any) -> None:
    if value is None:
        return
    if name in ("structured_output", "repetition_detection"):
        getattr(message, name).CopyFrom(value)
    elif name == "logit_bias":
        message.logit_bias.update(value)
    elif isinstance(value, list):
        getattr(message, name).extend(value)
    else:
        setattr(message, name, value)


def _xargs(params: Any, request: Any) -> dict[str, Any]:
    """vLLM's ``extra_args`` of ``params`` less the KV handoff's fields (``OWNED_EXTRA_ARGS``)
    that ``request`` set and vLLM's ``to_sampling_params`` moved there, which epd's route takes
    with no effect (``openai_schema.IGNORED_FIELDS``: the hand-offs are its own); a
    ``vllm_xargs`` key of those names is refused, as the engine refuses it."""
    extra = dict(params.extra_args or {})
    for name in OWNED_EXTRA_ARGS:
        if getattr(request, name, None):
            extra.pop(name, None)
    if owned := [key for key in OWNED_EXTRA_ARGS if key in extra]:
        raise bad(f"vllm_xargs.{owned[0]}: epd passes the KV handoff itself", "vllm_xargs")
    return extra


def _repetition_detection(detection: Any) -> generation_pb2.RepetitionDetection | None:
    """vLLM's ``RepetitionDetectionParams`` (None: no detection) as epd's message."""
    if detection is None:
        return None
    return generation_pb2.RepetitionDetection(
        max_pattern_size=detection.max_pattern_size,
        min_pattern_size=detection.min_pattern_size,
        min_count=detection.min_count,
    )


def structured_output_to_proto(constraint: Any) -> generation_pb2.StructuredOutput | None:
    """The ``StructuredOutput`` of vLLM's ``StructuredOutputsParams`` (None: unconstrained)."""
    if constraint is None:
        return None
    output = generation_pb2.StructuredOutput(
        disable_any_whitespace=constraint.disable_any_whitespace,
        disable_additional_properties=constraint.disable_additional_properties,
        whitespace_pattern=constraint.whitespace_pattern,
    )
    if constraint.json is not None:
        schema = constraint.json
        output.json_schema = schema if isinstance(schema, str) else json.dumps(schema)
    elif constraint.choice is not None:
        output.choice.values.extend(str(choice) for choice in constraint.choice)
    elif constraint.regex is not None:
        output.regex = constraint.regex
    elif constraint.grammar is not None:
        output.grammar = constraint.grammar
    elif constraint.structural_tag is not None:
        output.structural_tag = constraint.structural_tag
    elif constraint.json_object is True:
        output.json_object = True
    else:
        raise bad("structured_outputs.json_object must be true if set", "structured_outputs")
    return output


def check_sampling(sampling: generation_pb2.SamplingParams) -> None:
    """Refuse ``sampling`` as the engine would, with the vLLM engine's own conversion (where
    vLLM is not installed, only transformers engines can serve: each judges for itself)."""
    if not IS_VLLM_INSTALLED:
        return
    try:
        sampling_params(sampling_from_proto(sampling))
    except EpdError as e:
        raise bad(e.message, e.metadata.get("param") or "sampling") from None
