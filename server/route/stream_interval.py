"""vLLM's ``stream_interval`` on either door's streams (no I/O): a completion's chunks
gathered so that each streamed one carries at least that many tokens, its first and last sent
at once, as vLLM's output processor batches a request's outputs
(``RequestState.make_request_output``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from epd.server.route.choices import Choice
from epd.server.route.router import RouteChunk


async def batched(choices: AsyncIterator[Choice], interval: int) -> AsyncIterator[Choice]:
    """``choices`` with each completion's chunks joined: its first chunk, then one each time
    ``interval`` tokens have come since the last one sent, then its last (the one that
    finishes it) with what was held."""
    held: dict[int, RouteChunk] = {}
    started: set[int] = set()
    async for choice in choices:
        index, chunk = choice.index, choice.chunk
        if index in held:
            chunk = joined(held.pop(index), chunk)
        if index in started and not chunk.finish_reason and len(chunk.token_ids) < interval:
            held[index] = chunk
            continue
        started.add(index)
        yield Choice(index, chunk)
    for index, chunk in held.items():
        yield Choice(index, chunk)


def joined(first: RouteChunk, then: RouteChunk) -> RouteChunk:
    """One chunk of two successive chunks of a completion."""
    return RouteChunk(
        first.text + then.text,
        [*first.token_ids, *then.token_ids],
        then.finish_reason,
        then.usage or first.usage,
        [*first.logprobs, *then.logprobs],
        [*first.prompt_logprobs, *then.prompt_logprobs],
        first.prompt_token_ids if first.prompt_token_ids is not None else then.prompt_token_ids,
        first.prompt_text if first.prompt_text is not None else then.prompt_text,
    )
