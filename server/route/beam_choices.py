"""The choices of a beam-search request (vLLM's ``use_beam_search``): ``beam_search`` run over the
route's own pipeline, as vLLM's OpenAI server runs it over its engine.

Each step of a beam is a request of its own through the router (``<request id>-beam-<k>``): the
request's prompt (its chat rendered, cut and its images placed, as any request's) followed by
the beam's tokens (``ChatRequest.answer_prefix``), one token with the ``2 * n`` most likely
candidates, sampled at the request's temperature and nothing else of its sampling, as vLLM's
step. Its images are loaded once (the route's media cache) and encoded once (the encoders'
caches answer the later steps by mm_hash); the prompt's KV is the prefill workers' prefix cache.
The answer is the ``n`` best beams, best first, each a choice with its whole text at once (as
vLLM's, a stream sends each in one chunk); prompt ``p``'s beams are choices ``p * n`` to
``p * n + n - 1``.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from epd.common.errors import Internal
from epd.common.tasks import every
from epd.server.route.beam_search import (
    Beam,
    BeamAnswer,
    BeamParams,
    StepResult,
    beam_search,
    text_token_ids,
)
from epd.server.route.request import ChatRequest, Deadline
from epd.server.route.router import RouteChunk, Router
from epd.server.route.sampling import beam_step_sampling
from epd.v1 import generation_pb2

STOPPED = generation_pb2.FINISH_REASON_STOP


async def beam_chunks(
    router: Router, request: ChatRequest, timeout_s: float | None = None
) -> AsyncIterator[tuple[int, RouteChunk]]:
    """Each beam of each prompt of ``request`` as one chunk with its choice's index, once every
    prompt's search has ended; the first failure ends them all."""
    deadline = Deadline(timeout_s)
    prompts = [request.prompt_token_ids, *request.more_prompts]
    one = [
        replace(request, request_id=f"{request.request_id}-{index}", prompt_token_ids=prompt)
        if request.more_prompts
        else request
        for index, prompt in enumerate(prompts)
    ]
    answers = await every([_search(router, each, deadline) for each in one])
    num_beams = max(request.sampling.n, 1)
    for prompt_index, (answer, prompt_text) in enumerate(answers):
        for index, chunk in enumerate(_chunks(router, request, answer, prompt_text)):
            yield prompt_index * num_beams + index, chunk


def beam_params(router: Router, request: ChatRequest) -> BeamParams:
    """vLLM's ``BeamSearchParams`` of ``request`` (its ``to_beam_search_params``)."""
    sampling = request.sampling
    return BeamParams(
        width=max(sampling.n, 1),
        max_tokens=sampling.max_tokens,
        eos_token_id=router.prompts.eos_token_id,
        length_penalty=request.length_penalty,
        ignore_eos=sampling.ignore_eos,
        include_stop_str_in_output=sampling.include_stop_str_in_output,
        max_context_tokens=router.prompts.max_context_tokens,
    )


async def _search(
    router: Router, request: ChatRequest, deadline: Deadline
) -> tuple[BeamAnswer, str | None]:
    """The beams of ``request``'s one prompt, observed in the route's metrics as one request
    (its steps are not), and the chat template's text where the request asked for it."""
    numbers = itertools.count()
    sampling = beam_step_sampling(request.sampling)
    sources = request.images  # NOTE: a walk over the messages' parts: once a search
    prompt_texts: list[str] = []

    async def step(token_ids: Sequence[int]) -> StepResult:
        number = next(numbers)
        child = replace(
            request,
            request_id=f"{request.request_id}-beam-{number}",
            more_prompts=[],
            sampling=sampling,
            answer_prefix=list(token_ids),
            return_token_ids=not number,
            return_prompt_text=request.return_prompt_text and not number,
            answer_parsing=None,
            use_beam_search=False,
        )
        result, prompt_text = await _step(router.answer(child, sources, deadline.remaining()))
        if prompt_text is not None:
            prompt_texts.append(prompt_text)
        return result

    metrics = router.metrics
    observation = metrics.observe(len(sources)) if metrics is not None else None
    try:
        answer = await beam_search(beam_params(router, request), step)
    except BaseException as e:
        if observation is not None:
            observation.end(e)
        raise
    if observation is not None:
        for beam in answer.beams:
            observation.add(len(beam.token_ids), len(answer.prompt_token_ids))
        observation.end(None)
    return answer, next(iter(prompt_texts), None)


async def _step(answer: AsyncIterator[RouteChunk]) -> tuple[StepResult, str | None]:
    """The candidates of a step's one token (and its prompt, when it asked for it) from its
    ``answer``, and the chat template's text where it asked for it."""
    chunks = [chunk async for chunk in answer]
    positions = [position for chunk in chunks for position in chunk.logprobs]
    if not positions:
        raise Internal("the engine sent no log probabilities for a beam's step")
    candidates = [(c.token_id, c.logprob) for c in positions[0].candidates]
    prompt = next((c.prompt_token_ids for c in chunks if c.prompt_token_ids is not None), None)
    # NOTE: vLLM's steps are not detokenized: its beams' candidates have no text of their own
    position = generation_pb2.TokenLogprobs(
        candidates=[
            generation_pb2.Logprob(token_id=c.token_id, logprob=c.logprob, rank=c.rank)
            for c in positions[0].candidates
        ]
    )
    text = next((c.prompt_text for c in chunks if c.prompt_text is not None), None)
    return StepResult(candidates, prompt, position), text


def _chunks(
    router: Router, request: ChatRequest, answer: BeamAnswer, prompt_text: str | None
) -> list[RouteChunk]:
    """One chunk per beam: its text, tokens, finish reason and usage (the prompt's tokens and
    the beam's), the prompt's ids where the request asked for them (or its reasoning parser
    reads them), and ``prompt_text``."""
    params = beam_params(router, request)
    sampling, parsing = request.sampling, request.answer_parsing
    skip = sampling.skip_special_tokens if sampling.HasField("skip_special_tokens") else True
    shows_prompt = request.return_token_ids or (parsing is not None and parsing.needs_prompt)
    prompt = answer.prompt_token_ids
    chunks = []
    for beam in answer.beams:
        text = router.prompts.tokenizer.decode(
            list(text_token_ids(params, beam)), skip_special_tokens=skip
        )
        usage = generation_pb2.Usage(
            prompt_tokens=len(prompt), completion_tokens=len(beam.token_ids)
        )
        finish = STOPPED if beam.is_stopped else generation_pb2.FINISH_REASON_LENGTH
        shown = list(prompt) if shows_prompt else None
        logprobs = _positions(beam) if sampling.HasField("logprobs") else []
        chunks.append(
            RouteChunk(
                str(text),
                list(beam.token_ids),
                finish,
                usage,
                logprobs,
                prompt_token_ids=shown,
                prompt_text=prompt_text,
            )
        )
    return chunks


def _positions(beam: Beam) -> list[generation_pb2.TokenLogprobs]:
    """Each of ``beam``'s tokens' step candidates, where vLLM's beam search shows them (the
    step's candidates in the engine's order; the token among them where it ranks)."""
    positions = beam.positions[: len(beam.token_ids)]
    return [p for p in positions if isinstance(p, generation_pb2.TokenLogprobs)]
