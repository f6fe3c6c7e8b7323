"""Beam search as vLLM's OpenAI server runs it (``vllm/entrypoints/generate/beam_search``), over
any step function (no I/O, no grpc).

vLLM runs beam search in its serving layer, not in its engine: each step asks the engine for one
token of every live beam (its prompt: the request's prompt and the beam's tokens) with the
``2 * width`` most likely candidates' log probabilities; every candidate of every beam is a
new beam scored by its cumulative log probability; an end-of-sequence candidate ends its beam
(unless ``ignore_eos``), the ``width`` best of the others live on. After ``max_tokens`` steps
(or when no beam lives), the ended and the live beams are ranked by cumulative log probability
over their length (the prompt's included) to the power ``length_penalty``, and the ``width``
best are the answer, best first. The selection is vLLM's own (numpy's partition and sort), so
that ties fall as they fall there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from epd.common.tasks import every


@dataclass(frozen=True, slots=True)
class BeamParams:
    """vLLM's ``BeamSearchParams``, less what the engine's step takes (temperature)."""

    width: int
    max_tokens: int
    # the tokenizer's end of sequence (None: none; no beam ends before max_tokens)
    eos_token_id: int | None
    length_penalty: float = 1.0
    ignore_eos: bool = False
    # an ended beam keeps its end-of-sequence token
    include_stop_str_in_output: bool = False
    # the model's context: a beam grows up to it at most (None: unknown, max_tokens only)
    max_context_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Beam:
    """One beam: its tokens after the prompt, their summed log probability, whether it ended
    with the end-of-sequence token (vLLM's finish reason "stop"; else "length"), and each of
    its steps' ``StepResult.position`` (as vLLM's beam keeps each step's logprobs: one more
    than its tokens where it ended without keeping its end-of-sequence token)."""

    token_ids: tuple[int, ...] = ()
    cum_logprob: float = 0.0
    is_stopped: bool = False
    positions: tuple[object, ...] = ()


@dataclass(frozen=True, slots=True)
class StepResult:
    """The engine's answer to one step of one beam: the candidates for its next token as the
    engine lists them (the sampled one first, then by rank), each ``(token_id, logprob)``; and
    on the first step, the prompt as the engine holds it (None on later steps); ``position``:
    what the step function reports of the step, kept by every beam it makes (``Beam.positions``).
    """

    candidates: Sequence[tuple[int, float]]
    prompt_token_ids: Sequence[int] | None = None
    position: object = None


# One engine step of a beam, given the beam's tokens after the prompt.
Step = Callable[[Sequence[int]], Awaitable[StepResult]]


@dataclass(frozen=True, slots=True)
class BeamAnswer:
    """The best beams, best first, and the prompt as the engine holds it."""

    beams: list[Beam]
    prompt_token_ids: list[int]


async def beam_search(params: BeamParams, step: Step) -> BeamAnswer:
    """The ``params.width`` best beams, found as vLLM finds them; ``step`` runs each live
    beam's step, every beam of a step at once. The first step is always run (the prompt comes
    with it); with ``max_tokens`` 0 its candidates are not taken."""
    (first,) = await _steps(step, [Beam()])
    if first.prompt_token_ids is None:
        raise ValueError("the first step of a beam search must return the prompt")
    prompt = list(first.prompt_token_ids)
    num_steps = params.max_tokens
    if params.max_context_tokens is not None:
        num_steps = min(num_steps, params.max_context_tokens - len(prompt))
    live, results = [Beam()], [first]
    ended: list[Beam] = []
    for index in range(max(num_steps, 0)):
        if index:
            results = await _steps(step, live)
        live = _advance(params, live, results, ended)
        if not live:
            break
    ranked = sorted([*ended, *live], key=lambda beam: score(params, prompt, beam), reverse=True)
    return BeamAnswer(ranked[: params.width], prompt)


def score(params: BeamParams, prompt: Sequence[int], beam: Beam) -> float:
    """vLLM's ``get_beam_search_score``: the beam's cumulative log probability over its length,
    the prompt's included and a last end-of-sequence token not, to the power
    ``length_penalty``."""
    num_tokens = len(prompt) + len(beam.token_ids)
    last = beam.token_ids[-1] if beam.token_ids else (prompt[-1] if prompt else None)
    if last is not None and last == params.eos_token_id:
        num_tokens -= 1
    return float(beam.cum_logprob / (max(num_tokens, 1) ** params.length_penalty))


def text_token_ids(params: BeamParams, beam: Beam) -> tuple[int, ...]:
    """The tokens of ``beam``'s text: all but a last end-of-sequence token (unless
    ``ignore_eos``)."""
    is_eos_last = bool(beam.token_ids) and beam.token_ids[-1] == params.eos_token_id
    return beam.token_ids[:-1] if is_eos_last and not params.ignore_eos else beam.token_ids


async def _steps(step: Step, beams: Sequence[Beam]) -> list[StepResult]:
    """One step of every beam at once; the first failure cancels the others and is raised."""
    results: list[StepResult] = await every([step(beam.token_ids) for beam in beams])
    return results


def _advance(
    params: BeamParams, beams: Sequence[Beam], results: Sequence[StepResult], ended: list[Beam]
) -> list[Beam]:
    """The beams after one step: each beam's end-of-sequence candidate added to ``ended``, the
    ``width`` best of the other candidates by cumulative log probability, best first."""
    candidates: list[Beam] = []
    for beam, result in zip(beams, results, strict=True):
        positions = (*beam.positions, result.position)
        for token_id, logprob in result.candidates:
            cum_logprob = beam.cum_logprob + logprob
            if token_id == params.eos_token_id and not params.ignore_eos:
                kept = (token_id,) if params.include_stop_str_in_output else ()
                ended.append(Beam(beam.token_ids + kept, cum_logprob, True, positions))
            else:
                candidates.append(Beam((*beam.token_ids, token_id), cum_logprob, False, positions))
    logprobs = np.fromiter((c.cum_logprob for c in candidates), np.float64, len(candidates))
    if len(candidates) <= params.width:
        order = np.argsort(-logprobs)
    else:
        best = np.argpartition(-logprobs, params.width - 1)[: params.width]
        order = best[np.argsort(-logprobs[best])]
    return [candidates[int(index)] for index in order]
