"""The prompt as the engine holds it, from the route's tokens and loaded media (no grpc).

The rendered prompt keeps one placeholder per image and video; the engine expands each to its
token count. What the route derives from that expanded prompt, each from the counts the media
step computed once (``media.RouteImage``, ``media.RouteVideo``): its block hashes for KV-aware
routing, from the same expansion that is checked against the model's context before anything is
encoded (``block_hashes``), the cut a request's ``truncate_prompt_tokens`` asks for
(``truncated``), the expanded token ids for a request that asks for them (``expanded``), and the
prefill worker's prompt with the encoders' embedding references (``embedded``).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace

from epd.server.media.hashing import salted
from epd.server.route.encoding import EncodeStage
from epd.server.route.media import RouteImage, RouteVideo, video_input
from epd.server.route.prompt import PromptBuilder, VideoTokens
from epd.server.route.request import ChatRequest
from epd.v1 import generation_pb2, multimodal_pb2


def block_hashes(
    prompts: PromptBuilder,
    token_ids: list[int],
    images: list[RouteImage],
    videos: list[RouteVideo],
    salt: str = "",
    param: str = "messages",
) -> list[int]:
    """The expanded prompt's block hashes, each image and video named by its (salted) hash; a
    400 naming ``param`` when the prompt leaves no room in the model's context
    (``PromptBuilder.block_hashes``)."""
    return prompts.block_hashes(
        token_ids,
        [(image.item.mm_hash, image.num_tokens) for image in images],
        [(salted(video.video.video_hash, salt), video.tokens) for video in videos],
        salt,
        param,
    )


def truncated(
    prompts: PromptBuilder,
    request: ChatRequest,
    token_ids: list[int],
    images: list[RouteImage],
    videos: list[RouteVideo],
) -> list[int]:
    """The prompt cut to the request's ``truncate_prompt_tokens``, as vLLM cuts it."""
    assert request.truncate_prompt_tokens is not None
    keep, side = request.truncate_prompt_tokens, request.truncation_side
    return prompts.truncated(token_ids, keep, side, *_media_tokens(images, videos))


def expanded(
    prompts: PromptBuilder,
    token_ids: list[int],
    images: list[RouteImage],
    videos: list[RouteVideo],
) -> list[int]:
    """The prompt's token ids as the engine holds them, each image and video expanded (for a
    request that asks for them)."""
    return prompts.expanded_ids(token_ids, *_media_tokens(images, videos))


def _media_tokens(
    images: list[RouteImage], videos: list[RouteVideo]
) -> tuple[list[int], list[VideoTokens]]:
    """What each image and each video expands to in the engine's prompt, in prompt order."""
    return [image.num_tokens for image in images], [video.tokens for video in videos]


def embedded(
    token_ids: Sequence[int],
    stage: EncodeStage,
    images: list[RouteImage],
    videos: Sequence[RouteVideo],
) -> generation_pb2.Prompt:
    """The prompt with the encoders' embedding references (every item encoded)."""
    span = trace.get_current_span()
    span.set_attribute("epd.encoder_ids", sorted(stage.encoder_ids))
    span.set_attribute("epd.cache_hits", sum(r.cache_hit for r in stage.results.values()))
    span.set_attribute(
        "epd.embedding_bytes", sum(r.embeddings.byte_size for r in stage.results.values())
    )
    inputs = []
    for index, image in enumerate(images):
        result = stage.results[index]
        inputs.append(
            multimodal_pb2.ImageInput(
                mm_hash=result.mm_hash,
                grid=result.grid if result.HasField("grid") else image.grid,
                embeddings=result.embeddings,
            )
        )
    video_inputs, index = [], len(images)
    for video in videos:
        results = [stage.results[index + i] for i in range(len(video.items))]
        video_inputs.append(video_input(video, results))
        index += len(video.items)
    return generation_pb2.Prompt(token_ids=token_ids, images=inputs, videos=video_inputs)
