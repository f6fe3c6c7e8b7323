"""The prompt as the engine holds it, from the route's tokens and loaded media (no grpc).

The rendered prompt keeps one placeholder per image and video; the engine expands each to its
token count. What the route derives from that expanded prompt, each from the counts the media
step computed once (``media.RouteImage``, ``media.RouteVideo``): its block hashes for KV-aware
routing (``block_hashes``), the cut a request's ``truncate_prompt_tokens`` asks for
(``truncated``), the expanded token ids, checked against the model's context before anything is
encoded and given back to a request that asks for them (``engine_prompt``), and the prefill
worker's prompt with the encoders' embedding references (``embedded``).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace

from epd.server.media.hashing import salted
from epd.server.route.encoding import EncodeStage
from epd.server.route.media import RouteImage, RouteVideo, video_input
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatRequest, bad
from epd.v1 import generation_pb2, multimodal_pb2


def block_hashes(
    prompts: PromptBuilder,
    token_ids: list[int],
    images: list[RouteImage],
    videos: list[RouteVideo],
    salt: str = "",
) -> list[int]:
    """The expanded prompt's block hashes, each image and video named by its (salted) hash."""
    return prompts.block_hashes(
        token_ids,
        [(image.item.mm_hash, image.num_tokens) for image in images],
        [(salted(v.video.video_hash, salt), prompts.video_tokens(v.video.plan)) for v in videos],
        salt,
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
    image_tokens = [image.num_tokens for image in images]
    video_tokens = [prompts.video_tokens(v.video.plan) for v in videos]
    keep, side = request.truncate_prompt_tokens, request.truncation_side
    return prompts.truncated(token_ids, keep, side, image_tokens, video_tokens)


def engine_prompt(
    prompts: PromptBuilder,
    token_ids: list[int],
    images: list[RouteImage],
    videos: list[RouteVideo],
    param: str = "messages",
) -> list[int]:
    """The prompt's token ids as the engine holds them, each image and video expanded; a 400
    naming ``param`` (``PROMPT_TOO_LONG``, as the engines refuse it) when they leave no room
    for an answer in the model's context, so that nothing is encoded for a prompt the engine
    would refuse."""
    image_tokens = [image.num_tokens for image in images]
    video_tokens = [prompts.video_tokens(v.video.plan) for v in videos]
    expanded = prompts.expanded_ids(token_ids, image_tokens, video_tokens)
    context = prompts.max_context_tokens
    if context is not None and len(expanded) >= context:
        raise bad(
            f"the prompt expands to {len(expanded)} tokens; the model's context is {context} "
            "tokens, which leaves no room for an answer",
            param,
            "PROMPT_TOO_LONG",
        )
    return expanded


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
