"""Engine dataclasses <-> vLLM's request objects: multimodal data, sampling parameters (with the
request options beside them that vLLM's engine reads: thinking budget, repetition stop, custom
arguments, where a structured output starts) and the KV transfer config going in; token chunks,
log probabilities and a failed request's error coming out (``VllmEngine`` streams through these).

Pure conversions (vLLM is imported lazily, inside the functions that build its objects).

An engine with a reasoning parser (``AsyncEngineArgs.reasoning_parser``, as ``vllm serve
--reasoning-parser``) constrains a structured output only once reasoning has ended (vLLM's
``StructuredOutputManager``), and gives itself a reasoning config, which
``thinking_token_budget`` needs. The route judges the rendered prompt with the same parser
(vLLM's ``reasoning_ended``, passed by ``generate_options``); on a P/D split both engines get
that verdict and the same prompt, and the decode engine samples the first token again, so its
grammar starts where the prefill engine's did and latches the end of reasoning on the same token.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from epd.common.errors import InvalidArgument, Unavailable
from epd.server.engine.base import (
    KV_LOAD_FAILED,
    Candidates,
    EngineImage,
    Sampling,
    StructuredOutput,
    TokenChunk,
    Usage,
    VideoFrames,
)
from epd.server.media.image_settings import NO_IMAGE_SETTINGS, ImageSettings

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_BUFFER_DEVICES = ("cpu", "cuda")
PICTURE_NAME_PREFIX = "epd-picture-"
VIDEO_NAME_PREFIX = "epd-video-"
# SamplingParams.extra_args keys the engine owns (the KV handoff); a request's own are refused.
OWNED_EXTRA_ARGS = ("kv_transfer_params", "ec_transfer_params")


def raw_prompt(token_ids: list[int], images: list[EngineImage]) -> dict[str, Any]:
    """vLLM's prompt for ``token_ids`` whose images and videos are all raw (vLLM runs its own
    processor and tower): ``picture_data``, named by ``picture_names``; with videos, vLLM's
    processor told to keep every frame given (they are sampled already); with a pixel budget,
    told to resize the pictures within it (``images_kwargs``)."""
    prompt: dict[str, Any] = {
        "prompt_token_ids": list(token_ids),
        "multi_modal_data": picture_data(images),
    }
    if (names := picture_names(images)) is not None:
        prompt["multi_modal_uuids"] = names
    kwargs: dict[str, Any] = {}
    if any(image.is_video for image in images):
        kwargs["do_sample_frames"] = False
    if budget := pictures_budget(images).settings:
        kwargs["images_kwargs"] = budget
    if kwargs:
        prompt["mm_processor_kwargs"] = kwargs
    return prompt


def pictures_budget(images: list[EngineImage]) -> ImageSettings:
    """The one pixel budget of a prompt's pictures (vLLM takes one per prompt); InvalidArgument
    (MIXED_IMAGE_SETTINGS) when they have several."""
    budgets = {image.image_settings for image in images if not image.is_video}
    if len(budgets) > 1:
        raise InvalidArgument(
            "a prompt's pictures must share one pixel budget", reason="MIXED_IMAGE_SETTINGS"
        )
    return budgets.pop() if budgets else NO_IMAGE_SETTINGS


def picture_data(images: list[EngineImage]) -> dict[str, Any]:
    """``multi_modal_data`` for a prompt whose images are all pictures and whose videos are all
    raw frames (``video_data``)."""
    if not all(image.is_raw for image in images):
        raise InvalidArgument(
            "a prompt's images must be all embeddings or all pictures", reason="MIXED_IMAGE_INPUTS"
        )
    data: dict[str, Any] = {}
    if pictures := [image.image for image in images if not image.is_video]:
        data["image"] = pictures
    if videos := [video_data(image.frames) for image in images if image.frames is not None]:
        data["video"] = videos
    return data


def video_data(frames: VideoFrames) -> tuple[np.ndarray, dict[str, Any]]:
    """One video of ``multi_modal_data``: its kept frames and vLLM's video metadata for them
    (the decoded clip's rate and frame count, the kept frames' indices), from which vLLM's
    processor times them (Qwen2.5-VL's seconds per temporal patch, Qwen3-VL's timestamps)."""
    metadata = {
        "fps": frames.fps,
        "total_num_frames": frames.num_decoded_frames,
        "duration": frames.num_decoded_frames / frames.fps,
        "frames_indices": list(frames.frame_indices),
        "do_sample_frames": False,
    }
    return frames.pixels, metadata


def picture_names(images: list[EngineImage]) -> dict[str, Any] | None:
    """``multi_modal_uuids`` naming pictures and videos by their mm_hash, so that vLLM does not
    hash their pixels again (the worker hashed them as it decoded them, or read them from a
    segment the route tagged with it); None when one has no mm_hash. The names are apart from
    those of embeddings and of a decode's grid-only images (``vllm_embeds``), which vLLM's
    caches hold as other items."""
    if not all(image.mm_hash for image in images):
        return None
    names: dict[str, Any] = {}
    for image in images:
        prefix = VIDEO_NAME_PREFIX if image.is_video else PICTURE_NAME_PREFIX
        names.setdefault("video" if image.is_video else "image", []).append(
            f"{prefix}{image.mm_hash}"
        )
    return names


def sampling_params(
    sampling: Sampling,
    *,
    max_tokens: int | None = None,
    kv_transfer_params: dict[str, Any] | None = None,
) -> Any:
    """vLLM ``SamplingParams`` (delta outputs) for ``sampling``; InvalidArgument if out of range."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMClientError
    from vllm.sampling_params import RequestOutputKind

    if sampling.max_tokens < 1:
        raise InvalidArgument("max_tokens must be at least 1", reason="BAD_SAMPLING")
    try:
        options = request_options(sampling, kv_transfer_params)
        return SamplingParams(
            max_tokens=max_tokens or sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k or -1,
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            ignore_eos=sampling.ignore_eos,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            repetition_penalty=sampling.repetition_penalty,
            min_p=sampling.min_p,
            min_tokens=sampling.min_tokens
            if max_tokens is None
            else min(sampling.min_tokens, max_tokens),
            logit_bias=dict(sampling.logit_bias) or None,
            bad_words=list(sampling.bad_words) or None,
            allowed_token_ids=list(sampling.allowed_token_ids) or None,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            structured_outputs=structured_outputs(sampling.structured_output),
            logprobs=sampling.logprobs,
            prompt_logprobs=sampling.prompt_logprobs,
            logprob_token_ids=list(sampling.logprob_token_ids) or None,
            skip_special_tokens=sampling.skip_special_tokens,
            spaces_between_special_tokens=sampling.spaces_between_special_tokens,
            output_kind=RequestOutputKind.DELTA,
            **options,
        )
    except (ValueError, VLLMClientError) as e:
        param = getattr(e, "parameter", None)
        raise InvalidArgument(
            f"bad sampling parameters: {e}",
            reason="BAD_SAMPLING",
            metadata={"param": param} if param else None,
        ) from e


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


