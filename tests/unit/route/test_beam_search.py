"""The route's beam search (``server/route/beam_search.py``) on a fake model: the same beams,
in the same order, with the same scores, as vLLM's own online beam search run on the same
model; its steps stop at the context; a failed step fails the search."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from epd.server.route.beam_search import (
    Beam,
    BeamParams,
    StepResult,
    beam_search,
    score,
    text_token_ids,
)

EOS = 0
VOCAB = 9
PROMPT = [5, 3, 7]


def candidates(tokens: Sequence[int], num: int, eos_boost: float) -> list[tuple[int, float]]:
    """A fixed random model: the ``num`` most likely next tokens of ``tokens`` (float32 log
    probabilities, as an engine's), the most likely first, as an engine lists them at
    temperature 0."""
    seed = zlib.crc32(np.asarray(tokens, dtype=np.int64).tobytes())
    logits = np.random.default_rng(seed).normal(0, 1.5, VOCAB)
    logits[EOS] += eos_boost
    logprobs = (logits - np.logaddexp.reduce(logits)).astype(np.float32)
    order = np.argsort(-logprobs, kind="stable")[:num]
    return [(int(token), float(logprobs[token])) for token in order]


class FakeEngineClient:
    """What vLLM's ``BeamSearchOnlineMixin.beam_search`` calls, over ``candidates``."""

    def __init__(self, eos_boost: float) -> None:
        self.eos_boost = eos_boost
        self.input_processor = SimpleNamespace(resolve_watermarking=lambda params: None)

    async def generate(self, prompt: Any, params: Any, request_id: str, **_: Any) -> AsyncIterator:
        from vllm.logprobs import Logprob
        from vllm.outputs import CompletionOutput, RequestOutput

        found = candidates(prompt["prompt_token_ids"], params.logprobs, self.eos_boost)
        position = {t: Logprob(lp, rank) for rank, (t, lp) in enumerate(found, 1)}
        output = CompletionOutput(0, "", [found[0][0]], None, [position], finish_reason="length")
        yield RequestOutput(request_id, None, prompt["prompt_token_ids"], None, [output], True)


async def vllm_beams(params: BeamParams, eos_boost: float) -> list[tuple[Any, ...]]:
    """vLLM's own answer: each output's tokens, cumulative logprob and finish reason."""
    from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin
    from vllm.sampling_params import BeamSearchParams

    tokenizer = SimpleNamespace(eos_token_id=EOS, decode=lambda ids, **_: str(list(ids)))
    server = SimpleNamespace(
        renderer=SimpleNamespace(get_tokenizer=lambda: tokenizer),
        engine_client=FakeEngineClient(eos_boost),
    )
    vllm_params = BeamSearchParams(
        beam_width=params.width,
        max_tokens=params.max_tokens,
        ignore_eos=params.ignore_eos,
        length_penalty=params.length_penalty,
        include_stop_str_in_output=params.include_stop_str_in_output,
    )
    prompt = {"type": "token", "prompt_token_ids": list(PROMPT)}
    search = BeamSearchOnlineMixin.beam_search(server, prompt, "r", vllm_params)  # type: ignore[arg-type]
    (answer,) = [output async for output in search]
    return [
        (tuple(o.token_ids), o.cumulative_logprob, o.finish_reason, o.text, len(o.logprobs))
        for o in answer.outputs
    ]


async def epd_beams(params: BeamParams, eos_boost: float) -> list[tuple[Any, ...]]:
    steps: list[Sequence[int]] = []

    async def step(token_ids: Sequence[int]) -> StepResult:
        steps.append(token_ids)
        found = candidates([*PROMPT, *token_ids], 2 * params.width, eos_boost)
        return StepResult(found, PROMPT if len(steps) == 1 else None, tuple(token_ids))

    answer = await beam_search(params, step)
    assert answer.prompt_token_ids == PROMPT
    return [
        (
            beam.token_ids,
            beam.cum_logprob,
            "stop" if beam.is_stopped else "length",
            str(list(text_token_ids(params, beam))),
            len(beam.positions),
        )
        for beam in answer.beams
        # NOTE: each step's position is the tokens its beam had before it
        if all(p == beam.token_ids[:i] for i, p in enumerate(beam.positions))
    ]


CASES = [
    BeamParams(width, max_tokens, EOS, penalty, ignore_eos, keeps_eos)
    for width, max_tokens, penalty, ignore_eos, keeps_eos in [
        (1, 5, 1.0, False, False),
        (2, 6, 1.0, False, False),
        (3, 6, 0.5, False, True),
        (4, 5, 2.0, False, False),
        (3, 5, -1.0, False, True),
        (2, 4, 1.0, True, False),
        (3, 0, 1.0, False, False),
        (2, 1, 1.0, False, True),
    ]
]


@pytest.mark.parametrize("eos_boost", [0.0, 2.5])
@pytest.mark.parametrize("params", CASES, ids=[str(i) for i in range(len(CASES))])
async def test_the_beams_are_vllms(params: BeamParams, eos_boost: float) -> None:
    expected = await vllm_beams(params, eos_boost)
    assert await epd_beams(params, eos_boost) == expected
    assert len(expected) == (1 if params.max_tokens == 0 else params.width)


@pytest.mark.parametrize(
    "beam",
    [Beam((4, 2), -3.5), Beam((4, EOS), -2.0, True), Beam((), -1.0, True), Beam((EOS,), -0.5)],
)
@pytest.mark.parametrize("prompt", [PROMPT, [*PROMPT, EOS]])
@pytest.mark.parametrize("penalty", [1.0, 0.7])
def test_the_score_is_vllms(beam: Beam, prompt: list[int], penalty: float) -> None:
    from vllm.entrypoints.generate.beam_search.utils import get_beam_search_score

    params = BeamParams(2, 4, EOS, length_penalty=penalty)
    tokens = [*prompt, *beam.token_ids]
    expected = get_beam_search_score(tokens, beam.cum_logprob, EOS, penalty)
    assert score(params, prompt, beam) == expected


async def test_beams_grow_up_to_the_context_only() -> None:
    params = BeamParams(2, 50, None, max_context_tokens=len(PROMPT) + 3)
    lengths: list[int] = []

    async def step(token_ids: Sequence[int]) -> StepResult:
        lengths.append(len(token_ids))
        return StepResult(candidates([*PROMPT, *token_ids], 4, 0.0), PROMPT)

    answer = await beam_search(params, step)
    assert max(lengths) == 2
    assert [len(beam.token_ids) for beam in answer.beams] == [3, 3]


async def test_a_failed_step_fails_the_search_and_cancels_the_others() -> None:
    cancelled = asyncio.Event()
    num_steps = 0

    async def step(token_ids: Sequence[int]) -> StepResult:
        nonlocal num_steps
        num_steps += 1
        if num_steps == 1:
            return StepResult(candidates(PROMPT, 4, 0.0), PROMPT)
        if token_ids[0] == candidates(PROMPT, 4, 0.0)[0][0]:
            raise RuntimeError("engine lost")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("not cancelled")

    with pytest.raises(RuntimeError, match="engine lost"):
        await beam_search(BeamParams(2, 5, None), step)
    assert cancelled.is_set()
