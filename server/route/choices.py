"""The ``n`` completions of one chat (``SamplingParams.n``), as vLLM's parallel sampling makes
them: completion ``i`` is a request of its own (``<request id>-<i>``; seed ``seed + i`` where a
seed is set), run through the router beside the others, its chunks tagged with ``i``. The
images are encoded once (the encoders' caches) and the prompt's KV is reused by the later ones
(the prefill workers' prefix caches). One completion is the request itself, untouched. A
completions request with a list of prompts (``ChatRequest.more_prompts``) has ``n`` for each,
numbered prompt by prompt, as vLLM numbers them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from epd.server.route.beam_choices import beam_chunks
from epd.server.route.request import ChatRequest
from epd.server.route.router import RouteChunk, Router
from epd.v1 import generation_pb2


@dataclass(frozen=True, slots=True)
class Choice:
    """A chunk of completion ``index``."""

    index: int
    chunk: RouteChunk


def child_requests(request: ChatRequest) -> list[ChatRequest]:
    """The requests of ``request``'s completions (itself alone when it asks for one): prompt
    ``p``'s completion ``i`` is child ``p * n + i``."""
    num_choices = max(request.sampling.n, 1)
    if num_choices == 1 and not request.more_prompts:
        return [request]
    prompts = [request.prompt_token_ids, *request.more_prompts]
    children = []
    for prompt_index, prompt in enumerate(prompts):
        for index in range(num_choices):
            sampling = generation_pb2.SamplingParams()
            sampling.CopyFrom(request.sampling)
            sampling.n = 1
            if sampling.HasField("seed"):
                sampling.seed = (sampling.seed + index) % (1 << 64)
            child_id = f"{request.request_id}-{prompt_index * num_choices + index}"
            child = replace(request, request_id=child_id, sampling=sampling, more_prompts=[])
            children.append(replace(child, prompt_token_ids=prompt))
    return children


async def generate_choices(
    router: Router, request: ChatRequest, timeout_s: float | None = None
) -> AsyncIterator[Choice]:
    """The chunks of every completion of ``request`` as they come; the first failure ends them
    all."""
    if request.use_beam_search:
        async for index, chunk in beam_chunks(router, request, timeout_s):
            yield Choice(index, chunk)
        return
    children = child_requests(request)
    if len(children) == 1:
        async for chunk in router.generate(request, timeout_s):
            yield Choice(0, chunk)
        return
    queue: asyncio.Queue[Choice | BaseException | None] = asyncio.Queue()

    async def pump(index: int, child: ChatRequest) -> None:
        try:
            async for chunk in router.generate(child, timeout_s):
                await queue.put(Choice(index, chunk))
        except Exception as e:  # noqa: BLE001 - handed to the consumer, which raises it
            await queue.put(e)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(i, child)) for i, child in enumerate(children)]
    try:
        num_running = len(tasks)
        while num_running:
            item = await queue.get()
            if item is None:
                num_running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