def candidates(position: Any) -> Candidates:
    """vLLM's logprobs at one position (token id -> ``Logprob``, the generated token first) as
    ``Candidates``."""
    return tuple(
        (int(token), float(p.logprob), int(p.rank or 0), p.decoded_token)
        for token, p in position.items()
    )


def prompt_candidates(positions: Any) -> list[Candidates]:
    """vLLM's prompt logprobs (None at the first position, then one ``candidates`` per prompt
    token) as ``Candidates``, the first position's empty; [] when there are none."""
    return [candidates(position) if position else () for position in positions or []]


def request_failed(params: Any) -> Unavailable:
    """The error for a request vLLM finished with reason ``error`` (retryable, request-level):
    on a decode worker, the KV it was to read from its prefill worker could not be loaded (the
    prefill worker died or dropped it; vLLM's ``kv_load_failure_policy`` is ``fail``)."""
    kv_params = (params.extra_args or {}).get("kv_transfer_params") or {}
    if kv_params.get("do_remote_prefill"):
        return Unavailable(
            "the request's KV could not be loaded from its prefill worker",
            reason=KV_LOAD_FAILED,
        )
    return Unavailable("the engine failed the request", reason="ENGINE_REQUEST_FAILED")


def chunk_of(output: Any, prompt_token_ids: list[int], num_generated: int) -> TokenChunk:
    """A delta output as a chunk; ``num_generated`` counts the request's tokens so far."""
    completion = output.outputs[0]
    logprobs = [candidates(position) for position in completion.logprobs or []]
    prompt_logprobs = prompt_candidates(output.prompt_logprobs) if output.prompt_logprobs else []
    if not output.finished:
        return TokenChunk(
            list(completion.token_ids), logprobs=logprobs, prompt_logprobs=prompt_logprobs
        )
    num_prompt = len(output.prompt_token_ids or prompt_token_ids)
    return TokenChunk(
        list(completion.token_ids),
        completion.finish_reason,
        Usage(num_prompt, num_generated, output.num_cached_tokens or 0),
        logprobs,
        prompt_logprobs,
    )


