"""The vLLM backend: an AsyncLLM in the worker process, its EngineCore in a child process
(``vllm_process.create_llm``; on CPU the model runs inside that EngineCore, with no worker process
of its own).

A request's token ids and images become vLLM's input through vLLM's own renderer
(``Renderer.render_cmpl_async``). Raw pictures go in as ``multi_modal_data`` images, and vLLM runs
its processor and vision tower. Embeddings, and decode's grid-only images, go in as vLLM's public
input for embeddings, built by ``vllm_embeds.embeddings_prompt`` and named through
``multi_modal_uuids``; only a family whose items vLLM's renderer makes wrongly
(``ModelFamily.vllm_items``) skips the renderer: ``vllm_embeds`` builds its input as the renderer
would, and the engine puts its items into vLLM's processor cache. Admission is bounded (requests
running, images per prompt), outputs stream as deltas, and a stream closed early aborts its
request.

P/D: an engine started with ``kv_role`` runs vLLM's NixlConnector with the KV buffer on the
engine's device (``vllm_args.engine_args``). ``prefill`` asks for one token with
``do_remote_decode``; the connector keeps the blocks and returns ``kv_transfer_params``;
``decode`` on the consumer passes them back, vLLM pulls the blocks over NIXL, recomputes the last
prompt token (so it samples the first token again, with the same seed) and goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import random
import shutil
import sys
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from epd.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from epd.server.engine.base import (
    Candidates,
    Engine,
    EngineImage,
    EngineLoad,
    Grid,
    PrefillResult,
    Sampling,
    TokenChunk,
    Usage,
)
from epd.server.engine.prompt_check import VisionLayout
from epd.server.engine.rpc_leftovers import rpc_dir_prefix
from epd.server.engine.vllm_args import check_platform, engine_args
from epd.server.engine.vllm_embeds import (
    IMAGE_GRIDS_KEY,
    IMAGE_HASHES_KEY,
    VIDEO_SECONDS_KEY,
    VIDEO_TIMESTAMPS_KEY,
    embeddings_prompt,
    take_handle_images,
)
from epd.server.engine.vllm_inputs import (
    SideChannel,
    candidates,
    chunk_of,
    generate_options,
    prompt_candidates,
    raw_prompt,
    request_failed,
    sampling_params,
)
from epd.server.engine.vllm_options import VllmOptions, as_started
from epd.server.engine.vllm_process import create_llm, destroy_zmq_context, side_channel_port
from epd.server.engine.vllm_stats import LoadTracker

logger = logging.getLogger(__name__)
SEED_KEY = "epd_seed"
# How long ``close`` lets vLLM's EngineCore stop before it is killed: longer than the EngineCore
# itself waits for its worker process (5 s, then SIGTERM and 4 s more). vLLM's default (5 s)
# killed an EngineCore still waiting for a slow worker, leaving its shared memory to Python's
# resource_tracker ("leaked shared_memory objects").
ENGINE_CORE_STOP_S = 15.0


def _layout(model_dir: Path) -> VisionLayout:
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return VisionLayout.of(AutoConfig.from_pretrained(model_dir), tokenizer)


class VllmEngine(Engine):
    """An AsyncLLM behind the Engine interface, with bounded admission."""

    def __init__(
        self,
        llm: Any,
        model_id: str,
        layout: VisionLayout,
        options: VllmOptions,
        tracker: LoadTracker | None = None,
        model_dir: Path = Path(),
        rpc_dir: Path | None = None,
    ) -> None:
        """``rpc_dir``: the folder of ``llm``'s ZMQ sockets, removed by ``close``."""
        self._llm = llm
        self.model_id = model_id
        self.layout = layout
        self.options = options
        # NOTE: as the started engine settled it (``start`` reads it back); an engine around an
        # AsyncLLM that ``start`` did not make, with no value given, leaves the check to vLLM.
        self.max_model_len = options.max_model_len or sys.maxsize
        self.device = options.device
        self._tracker = tracker or LoadTracker()
        self._running: set[str] = set()
        self._gridder: Any = None
        multimodal = getattr(getattr(llm, "model_config", None), "multimodal_config", None)
        self._hash_algorithm = getattr(multimodal, "mm_hasher_algorithm", "blake3")
        self.model_dir = model_dir
        self._rpc_dir = rpc_dir

    @classmethod
    async def start(
        cls, model_dir: str | Path, *, model_id: str = "", options: VllmOptions | None = None
    ) -> VllmEngine:
        """Start the engine (tens of seconds on CPU: vLLM spawns and warms its EngineCore)."""
        from vllm.platforms import current_platform

        options = options or VllmOptions()
        check_platform(options.device, current_platform.device_type)
        model_dir = Path(model_dir)
        if options.kv_role and not options.side_channel.port:
            host = options.side_channel.host
            options = replace(options, side_channel=SideChannel(host, side_channel_port(host)))
        args = engine_args(model_dir, model_id, options)
        tracker = LoadTracker()
        rpc_dir = Path(tempfile.mkdtemp(prefix=rpc_dir_prefix(os.getpid())))
        try:
            llm = await asyncio.to_thread(create_llm, args, options, tracker, rpc_dir)
        except BaseException:
            shutil.rmtree(rpc_dir, ignore_errors=True)
            raise
        options = as_started(options, llm.model_config)
        name = model_id or model_dir.name
        engine = cls(llm, name, _layout(model_dir), options, tracker, model_dir, rpc_dir)
        # NOTE: this frame may outlive the call: when it made the process's first vLLM import,
        # the ModuleNotFoundError that vLLM keeps (vllm.multimodal.media.audio, torchcodec) holds
        # the frames of that import, this one included. A local AsyncLLM here stayed alive after
        # close, and its __del__ ran at interpreter exit and failed (TypeError in shutdown).
        del llm
        return engine

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        images: list[EngineImage],
        sampling: Sampling,
    ) -> AsyncIterator[TokenChunk]:
        self.layout.check(prompt_token_ids, images, self.max_model_len)
        params = sampling_params(sampling)
        num_generated = 0
        # NOTE: aclosing: a consumer closing this stream early aborts the request at once, not
        # whenever the inner generator happens to be collected.
        async with contextlib.aclosing(
            self._run(request_id, prompt_token_ids, images, params, sampling)
        ) as outputs:
            async for output in outputs:
                num_generated += len(output.outputs[0].token_ids)
                yield chunk_of(output, prompt_token_ids, num_generated)

    async def prefill(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        images: list[EngineImage],
        sampling: Sampling,
    ) -> PrefillResult:
        self._require_role("kv_producer", "prefill")
        self.layout.check(prompt_token_ids, images, self.max_model_len)
        seed = sampling.seed
        if seed is None and sampling.temperature > 0:
            # NOTE: the decode engine samples the first token again; the same seed: the same token.
            seed = random.getrandbits(63)
        # NOTE: a one-token answer ends here (a beam search's every step): no decode worker
        # reads its KV, which vLLM would hold for it until the lease (kv_lease_s) ran out
        handoff = {"do_remote_decode": True} if sampling.max_tokens > 1 else None
        params = sampling_params(
            replace(sampling, seed=seed), max_tokens=1, kv_transfer_params=handoff
        )
        final, prompt_logprobs = None, list[Candidates]()
        async for output in self._run(request_id, prompt_token_ids, images, params, sampling):
            final = output if final is None or output.finished else final
            if output.prompt_logprobs:  # NOTE: asked for: not on an ordinary request's path
                prompt_logprobs = prompt_candidates(output.prompt_logprobs)
        if final is None or not final.outputs[0].token_ids:
            raise Unavailable("the engine produced no first token", reason="ENGINE_NO_OUTPUT")
        completion = final.outputs[0]
        usage = Usage(
            len(final.prompt_token_ids or prompt_token_ids), 1, final.num_cached_tokens or 0
        )
        reason = completion.finish_reason
        if reason == "length" and sampling.max_tokens > 1:
            reason = None
        handle = None if reason else dict(final.kv_transfer_params or {})
        if handle is not None:
            handle[IMAGE_GRIDS_KEY] = [list(self._grid(image)) for image in images]
            handle[IMAGE_HASHES_KEY] = [image.mm_hash for image in images]
            if any(image.is_video for image in images):
                handle[VIDEO_SECONDS_KEY] = [image.seconds_per_temporal_patch for image in images]
                handle[VIDEO_TIMESTAMPS_KEY] = [
                    list(image.timestamps) if image.is_video else None for image in images
                ]
            if seed is not None:
                handle[SEED_KEY] = seed
        first_logprobs = candidates(completion.logprobs[0]) if completion.logprobs else None
        return PrefillResult(
            int(completion.token_ids[0]), reason, handle, usage, first_logprobs, prompt_logprobs
        )

    async def decode(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        first_token_id: int,
        kv_transfer_params: dict[str, Any],
    ) -> AsyncIterator[TokenChunk]:
        self._require_role("kv_consumer", "decode")
        kv_params = dict(kv_transfer_params)
        seed = kv_params.pop(SEED_KEY, sampling.seed)
        images = take_handle_images(kv_params)
        if not kv_params.get("do_remote_prefill") or not (seed is None or type(seed) is int):
            raise InvalidArgument(
                "the KV handle is not one a prefill worker returned", reason="BAD_KV_HANDLE"
            )
        self.layout.check(prompt_token_ids, images, self.max_model_len, grids_suffice=True)
        # NOTE: the prompt's log probabilities are the prefill worker's to report.
        sampling = replace(sampling, seed=seed, prompt_logprobs=None)
        params = sampling_params(sampling, kv_transfer_params=kv_params)
        is_first, num_generated = True, 0
        async with contextlib.aclosing(
            self._run(request_id, prompt_token_ids, images, params, sampling)
        ) as outputs:
            async for output in outputs:
                num_generated += len(output.outputs[0].token_ids)
                chunk = chunk_of(output, prompt_token_ids, num_generated)
                if is_first and chunk.token_ids:
                    is_first = False
                    if chunk.token_ids[0] != first_token_id:
                        logger.warning(
                            "request %s: decode resampled first token %d, prefill gave %d",
                            request_id,
                            chunk.token_ids[0],
                            first_token_id,
                        )
                    chunk = replace(
                        chunk, token_ids=chunk.token_ids[1:], logprobs=chunk.logprobs[1:]
                    )
                yield chunk

    async def _run(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        images: list[EngineImage],
        params: Any,
        sampling: Sampling,
    ) -> AsyncGenerator[Any, None]:
        """vLLM's outputs for one request (``params``: ``sampling`` as vLLM's; the priority
        and cache salt are the request's), admitted, with abort on cancellation."""
        if len(self._running) >= self.options.max_pending_requests:
            raise ResourceExhausted(
                f"{len(self._running)} requests already running; retry later", reason="ENGINE_BUSY"
            )
        if self._llm is None or self._llm.errored:
            raise Unavailable(
                "the vLLM engine has stopped or failed; restart the worker", reason="ENGINE_DEAD"
            )
        if request_id in self._running:
            raise InvalidArgument(
                f"request {request_id!r} is already running", reason="DUPLICATE_REQUEST_ID"
            )
        num_videos = sum(image.is_video for image in images)
        if len(images) - num_videos > self.options.max_images_per_prompt:
            raise InvalidArgument(
                f"{len(images) - num_videos} images; this engine takes at most "
                f"{self.options.max_images_per_prompt} per prompt",
                reason="TOO_MANY_IMAGES",
            )
        if num_videos > self.options.max_videos_per_prompt:
            raise InvalidArgument(
                f"{num_videos} videos; this engine takes at most "
                f"{self.options.max_videos_per_prompt} per prompt",
                reason="TOO_MANY_VIDEOS",
            )
        from vllm.exceptions import VLLMClientError

        self._running.add(request_id)
        try:
            prompt = await self._render(request_id, prompt_token_ids, images)
            if sampling.cache_salt:
                prompt["cache_salt"] = sampling.cache_salt
            outputs = self._llm.generate(
                prompt, params, request_id, priority=sampling.priority, **generate_options(sampling)
            )
            async for output in outputs:
                if output.finished and output.outputs[0].finish_reason == "error":
                    raise request_failed(params)
                yield output
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(request_id)
            raise
        except (ValueError, VLLMClientError) as e:
            raise InvalidArgument(
                f"the engine refused the request: {e}", reason="ENGINE_REJECTED"
            ) from e
        finally:
            self._running.discard(request_id)

    async def _render(
        self, request_id: str, prompt_token_ids: list[int], images: list[EngineImage]
    ) -> dict[str, Any]:
        """vLLM's rendered input (``Renderer.render_cmpl``): pictures raw (vLLM runs its
        processor), embeddings and grids as ``embeddings_prompt`` gives them."""
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        assert self._llm is not None
        prompt: dict[str, Any] = {"prompt_token_ids": list(prompt_token_ids)}
        if images and any(image.is_raw for image in images):
            prompt = raw_prompt(prompt_token_ids, images)
        elif images:
            prompt = embeddings_prompt(
                request_id, prompt_token_ids, images, self.layout, self._hash_algorithm
            )
        if prompt.get("type") == "multimodal":
            # NOTE: what vLLM's renderer does with the items it made: its processor cache sends
            # an item the EngineCore already holds as a name only.
            self._llm.input_processor.inject_into_mm_cache(prompt["mm_hashes"], prompt["mm_kwargs"])
            return prompt
        renderer = self._llm.renderer
        parsed = parse_model_prompt(self._llm.model_config, prompt)
        (engine_input,) = await renderer.render_cmpl_async([parsed])
        rendered: dict[str, Any] = engine_input
        return rendered

    def _grid(self, image: EngineImage) -> Grid:
        if image.grid is not None or image.image is None:
            return image.grid or (0, 0, 0)
        if self._gridder is None:
            from epd.server.media.grid import ImageGridder

            self._gridder = ImageGridder(self.model_dir)
        grid: Grid = self._gridder.grid(image.image)
        return grid

    def _require_role(self, role: str, call: str) -> None:
        if self.options.kv_role not in (role, "kv_both"):
            raise FailedPrecondition(
                f"{call} needs an engine started with kv_role {role} "
                f"(this one: {self.options.kv_role})",
                reason="KV_TRANSFER_DISABLED",
            )

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    def load(self) -> EngineLoad:
        stats = self._tracker.latest
        return EngineLoad(
            num_running=max(len(self._running) - stats.num_waiting, 0),
            num_waiting=stats.num_waiting,
            kv_usage=stats.kv_usage,
        )

    async def close(self) -> None:
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        llm.shutdown(timeout=ENGINE_CORE_STOP_S)
        destroy_zmq_context(llm)
        # NOTE: drop the last reference now: AsyncLLM.__del__ run at interpreter exit fails noisily.
        del llm
        gc.collect()
        if self._rpc_dir is not None:
            # NOTE: libzmq never unlinks a named ipc socket file: without this, every engine left
            # its three sockets (/tmp/<uuid>) behind.
            shutil.rmtree(self._rpc_dir, ignore_errors=True)
