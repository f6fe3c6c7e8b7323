"""The transformers backend: an aggregated engine for machines without vLLM.

It serves ``generate`` (prefill_decode and encode_prefill workers) with the model's transformers
implementation in-process: each image's embeddings (precomputed by an encoder, or computed here by
the model's own vision tower from a raw picture) enter the prompt at its image placeholders as the
model's family says (``language_model_inputs``), with the positions the family gives
(``positions``: Qwen families' M-RoPE from the model's ``get_rope_index`` with the images' grids,
LLaVA-1.5's 1-D ones), and a per-request KV cache drives the decode loop (sampling and stop
rules in ``sampler.py``, log probabilities as vLLM's engine reports them in ``logprobs.py``).

Model steps run on one worker thread; concurrent requests interleave token by token (no batching:
this is the fallback, vLLM is the fast path). Admission: at most ``max_pending_requests`` requests,
more get RESOURCE_EXHAUSTED; a request reserves KV room for its prompt and all its tokens and
waits (``num_waiting``) until the reservation fits ``kv_cache_bytes``. It does not hand KV to
decode workers (``prefill``/``decode`` raise FAILED_PRECONDITION).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from epd.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from epd.server.engine.base import (
    DEFAULT_MAX_PENDING,
    Candidates,
    Engine,
    EngineImage,
    EngineLoad,
    Sampling,
    TokenChunk,
    Usage,
)
from epd.server.engine.device import CPU, CPU_KV_CACHE_MB, DEFAULTS
from epd.server.engine.kv_budget import KvBudget, check_room, kv_capacity
from epd.server.engine.logprobs import (
    Ranked,
    RequestLogprobs,
    check_logprobs,
    prompt_ranked,
)
from epd.server.engine.prompt_check import VisionLayout
from epd.server.engine.sampler import (
    IMPLEMENTED_FIELDS,
    StopChecker,
    TokenSampler,
    bad_words_token_ids,
    check_token_ids,
)
from epd.server.engine.token_text import TokenTexts
from epd.server.engine.transformers_tower import tower_embeddings
from epd.server.models.model_dir import max_model_len

logger = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class TransformersOptions:
    """How to run the model: device, dtype and limits (see the module docstring);
    ``max_model_len`` None is the model's own context (``context_length`` of its config)."""

    device: str = CPU
    dtype: str = DEFAULTS[CPU].dtype
    max_model_len: int | None = None
    kv_cache_bytes: int = CPU_KV_CACHE_MB << 20
    max_pending_requests: int = DEFAULT_MAX_PENDING


@dataclass(slots=True)
class _Sequence:
    """One request's model state between steps."""

    cache: Any
    logits: torch.Tensor
    num_prompt_tokens: int
    position_delta: int
    # the prompt's tokens after the first, ranked, where the request asked for them
    prompt_ranked: list[Ranked]