def structured_outputs(constraint: StructuredOutput | None) -> Any:
    """vLLM's ``StructuredOutputsParams`` for ``constraint`` (None: unconstrained)."""
    if constraint is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    options = {
        "disable_any_whitespace": constraint.disable_any_whitespace,
        "disable_additional_properties": constraint.disable_additional_properties,
        "whitespace_pattern": constraint.whitespace_pattern,
    }
    if constraint.kind == "json_object":
        return StructuredOutputsParams(json_object=True, **options)
    if constraint.kind == "choice":
        return StructuredOutputsParams(choice=list(constraint.value), **options)
    if constraint.kind not in ("json", "regex", "grammar", "structural_tag"):
        raise InvalidArgument(
            f"unknown structured output {constraint.kind!r}", reason="BAD_SAMPLING"
        )
    return StructuredOutputsParams(**{constraint.kind: constraint.value}, **options)


MIN_KV_LEASE_S = 6
DEFAULT_KV_LEASE_S = 30


def kv_transfer_config(
    role: str, engine_id: str = "", lease_s: int = DEFAULT_KV_LEASE_S, buffer_device: str = "cpu"
) -> Any:
    """NixlConnector config for ``role`` with the KV buffer on ``buffer_device`` (``cpu``: host
    memory, ``cuda``: GPU memory, NIXL registers it as VRAM).

    ``lease_s``: how long a producer keeps blocks no consumer has read (a consumer that is
    reading renews it every ``lease_s / 6``); prefill and decode workers must agree on it.
    On CPU the connector's NIXL agent runs without its busy-polling progress thread
    (``nixl_cpu``); on CUDA it is vLLM's own.
    """
    from vllm.config import KVTransferConfig

    if role not in KV_ROLES:
        raise ValueError(f"kv role must be one of {KV_ROLES}, not {role!r}")
    if lease_s < MIN_KV_LEASE_S:
        raise ValueError(
            f"the KV lease must be at least {MIN_KV_LEASE_S} s (consumers renew it "
            f"every lease/6 s), got {lease_s}"
        )
    if buffer_device not in KV_BUFFER_DEVICES:
        raise ValueError(
            f"KV buffer device must be one of {KV_BUFFER_DEVICES}, not {buffer_device!r}"
        )
    module = "epd.server.engine.nixl_cpu" if buffer_device == "cpu" else None
    return KVTransferConfig(
        kv_connector="NixlConnector",
        kv_role=role,  # type: ignore[arg-type]
        kv_buffer_device=buffer_device,
        engine_id=engine_id or None,
        kv_connector_module_path=module,
        kv_connector_extra_config={"kv_lease_duration": lease_s},
    )


@dataclass(frozen=True, slots=True)
class SideChannel:
    """Where this engine's NIXL handshake listener binds (one free port per engine on a host)."""

    host: str = "127.0.0.1"
    port: int = 0


# NOTE: vLLM reads the side channel (and its ZMQ socket folder) from the environment, in its
# EngineCore process too, which inherits ours when it is created: engines started concurrently in
# one process take turns.
SIDE_CHANNEL_ENV_LOCK = threading.Lock()
