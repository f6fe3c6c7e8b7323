"""VllmOptions -> vLLM's engine arguments (built without starting anything).

vLLM picks its device from its build (its platform); ``check_platform`` refuses options for
another device before an engine is started on the wrong one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from epd.server.engine.device import device_type
from epd.server.engine.vllm_inputs import kv_transfer_config

if TYPE_CHECKING:
    from epd.server.engine.vllm_engine import VllmOptions


def engine_args(model_dir: Path, model_id: str, options: VllmOptions) -> Any:
    """``AsyncEngineArgs`` for serving ``model_dir`` as ``model_id`` with ``options``.

    Settings left None (KV cache size, sequences, batched tokens) are vLLM's to choose for the
    device. The KV buffer of a KV-transfer engine lives on the engine's device.
    """
    from vllm import AsyncEngineArgs

    kv_config = None
    if options.kv_role:
        kv_config = kv_transfer_config(
            options.kv_role,
            lease_s=options.kv_lease_s,
            buffer_device=device_type(options.device),
        )
    return AsyncEngineArgs(
        model=str(model_dir),
        served_model_name=model_id or model_dir.name,
        dtype=options.dtype,
        enforce_eager=options.enforce_eager,
        max_model_len=options.max_model_len,
        kv_cache_memory_bytes=options.kv_cache_bytes,
        gpu_memory_utilization=options.gpu_memory_utilization,
        tensor_parallel_size=options.tensor_parallel_size,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        enable_mm_embeds=True,
        limit_mm_per_prompt={"image": options.max_images_per_prompt},
        disable_log_stats=False,
        kv_transfer_config=kv_config,
    )


def check_platform(device: str, platform_device_type: str) -> None:
    """ValueError unless vLLM's build runs on ``device`` (its platform's ``device_type``)."""
    if device_type(device) != platform_device_type:
        raise ValueError(
            f"this vLLM build runs on {platform_device_type or 'no device it recognises'}, "
            f"not {device} (scripts/install.sh --target cpu|cuda installs the build for a device)"
        )