class TransformersEngine(Engine):
    """A transformers image-text-to-text model behind the Engine interface."""

    def __init__(
        self,
        model: Any,
        processor: Any,
        model_id: str,
        layout: VisionLayout,
        options: TransformersOptions,
    ) -> None:
        self.model = model
        self.processor = processor
        self.model_id = model_id
        self.layout = layout
        self.options = options
        self.device = str(next(model.parameters()).device)
        self.embeddings_device = self.device  # NOTE: images join the input embeddings there
        self.family = layout.family
        self.max_model_len = max_model_len(options.max_model_len, model.config)
        self.budget = KvBudget(_kv_capacity(options, model.config))
        self.vocab_size = int(model.config.get_text_config().vocab_size)
        self._eos_ids = _eos_ids(model, processor)
        self._texts = TokenTexts(processor.tokenizer)
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(1, "epd-transformers")
        self._running: set[str] = set()
        self._aborted: set[str] = set()

    @classmethod
    async def start(
        cls,
        model_dir: str | Path,
        *,
        model_id: str = "",
        options: TransformersOptions | None = None,
    ) -> TransformersEngine:
        """Load the model (seconds for small models; no child process)."""
        options = options or TransformersOptions()
        if options.dtype not in DTYPES:
            raise ValueError(f"dtype {options.dtype!r} is not one of {', '.join(DTYPES)}")
        model_dir = Path(model_dir)
        config = await asyncio.to_thread(_config, model_dir)
        check_room(_kv_capacity(options, config), max_model_len(options.max_model_len, config))
        model, processor = await asyncio.to_thread(_load, model_dir, options)
        layout = VisionLayout.of(model.config, processor.tokenizer)
        return cls(model, processor, model_id or model_dir.name, layout, options)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        images: list[EngineImage],
        sampling: Sampling,
    ) -> AsyncIterator[TokenChunk]:
        self.layout.check(prompt_token_ids, images, self.max_model_len)
        if unsupported := [
            name for name in sampling.beyond_basics() if name not in IMPLEMENTED_FIELDS
        ]:
            raise InvalidArgument(
                f"{unsupported[0]} is not implemented by the transformers engine (the vLLM "
                "engine implements it)",
                reason="UNSUPPORTED_PARAMETER",
                metadata={"param": unsupported[0]},
            )
        self._admit(request_id)
        self._running.add(request_id)
        try:
            async for chunk in self._generate(request_id, prompt_token_ids, images, sampling):
                yield chunk
        finally:
            self._running.discard(request_id)
            self._aborted.discard(request_id)

    def _admit(self, request_id: str) -> None:
        if self._executor is None:
            raise Unavailable("the engine has been closed", reason="ENGINE_DEAD")
        if request_id in self._running:
            raise InvalidArgument(
                f"request {request_id!r} is already running", reason="DUPLICATE_REQUEST_ID"
            )
        if len(self._running) >= self.options.max_pending_requests:
            raise ResourceExhausted(
                f"{len(self._running)} requests already running; retry later", reason="ENGINE_BUSY"
            )

    async def _generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        images: list[EngineImage],
        sampling: Sampling,
    ) -> AsyncIterator[TokenChunk]:
        if any(image.embeddings is None for image in images):
            images = await self._step(self._encode_pictures, images)
        input_ids, ranges = self.layout.expand_with_ranges(prompt_token_ids, images)
        images = self._in_prompt_order(input_ids, ranges, images)
        max_new_tokens = min(sampling.max_tokens, self.max_model_len - len(input_ids))
        if max_new_tokens <= 0:
            raise InvalidArgument(
                f"the prompt expands to {len(input_ids)} tokens; the engine's "
                f"limit is {self.max_model_len - 1}",
                reason="PROMPT_TOO_LONG",
            )
        sampler = self._sampler(sampling, input_ids)
        report = RequestLogprobs(sampling, self.vocab_size, self._texts)
        num_reserved = len(input_ids) + max_new_tokens
        await self.budget.acquire(num_reserved)
        try:
            sequence = await self._step(self._prefill, input_ids, images, report.num_prompt_top)
            stops = StopChecker(sampling, self._eos_ids, self._decode_text, max_new_tokens)
            async for chunk in self._decode_loop(request_id, sequence, sampler, stops, report):
                yield chunk
        finally:
            self.budget.release(num_reserved)

    async def _decode_loop(
        self,
        request_id: str,
        sequence: _Sequence,
        sampler: TokenSampler,
        stops: StopChecker,
        report: RequestLogprobs,
    ) -> AsyncIterator[TokenChunk]:
        token_ids: list[int] = []
        prompt_logprobs: list[Candidates] = []
        if report.num_prompt_top is not None:
            prompt_logprobs = await self._step(report.prompt, sequence.prompt_ranked)
        while True:
            token_ids.append(sampler.select(sequence.logits, token_ids))
            logprobs = (
                [report.sample(sequence.logits, token_ids[-1])] if report.wants_samples else []
            )
            reason = stops.check(token_ids)
            if reason is None and request_id in self._aborted:
                reason = "abort"
            usage = Usage(sequence.num_prompt_tokens, len(token_ids)) if reason else None
            yield TokenChunk([token_ids[-1]], reason, usage, logprobs, prompt_logprobs)
            if reason is not None:
                return
            prompt_logprobs = []
            await self._step(self._extend, sequence, token_ids[-1])

    def _sampler(self, sampling: Sampling, input_ids: list[int]) -> TokenSampler:
        """The request's sampler; InvalidArgument for token ids the model does not have and
        for log probabilities vLLM would refuse."""
        bad_words = bad_words_token_ids(sampling.bad_words, self._encode_text)
        check_token_ids(sampling, self.vocab_size, bad_words)
        check_logprobs(sampling, self.vocab_size)
        return TokenSampler(
            sampling, input_ids, eos_token_ids=self._eos_ids, bad_words_ids=bad_words
        )

    async def _step(self, function: Any, *args: Any) -> Any:
        if self._executor is None:
            raise Unavailable("the engine has been closed", reason="ENGINE_DEAD")
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    @torch.inference_mode()
    def _prefill(
        self, input_ids: list[int], images: list[EngineImage], num_prompt_top: int | None
    ) -> _Sequence:
        """Run the prompt through the model: KV cache, the first token's logits and, with
        ``num_prompt_top`` (None: none), the prompt's tokens ranked."""
        from transformers import DynamicCache

        ids = torch.tensor([input_ids], device=self.options.device)
        embeds = self.model.get_input_embeddings()(ids)
        pictures = [image for image in images if not image.is_video]
        videos = [image for image in images if image.is_video]
        # NOTE: without images, an image token in the text is text (no image positions).
        is_image = (ids == self.layout.image_pad_id) & bool(pictures)
        is_video = (ids == (self.layout.video_pad_id or -1)) & bool(videos)
        image_inputs: dict[str, Any] = {}
        if images:
            rows = torch.cat([self._language_rows(image) for image in images])
            embeds, image_inputs = self.family.language_model_inputs(
                embeds, is_image | is_video, rows
            )
        grids = torch.tensor([list(image.grid or ()) for image in pictures], device=ids.device)
        positions, delta = self.family.positions(
            self.model, ids, is_image, grids, _video_positions(ids, is_video, videos)
        )
        cache = DynamicCache(config=self.model.config.text_config)
        hidden = self._forward(embeds, positions, cache, **image_inputs)
        ranked: list[Ranked] = []
        if num_prompt_top is not None:
            ranked = prompt_ranked(hidden[:-1], self._logits, input_ids, num_prompt_top)
        return _Sequence(cache, self._logits(hidden[-1]), len(input_ids), delta, ranked)

    def _language_rows(self, image: EngineImage) -> torch.Tensor:
        """An image's rows, or a video's as its family hands them to the language model."""
        rows = _embeddings(image)
        if not image.is_video:
            return rows
        return self.family.video_language_rows(self.model, rows)  # type: ignore[no-any-return]

    def _in_prompt_order(
        self, input_ids: list[int], ranges: list[tuple[int, int]], images: list[EngineImage]
    ) -> list[EngineImage]:
        """``images`` (pictures, then videos) in the order of their runs in ``input_ids``."""
        pictures = iter([image for image in images if not image.is_video])
        videos = iter([image for image in images if image.is_video])
        first_row = len(self.layout.image_start_ids)
        return [
            next(pictures)
            if input_ids[offset + first_row] == self.layout.image_pad_id
            else next(videos)
            for offset, _ in ranges
        ]

    @torch.inference_mode()
    def _extend(self, sequence: _Sequence, token_id: int) -> None:
        """Append ``token_id`` to the sequence: its KV and the next token's logits."""
        length = sequence.cache.get_seq_length()
        ids = torch.tensor([[token_id]], device=self.options.device)
        positions = self.family.decode_positions(length + sequence.position_delta, ids.device)
        hidden = self._forward(self.model.get_input_embeddings()(ids), positions, sequence.cache)
        sequence.logits = self._logits(hidden[-1])

    def _forward(
        self, embeds: torch.Tensor, positions: torch.Tensor, cache: Any, **image_inputs: Any
    ) -> torch.Tensor:
        """The hidden states [positions, hidden size] of ``embeds``' positions."""
        out = self.model.model.language_model(
            inputs_embeds=embeds,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **image_inputs,
        )
        return out.last_hidden_state[0]  # type: ignore[no-any-return]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The (float) logits of hidden states."""
        return self.model.lm_head(hidden).float()  # type: ignore[no-any-return]

    @torch.inference_mode()
    def _encode_pictures(self, images: list[EngineImage]) -> list[EngineImage]:
        """``images`` with raw pictures replaced by the vision tower's embeddings and grids."""
        return [
            image
            if image.embeddings is not None
            else tower_embeddings(
                self.family, self.model, self.processor, self.options.device, image
            )
            for image in images
        ]

    def _decode_text(self, token_ids: list[int]) -> str:
        return str(self.processor.tokenizer.decode(token_ids, skip_special_tokens=True))

    def _encode_text(self, text: str) -> list[int]:
        return list(self.processor.tokenizer.encode(text, add_special_tokens=False))

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)

    def load(self) -> EngineLoad:
        return EngineLoad(
            num_running=self.budget.num_holding,
            num_waiting=self.budget.num_waiting,
            kv_usage=self.budget.usage,
        )

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)


def _config(model_dir: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir)


def _kv_capacity(options: TransformersOptions, config: Any) -> int:
    return kv_capacity(config, options.kv_cache_bytes, DTYPES[options.dtype].itemsize)


def _load(model_dir: Path, options: TransformersOptions) -> tuple[Any, Any]:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=DTYPES[options.dtype])
    return model.to(options.device).eval(), processor


def _video_positions(ids: torch.Tensor, is_video: torch.Tensor, videos: list[EngineImage]) -> Any:
    """The positions' video inputs (``ModelFamily.positions``; None without videos)."""
    if not videos:
        return None
    grids = torch.tensor([list(video.grid or ()) for video in videos], device=ids.device)
    seconds = torch.tensor([video.seconds_per_temporal_patch or 1.0 for video in videos])
    return is_video, grids, seconds


def _embeddings(image: EngineImage) -> torch.Tensor:
    assert image.embeddings is not None, "pictures are encoded before prefill"
    return image.embeddings


def _eos_ids(model: Any, processor: Any) -> set[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if processor.tokenizer.eos_token_id is not None:
        ids.add(processor.tokenizer.eos_token_id)
    return ids
