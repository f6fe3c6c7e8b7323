"""The vLLM backend: AsyncLLM in the worker process (it runs its EngineCore in a child process).

Image embeddings go in as ``multi_modal_data={"image": {"image_embeds": [N, hidden],
"image_grid_thw": [num_images, 3]}}`` with ``enable_mm_embeds``; raw pictures as a list of
images (the engine then runs its own vision tower). Outputs stream as deltas.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from epd.server.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from epd.server.engine.base import Engine, EngineImage, EngineLoad, Sampling, TokenChunk, Usage
from epd.server.engine.prompt_check import VisionLayout

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """How to start the engine (sizes chosen for CPU machines by default)."""

    dtype: str = "float32"
    max_model_len: int = 4096
    kv_cache_bytes: int = 256 << 20
    max_images_per_prompt: int = 8
    max_pending_requests: int = 64
    enforce_eager: bool = True


def _layout(model_dir: Path) -> VisionLayout:
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return VisionLayout(
        vision_start_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        image_pad_id=config.image_token_id,
        merge_size=config.vision_config.spatial_merge_size,
        hidden_size=config.text_config.hidden_size,
    )  # fmt: skip


class VllmEngine(Engine):
    """An AsyncLLM behind the Engine interface, with bounded admission."""

    def __init__(self, llm: Any, model_id: str, layout: VisionLayout, options: VllmOptions) -> None:
        self._llm = llm
        self.model_id = model_id
        self.layout = layout
        self.options = options
        self._running: set[str] = set()

    @classmethod
    async def start(cls, model_dir: str | Path, *, model_id: str = "",
                    options: VllmOptions | None = None) -> VllmEngine:  # fmt: skip
        """Start the engine (tens of seconds on CPU: vLLM spawns and warms its EngineCore)."""
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        options = options or VllmOptions()
        model_dir = Path(model_dir)
        args = AsyncEngineArgs(
            model=str(model_dir), dtype=options.dtype, enforce_eager=options.enforce_eager,
            max_model_len=options.max_model_len, kv_cache_memory_bytes=options.kv_cache_bytes,
            enable_mm_embeds=True, limit_mm_per_prompt={"image": options.max_images_per_prompt},
            served_model_name=model_id or model_dir.name,
        )  # fmt: skip
        llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
        return cls(llm, model_id or model_dir.name, _layout(model_dir), options)

    async def generate(  # type: ignore[override]
        self, request_id: str, prompt_token_ids: list[int], images: list[EngineImage],
        sampling: Sampling,
    ) -> AsyncIterator[TokenChunk]:
        self.layout.check(prompt_token_ids, images, self.options.max_model_len)
        if len(self._running) >= self.options.max_pending_requests:
            raise ResourceExhausted(f"{len(self._running)} requests already running; retry later",
                                    reason="ENGINE_BUSY")  # fmt: skip
        if self._llm.errored:
            raise Unavailable("the vLLM engine has failed; restart the worker",
                              reason="ENGINE_DEAD")  # fmt: skip
        prompt: dict[str, Any] = {"prompt_token_ids": list(prompt_token_ids)}
        if images:
            prompt["multi_modal_data"] = _multi_modal_data(images)
        self._running.add(request_id)
        num_generated = 0
        try:
            async for output in self._llm.generate(prompt, _sampling_params(sampling), request_id):
                completion = output.outputs[0]
                num_generated += len(completion.token_ids)
                usage = None
                if output.finished:
                    num_prompt = len(output.prompt_token_ids or prompt_token_ids)
                    usage = Usage(num_prompt, num_generated, output.num_cached_tokens or 0)
                yield TokenChunk(list(completion.token_ids),
                                 completion.finish_reason if output.finished else None, usage)
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(request_id)
            raise
        except ValueError as e:
            raise InvalidArgument(f"the engine refused the request: {e}",
                                  reason="ENGINE_REJECTED") from e  # fmt: skip
        finally:
            self._running.discard(request_id)

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    def load(self) -> EngineLoad:
        return EngineLoad(num_running=len(self._running))

    async def close(self) -> None:
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        llm.shutdown()
        # NOTE: drop the last reference now: AsyncLLM.__del__ run at interpreter exit fails noisily.
        del llm
        gc.collect()


def _multi_modal_data(images: list[EngineImage]) -> dict[str, Any]:
    if all(image.embeddings is not None for image in images):
        embeds = torch.cat([image.embeddings for image in images if image.embeddings is not None])
        grids = torch.tensor([image.grid for image in images], dtype=torch.int64)
        return {"image": {"image_embeds": embeds, "image_grid_thw": grids}}
    if all(image.image is not None for image in images):
        return {"image": [image.image for image in images]}
    raise InvalidArgument("a prompt's images must be all embeddings or all pictures",
                          reason="MIXED_IMAGE_INPUTS")  # fmt: skip


def _sampling_params(sampling: Sampling) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    if sampling.max_tokens < 1:
        raise InvalidArgument("max_tokens must be at least 1", reason="BAD_SAMPLING")
    try:
        return SamplingParams(
            max_tokens=sampling.max_tokens, temperature=sampling.temperature,
            top_p=sampling.top_p, top_k=sampling.top_k or -1, seed=sampling.seed,
            stop=list(sampling.stop) or None, stop_token_ids=list(sampling.stop_token_ids) or None,
            ignore_eos=sampling.ignore_eos, output_kind=RequestOutputKind.DELTA,
        )  # fmt: skip
    except ValueError as e:
        raise InvalidArgument(f"bad sampling parameters: {e}", reason="BAD_SAMPLING") from e
