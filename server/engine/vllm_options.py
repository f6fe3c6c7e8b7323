"""How a vLLM engine is started (``VllmOptions``), and the options as the started engine settled
them (``as_started``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from epd.server.engine.base import DEFAULT_MAX_PENDING
from epd.server.engine.device import CPU, CPU_KV_CACHE_MB, DEFAULTS
from epd.server.engine.vllm_inputs import DEFAULT_KV_LEASE_S, SideChannel
from epd.server.media.policy import DEFAULT_MAX_VIDEOS


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """How to start the engine (CPU settings by default; ``epd.server.engine.device`` has the
    defaults of each device).

    ``device``: ``cpu`` or ``cuda:N``, the one vLLM's build runs on (``start`` checks), as
    registered with the scheduler; KV-transfer engines keep their KV buffer there.
    ``max_model_len``: None is the model's own context, as vLLM derives it.
    ``kv_cache_bytes``: None sizes the cache from ``gpu_memory_utilization`` (GPU only).
    ``max_num_seqs`` / ``max_num_batched_tokens``: None are vLLM's defaults for the device.
    ``kv_role``: None (no KV transfer), ``kv_producer`` (serves ``prefill``), ``kv_consumer``
    (serves ``decode``) or ``kv_both``. ``side_channel``: where the NIXL handshake listens
    (port 0: a free port). ``kv_lease_s``: how long a producer keeps KV blocks that no decode
    worker reads (a cancelled request's), the same on both sides. ``cpu_threads``: on CPU, the
    model's torch threads (None: every CPU this process may use but one, the layout vLLM's own
    CPU executor uses, which keeps one core for its scheduling). ``overrides``: more
    ``AsyncEngineArgs`` fields by name (``vllm_args.parse_engine_args``), applied over every
    value epd computes from the settings above; ``start`` reads the prompt limits
    (``max_model_len``, images and videos per prompt) back from the engine when they override
    those or leave them to vLLM. ``max_videos_per_prompt``: vLLM's ``limit_mm_per_prompt`` for
    video, given explicitly (the route's ``--media-max-videos`` default). ``reasoning_parser``:
    vLLM's reasoning parser (``vllm serve --reasoning-parser``; None: none): structured outputs
    start after the reasoning, and ``thinking_token_budget`` is accepted
    (``vllm_inputs.generate_options``).
    """

    device: str = CPU
    dtype: str = DEFAULTS[CPU].dtype
    max_model_len: int | None = None
    kv_cache_bytes: int | None = CPU_KV_CACHE_MB << 20
    gpu_memory_utilization: float = 0.92  # vLLM's default
    tensor_parallel_size: int = 1
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_images_per_prompt: int = 8
    max_videos_per_prompt: int = DEFAULT_MAX_VIDEOS
    max_pending_requests: int = DEFAULT_MAX_PENDING
    enforce_eager: bool = DEFAULTS[CPU].enforce_eager
    kv_role: str | None = None
    side_channel: SideChannel = field(default_factory=SideChannel)
    kv_lease_s: int = DEFAULT_KV_LEASE_S
    cpu_threads: int | None = None
    reasoning_parser: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)


def as_started(options: VllmOptions, model_config: Any) -> VllmOptions:
    """``options`` with the prompt limits the engine settled on where overrides set them."""
    if options.max_model_len is None or "max_model_len" in options.overrides:
        options = replace(options, max_model_len=model_config.max_model_len)
    multimodal = model_config.multimodal_config
    if "limit_mm_per_prompt" in options.overrides and multimodal is not None:
        options = replace(
            options,
            max_images_per_prompt=multimodal.get_limit_per_prompt("image"),
            max_videos_per_prompt=multimodal.get_limit_per_prompt("video"),
        )
    return options
