"""The load of ``bench_soak.py``: streamed greedy chat completions with a picture through the
route's OpenAI HTTP port, read as server-sent events, each checked against the reference answer of
its prompt; kills fired when their request number starts."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from bench_e2e import pictures_of
from soak_check import Kill, check_stream

QUESTIONS = ("What is in this picture?", "Describe the colours.")


@dataclass(frozen=True, slots=True)
class Answer:
    """What one stream gave: its text pieces, TTFT (s, None before any text), the completion
    tokens its usage counted, and why it failed ('' when it ended with [DONE] and no error)."""

    pieces: list[str]
    ttft_s: float | None
    num_tokens: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request of the load: ``status`` ok, failed or corrupted (``detail`` says why); times
    from ``time.monotonic``."""

    index: int
    prompt: int
    status: str
    start: float
    end: float
    ttft_s: float | None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Fired:
    """A kill as it happened: the service and pid signalled (pid 0: none was, the role has no
    service), at ``time.monotonic`` ``at``."""

    kill: Kill
    service: str
    pid: int
    at: float


def chat_bodies(model: str, num_images: int, tokens: int) -> list[dict[str, Any]]:
    """The distinct requests to ``model``: each of ``num_images`` pictures with each question,
    greedy, ``tokens`` tokens whatever the end-of-sequence token says."""
    return [
        {
            "model": model,
            "messages": [
                {"role": "user", "content": [*pictures_of(seed, 1), {"type": "text", "text": q}]}
            ],
            "max_tokens": tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for seed in range(num_images)
        for q in QUESTIONS
    ]


async def stream_chat(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float
) -> Answer:
    """One streamed chat completion; an HTTP error, an error event, a stream without [DONE] or
    a broken connection fill ``error``."""
    start = time.monotonic()
    pieces: list[str] = []
    ttft: float | None = None
    num_tokens, is_done = 0, False
    try:
        async with session.post(
            f"{url}/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            if response.status != 200:
                text = (await response.text())[:200]
                return Answer(pieces, ttft, 0, f"HTTP {response.status}: {text}")
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    is_done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    return Answer(pieces, ttft, num_tokens, f"error event: {event['error']}")
                if event.get("usage"):
                    num_tokens = event["usage"].get("completion_tokens", 0)
                for choice in event.get("choices", []):
                    if text := choice.get("delta", {}).get("content"):
                        ttft = time.monotonic() - start if ttft is None else ttft
                        pieces.append(text)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        return Answer(pieces, ttft, num_tokens, f"{type(e).__name__}: {e}")
    return Answer(pieces, ttft, num_tokens, "" if is_done else "no [DONE]")


async def model_id(session: aiohttp.ClientSession, url: str) -> str:
    """The model the route serves (the first of /models)."""
    async with session.get(f"{url}/models") as response:
        return str((await response.json())["data"][0]["id"])


async def references(
    session: aiohttp.ClientSession, url: str, bodies: Sequence[dict[str, Any]], timeout_s: float
) -> list[list[str]]:
    """The answer of each body, one at a time, before any load or kill; RuntimeError when one
    fails."""
    answers = []
    for body in bodies:
        answer = await stream_chat(session, url, body, timeout_s)
        if answer.error:
            raise RuntimeError(f"reference request failed: {answer.error}")
        answers.append(answer.pieces)
    return answers


def judge(answer: Answer, reference: list[str], tokens: int) -> tuple[str, str]:
    """(status, detail) of one answer against its reference and the token count asked."""
    if answer.error:
        return "failed", answer.error
    verdict = check_stream(reference, answer.pieces)
    if not verdict.is_ok:
        return "corrupted", f"{verdict.kind} from piece {verdict.at}"
    if answer.num_tokens != tokens:
        return "corrupted", f"usage says {answer.num_tokens} tokens, not {tokens}"
    return "ok", ""


async def drive(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[dict[str, Any]],
    answers: Sequence[list[str]],
    options: LoadOptions,
    chaos: Chaos,
) -> tuple[list[Outcome], list[Fired]]:
    """Send ``options.num_requests`` requests (prompts in turn) from ``options.concurrency``
    workers. The worker that takes request number N of a kill first waits for the service of
    the kill before to be back (one kill at a time), fires it, then sends request N; the other
    workers go on meanwhile. Kills numbered past the last request are not fired."""
    outcomes: list[Outcome] = []
    fired: list[Fired] = []
    kills_at: dict[int, list[Kill]] = {}
    for kill in options.kills:
        kills_at.setdefault(kill.after_requests, []).append(kill)
    one_at_a_time = asyncio.Lock()
    counter = iter(range(options.num_requests))
    every = max(1, options.num_requests // 10)

    async def worker() -> None:
        for index in counter:
            for kill in kills_at.get(index, []):
                async with one_at_a_time:
                    if fired:
                        await chaos.healed(fired[-1])
                    fired.append(chaos.fire(kill))
            prompt = index % len(bodies)
            start = time.monotonic()
            answer = await stream_chat(session, url, bodies[prompt], options.timeout_s)
            status, detail = judge(answer, answers[prompt], bodies[prompt]["max_tokens"])
            outcomes.append(
                Outcome(index, prompt, status, start, time.monotonic(), answer.ttft_s, detail)
            )
            if len(outcomes) % every == 0:
                bad = sum(o.status != "ok" for o in outcomes)
                print(f"  {len(outcomes)} requests, {bad} not ok", file=sys.stderr, flush=True)

    await asyncio.gather(*(worker() for _ in range(options.concurrency)))
    return outcomes, fired


@dataclass(frozen=True, slots=True)
class Chaos:
    """How kills happen: ``fire`` signals the service of a kill; ``healed`` returns once the
    service a fired kill hit serves again."""

    fire: Callable[[Kill], Fired]
    healed: Callable[[Fired], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How many requests, how many at once, each one's time limit, and the kills."""

    num_requests: int
    concurrency: int
    timeout_s: float
    kills: tuple[Kill, ...] = ()
