"""The engine interface: what prefill and decode workers ask of a model runner.

An engine owns a model and runs requests: a prompt of token ids in which each image appears as
one placeholder of the model's family, holding the image token once (Qwen families:
``<|vision_start|><|image_pad|><|vision_end|>``; LLaVA-1.5: ``<image>``; the engine expands it to
the image's token count) plus one ``EngineImage`` per placeholder, in order. ``generate`` streams
token chunks as they are produced and ends with a chunk carrying the finish reason and usage.
Cancelling the iteration (or ``abort``) stops the request and frees its KV cache.

Who frees what: images' embeddings are the caller's tensors; the engine copies what it keeps
before ``generate`` yields its first chunk, so callers may release the producer's lease then.

Disaggregated prefill/decode (P/D) is two optional calls on two engines: ``prefill`` on a KV
producer computes the prompt's KV cache and the first token and returns ``kv_transfer_params``
(opaque to the workers, JSON-serialisable with string keys: they carry it as the KvHandle's JSON
payload, so it comes back exactly, tuples as lists); ``decode`` on a KV consumer, given the same
prompt and those params, pulls the KV cache from the producer and streams the tokens after the
first one. The producer keeps the blocks until the consumer has read them or its KV lease
expires; a handle is single-use.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from epd.common.errors import FailedPrecondition
from epd.common.generation import SAMPLING_DEFAULTS
from epd.server.media.image_settings import NO_IMAGE_SETTINGS, ImageSettings

Grid = tuple[int, int, int]
# What an engine reports at the position of one generated token, as vLLM orders it: the generated
# token first, then the most likely ones by rank; each (token id, log probability, rank, its text
# as the engine decodes it there or None).
Candidates = tuple[tuple[int, float, int, str | None], ...]
# Reason of the Unavailable a decode worker's stream ends with when the KV it was handed could not
# be read from the prefill worker (gone, or the KV dropped): the prefill worker is at fault.
KV_LOAD_FAILED = "KV_LOAD_FAILED"
# Default of every engine's options (``VllmOptions``, ``TransformersOptions``) and of the workers
# serving one: requests admitted at once. Their ``max_model_len`` defaults to None, the model's
# own context, which each engine resolves as it starts.
DEFAULT_MAX_PENDING = 64


@dataclass(frozen=True, slots=True)
class VideoFrames:
    """A video's kept frames as decoded, with the timing the route planned them with: what an
    engine that runs its own video processor and tower takes (an encode_prefill worker's)."""

    # uint8 [frames, height, width, 3] RGB at the decoded size, one per kept frame
    pixels: np.ndarray
    # the decoded clip's measured frame rate
    fps: float
    # frames the clip decoded to
    num_decoded_frames: int
    # index of each kept frame among the decoded ones
    frame_indices: tuple[int, ...]
    # (height, width) the route's plan resizes each frame to; None: not given
    resized: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class EngineImage:
    """One image of a prompt: precomputed embeddings with their grid, or a raw picture; or one
    video (``seconds_per_temporal_patch`` set): its embeddings joined from its chunks, or its
    raw kept ``frames``, with its grid (t temporal patches)."""

    mm_hash: str
    grid: Grid | None = None
    embeddings: torch.Tensor | None = None
    image: Image.Image | None = None
    # the embeddings are the image ``mm_hash``'s, as their producer's content tag says (engines
    # may name them by it instead of a hash of their bytes)
    is_bound: bool = False
    # a video's seconds per temporal patch (0.0 where its family has none); None: an image
    seconds_per_temporal_patch: float | None = None
    # a video's time of each temporal patch in seconds, shown in the prompt (Qwen3-VL); empty
    # where its family shows none
    timestamps: tuple[float, ...] = ()
    # a video's raw kept frames, for an engine that runs its own tower; None: not raw
    frames: VideoFrames | None = None
    # the pixel budget a raw picture is resized within (its mm_hash covers it); none: the
    # model's own
    image_settings: ImageSettings = NO_IMAGE_SETTINGS
    # whether this is a video (its placeholder is the model's video token); set as it is built
    is_video: bool = field(init=False, compare=False, repr=False)
    # whether the engine runs its own vision tower on it (a raw picture or raw frames); set as
    # it is built
    is_raw: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_video", self.seconds_per_temporal_patch is not None)
        object.__setattr__(self, "is_raw", self.image is not None or self.frames is not None)


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on the generated text: ``kind`` is ``json`` (``value``: a JSON schema as
    text), ``json_object`` (no value), ``regex``, ``grammar`` (text), ``structural_tag`` (an
    xgrammar structural tag as JSON text) or ``choice`` (a tuple of the allowed strings); the
    options are vLLM's ``StructuredOutputsParams``' for JSON."""

    kind: str
    value: str | tuple[str, ...] = ""
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    # whether the prompt has ended the model's reasoning, as the route's reasoning parser judged
    # it (vLLM's reasoning_ended: True constrains from the first token, False once the engine's
    # reasoning parser sees reasoning end); None: the engine's parser judges the prompt
    reasoning_ended: bool | None = None
    # the request's chat template arguments as JSON object text, for the engine's reasoning
    # parser (vLLM's reasoning_parser_kwargs); "": none
    chat_template_kwargs: str = ""


@dataclass(frozen=True, slots=True)
class RepetitionDetection:
    """vLLM's ``RepetitionDetectionParams``: stop when an n-gram of ``min_pattern_size`` (0: 1)
    to ``max_pattern_size`` tokens repeats ``min_count`` times at the end of the output."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


@dataclass(frozen=True, slots=True)
class Sampling:
    """Token selection; defaults are ``SAMPLING_DEFAULTS`` (greedy, 16 tokens) and no penalty,
    bias or constraint. The meaning of each field is vLLM's ``SamplingParams``'."""

    max_tokens: int = SAMPLING_DEFAULTS.max_tokens
    temperature: float = SAMPLING_DEFAULTS.temperature
    top_p: float = SAMPLING_DEFAULTS.top_p
    top_k: int = SAMPLING_DEFAULTS.top_k
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    bad_words: tuple[str, ...] = ()
    allowed_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    structured_output: StructuredOutput | None = None
    # most likely tokens reported beside each generated one (None: no log probabilities)
    logprobs: int | None = None
    # most likely tokens reported beside each prompt token (None: no prompt log probabilities)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # the engine's scheduling priority (lower first; ignored by first-come-first-served engines)
    priority: int = 0
    # the prompt's prefix-cache salt ("": unsalted)
    cache_salt: str = ""
    # tokens the model may reason before the engine ends its reasoning (None: no budget)
    thinking_token_budget: int | None = None
    repetition_detection: RepetitionDetection | None = None
    # vLLM's vllm_xargs as JSON object text, for custom logits processors ("": none)
    vllm_xargs: str = ""
    # report these token ids' log probabilities at each position instead of the most likely
    # tokens' (vLLM's logprob_token_ids; (): none)
    logprob_token_ids: tuple[int, ...] = ()

    def beyond_basics(self) -> list[str]:
        """The names of the fields set beyond the basic ones (max_tokens ... ignore_eos): what an
        engine that implements only those must refuse."""
        return [
            name
            for name in EXTENDED_SAMPLING_FIELDS
            if getattr(self, name) != getattr(BASIC_SAMPLING, name)
        ]


BASIC_SAMPLING = Sampling()
EXTENDED_SAMPLING_FIELDS = (
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "min_tokens",
    "logit_bias",
    "bad_words",
    "allowed_token_ids",
    "include_stop_str_in_output",
    "structured_output",
    "logprobs",
    "prompt_logprobs",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "logprob_token_ids",
    "thinking_token_budget",
    "repetition_detection",
    "vllm_xargs",
)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """Tokens produced since the previous chunk; the last chunk has finish_reason and usage."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    # one entry per token of token_ids when the sampling asked for log probabilities
    logprobs: list[Candidates] = field(default_factory=list)
    # on the first chunk, one entry per prompt token when the sampling asked for prompt log
    # probabilities (the first position's empty: nothing precedes it)
    prompt_logprobs: list[Candidates] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """The first token of a prefilled request and what a decode engine needs to continue it.

    ``kv_transfer_params`` is None when generation ended at the first token (``finish_reason``
    set): there is nothing to decode.
    """

    first_token_id: int
    finish_reason: str | None
    kv_transfer_params: dict[str, Any] | None
    usage: Usage
    # the first token's candidates when the sampling asked for log probabilities
    first_logprobs: Candidates | None = None
    # one entry per prompt token when the sampling asked for prompt log probabilities (as
    # ``TokenChunk.prompt_logprobs``)
    prompt_logprobs: list[Candidates] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a worker reports in heartbeats."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0


class Engine(ABC):
    """A model runner. Methods are called from one asyncio event loop."""

    model_id: str
    device: str = "cpu"
    """Where the model runs, as torch names it (``cpu``, ``cuda:0``): what the worker registers."""
    embeddings_device: str = "cpu"
    """Where the engine takes images' embeddings, as torch names it: ``cpu`` when it reads them
    from host memory (vLLM's engines), its ``device`` when it builds its inputs there. What the
    worker registers, so encoders hand embeddings over into it; callers may pass tensors on any
    device all the same."""

    @abstractmethod
    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        images: list[EngineImage],
        sampling: Sampling,
    ) -> AsyncIterator[TokenChunk]:
        """Stream the generation of one request (see the module docstring)."""

    async def prefill(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        images: list[EngineImage],
        sampling: Sampling,
    ) -> PrefillResult:
        """Compute the prompt's KV cache and first token, keep the KV for a decode engine.

        Only engines started as KV producers implement it; others raise FailedPrecondition.
        Cancelling the call aborts the request and frees its KV blocks.
        """
        raise FailedPrecondition(
            "this engine does not hand its KV cache to decode workers",
            reason="KV_TRANSFER_DISABLED",
        )

    def decode(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        first_token_id: int,
        kv_transfer_params: dict[str, Any],
    ) -> AsyncIterator[TokenChunk]:
        """Pull the KV cache ``prefill`` returned and stream the tokens after ``first_token_id``.

        ``kv_transfer_params`` are exactly what ``prefill`` returned: the engine learns from them
        what it needs of the prompt's images (their KV is pulled, never recomputed) and of the
        prefill's sampling. Usage on the last chunk counts the whole request, first token
        included. Only KV consumers implement it.
        """
        raise FailedPrecondition(
            "this engine does not take KV caches from prefill workers",
            reason="KV_TRANSFER_DISABLED",
        )

    async def abort(self, request_id: str) -> None:  # noqa: B027 - optional hook
        """Stop ``request_id`` if it is running; unknown ids are ignored."""

    def load(self) -> EngineLoad:
        """Current load (for heartbeats and admission)."""
        return EngineLoad()

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop the engine and free its resources (processes, memory)."""
