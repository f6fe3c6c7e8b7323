"""vLLM's stream_interval: each completion's chunks joined to at least k tokens, its first and
last sent at once, its text, ids and logprobs kept whole."""

from __future__ import annotations

from collections.abc import AsyncIterator

from epd.server.route import openai_schema as schema
from epd.server.route.choices import Choice
from epd.server.route.router import RouteChunk
from epd.server.route.stream_interval import batched
from epd.v1 import generation_pb2 as g


def token(index: int, token_id: int, *, last: bool = False) -> Choice:
    usage = g.Usage(prompt_tokens=3, completion_tokens=token_id) if last else None
    position = g.TokenLogprobs(candidates=[g.Logprob(token_id=token_id, logprob=-1.0)])
    prompt = [7, 8] if token_id == 1 else None
    chunk = RouteChunk(f"<{token_id}>", [token_id], 1 if last else 0, usage, [position], [], prompt)
    return Choice(index, chunk)


async def sent(choices: list[Choice], interval: int) -> list[Choice]:
    async def source() -> AsyncIterator[Choice]:
        for choice in choices:
            yield choice

    return [choice async for choice in batched(source(), interval)]


async def test_the_first_then_every_k_tokens_then_the_last() -> None:
    stream = [token(0, t, last=t == 8) for t in range(1, 9)]
    chunks = [c.chunk for c in await sent(stream, 3)]
    assert [c.token_ids for c in chunks] == [[1], [2, 3, 4], [5, 6, 7], [8]]
    assert "".join(c.text for c in chunks) == "".join(f"<{t}>" for t in range(1, 9))
    assert [len(c.logprobs) for c in chunks] == [1, 3, 3, 1]
    assert chunks[0].prompt_token_ids == [7, 8] and chunks[1].prompt_token_ids is None
    assert chunks[-1].finish_reason == 1 and chunks[-1].usage is not None
    short = [c.chunk.token_ids for c in await sent(stream[:6], 4)]
    assert short == [[1], [2, 3, 4, 5], [6]], "what is held when the stream ends goes out"


async def test_each_completion_is_batched_on_its_own() -> None:
    stream = [token(i, t, last=t == 5) for t in range(1, 6) for i in (0, 1)]
    choices = await sent(stream, 2)
    for index in (0, 1):
        ids = [c.chunk.token_ids for c in choices if c.index == index]
        assert ids == [[1], [2, 3], [4, 5]]
    assert [c.chunk.token_ids for c in await sent(stream, 1)] == [
        [t] for t in range(1, 6) for _ in (0, 1)
    ]


def test_the_body_sets_it_for_streams() -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert schema.to_chat_request(body, "tiny").stream_interval == 1
    assert schema.to_chat_request({**body, "stream_interval": 4}, "tiny").stream_interval == 4
