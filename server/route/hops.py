"""The engine hops of a request: choose a prefill worker, then stream PrefillDecode, or Prefill
and Decode on a decode worker (P/D). A failure before the first token is retried on another
prefill worker; after it, another replica continues the stream from the tokens already sent
(``resumption``).

Scheduler calls stay off the critical path where they can: one ``Place`` call names the first
attempt's encoders, prefill worker and decode worker together (``place``); a retry asks for
another prefill worker (``choose_prefill``) and chooses its decode worker while the prompt is
prefilled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from epd.common.errors import EpdError
from epd.common.roles import hands_off_kv, role_from_proto
from epd.common.tasks import concurrently
from epd.common.telemetry import FIRST_TOKEN_EVENT
from epd.server.route.peers import Peers
from epd.server.route.request import Deadline
from epd.server.route.resumption import (
    DEFAULT_MAX_RESUMPTIONS,
    Attempt,
    OnResumed,
    Progress,
    Recovery,
)
from epd.server.route.topology import Plan
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import scheduler_service_pb2 as scheduler_pb

OnPrefilled = Callable[[], Awaitable[None]]
# the prompt for an attempt's placement: its images encoded for the chosen prefill worker (by the
# encoders the placement names, if any), embeddings the worker can read from its host
PromptFor = Callable[[scheduler_pb.PlaceResponse], Awaitable[generation_pb2.Prompt]]


@dataclass(frozen=True, slots=True)
class Piece:
    """Tokens from the engine since the previous piece; the last has finish reason and usage."""

    token_ids: list[int]
    finish_reason: int = 0
    usage: generation_pb2.Usage | None = None
    # one entry per token when the sampling asked for log probabilities
    logprobs: list[generation_pb2.TokenLogprobs] = field(default_factory=list)
    # on the first piece, one entry per prompt token when the sampling asked for them
    prompt_logprobs: list[generation_pb2.TokenLogprobs] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class EngineCall:
    """Everything the engine hops of one request need."""

    request_id: str
    model: str
    prompt: generation_pb2.Prompt
    sampling: generation_pb2.SamplingParams
    block_hashes: list[int]
    plan: Plan
    deadline: Deadline


async def place(
    peers: Peers,
    call: EngineCall,
    items: Sequence[scheduler_pb.EncodeItem] = (),
    policy: scheduler_pb.EncoderPolicy = scheduler_pb.ENCODER_POLICY_UNSPECIFIED,
) -> scheduler_pb.PlaceResponse:
    """The scheduler's workers for ``call``'s first attempt, in one call: encoders for
    ``items`` (if any), the prefill worker, and its decode worker when it hands its KV over (its
    prompt is not needed yet)."""
    request = scheduler_pb.PlaceRequest(
        request_id=call.request_id,
        model=call.model,
        items=items,
        policy=policy,
        block_hashes=call.block_hashes,
        prefill_roles=[role.value for role in call.plan.prefill_roles],
    )
    return await peers.scheduler.Place(request, timeout=call.deadline.remaining())


async def choose_prefill(
    peers: Peers, call: EngineCall, excluded: Sequence[str]
) -> scheduler_pb.PlaceResponse:
    """Another prefill worker for ``call`` after one failed, ``excluded`` those that did; its
    decode worker is asked for with its prefill (``ChooseDecode``)."""
    request = scheduler_pb.ChoosePrefillRequest(
        request_id=call.request_id,
        model=call.model,
        block_hashes=call.block_hashes,
        exclude_worker_ids=excluded,
        roles=[role.value for role in call.plan.prefill_roles],
    )
    choice = await peers.scheduler.ChoosePrefill(request, timeout=call.deadline.remaining())
    return scheduler_pb.PlaceResponse(prefill=choice)


async def stream_tokens(
    peers: Peers,
    call: EngineCall,
    on_prefilled: OnPrefilled,
    placement: scheduler_pb.PlaceResponse | None = None,
    prompt_for: PromptFor | None = None,
    *,
    max_resumptions: int = DEFAULT_MAX_RESUMPTIONS,
    on_resumed: OnResumed | None = None,
) -> AsyncGenerator[Piece, None]:
    """Stream the request's tokens; ``on_prefilled`` (releasing the request's pixels and
    embeddings) starts in the background once the prompt has been read, so it does not delay
    the first token.
    ``placement``: the workers the scheduler's ``Place`` gave the first attempt, if asked
    already (else it is asked here); up to MAX_PREFILL_ATTEMPTS prefill workers are tried before
    the first token, each after the first chosen by ``ChoosePrefill``. A worker that fails
    after it (its stream ends UNAVAILABLE or CANCELLED: it died, or drained past its grace) is
    replaced by another replica that continues the request (``resumption``), up to
    ``max_resumptions`` times; ``on_resumed`` is told each time (the failed role's name, tokens
    sent so far). ``prompt_for``: the prompt for each attempt's placement (the first attempt's
    images encoded for its worker, a retry on another host needs them there, a resumption needs
    them again), else ``call.prompt``."""
    recovery = Recovery(Progress(call), max_resumptions)
    while True:
        attempt = Attempt()
        try:
            async for piece in _attempt(peers, recovery, attempt, placement, prompt_for):
                if attempt.release is None:
                    attempt.release = peers.background.start(on_prefilled())
                yield piece
            return
        except EpdError as error:
            if recovery.progress.is_finished:
                return
            recovery.check_recoverable(attempt, error)
            await _settle(attempt.release)
            recovery.recover_from(attempt, error, on_resumed)
        if not recovery.progress.remaining:
            yield Piece([], generation_pb2.FINISH_REASON_LENGTH)
            return
        placement = None


async def _attempt(
    peers: Peers,
    recovery: Recovery,
    attempt: Attempt,
    placement: scheduler_pb.PlaceResponse | None,
    prompt_for: PromptFor | None,
) -> AsyncIterator[Piece]:
    """The pieces of one attempt, each recorded in ``recovery.progress``."""
    progress = recovery.progress
    call = progress.call
    if placement is None and not recovery.num_failures:
        placement = await place(peers, call)
    elif placement is None:
        placement = await choose_prefill(peers, call, recovery.excluded.prefill)
    choice = placement.prefill
    worker = attempt.prefill = choice.worker
    try:
        prompt = call.prompt if prompt_for is None else await prompt_for(placement)
    except EpdError:
        # NOTE: images not encoded for the worker: the request's failure, not the worker's, so
        # none is excluded or retried for it
        attempt.prefill = None
        raise
    call = progress.continued(prompt)
    span = trace.get_current_span()
    span.set_attribute("epd.prefill_id", worker.id)
    span.set_attribute("epd.cached_blocks", choice.num_cached_blocks)
    if hands_off_kv(role_from_proto(worker.role), call.plan.is_decode_live):
        decoder = placement.decode if placement.HasField("decode") else None
        pieces = _prefill_then_decode(
            peers, call, worker, attempt, decoder, recovery.excluded.decode
        )
    else:
        pieces = _prefill_decode(peers, call, worker.endpoint)
    async for piece in pieces:
        if not progress.sent:
            span.add_event(FIRST_TOKEN_EVENT)
        yield progress.record(piece)


async def _settle(release: asyncio.Future[Any] | None) -> None:
    """Wait for an attempt's release of the embeddings before the next attempt reads them."""
    if release is not None:
        await asyncio.shield(release)


async def _prefill_decode(peers: Peers, call: EngineCall, endpoint: str) -> AsyncIterator[Piece]:
    stream = peers.prefill(endpoint).PrefillDecode(
        prefill_pb.PrefillDecodeRequest(
            request_id=call.request_id, model=call.model, prompt=call.prompt, sampling=call.sampling
        ),
        timeout=call.deadline.remaining(),
    )
    async with contextlib.aclosing(_pieces(stream)) as pieces:
        async for piece in pieces:
            yield piece


async def _prefill_then_decode(
    peers: Peers,
    call: EngineCall,
    worker: scheduler_pb.WorkerInfo,
    attempt: Attempt,
    decoder: scheduler_pb.ChooseDecodeResponse | None,
    excluded: Sequence[str],
) -> AsyncIterator[Piece]:
    """Prefill on ``worker``, then decode on ``decoder`` (None: one chosen beside the prefill,
    ``excluded`` left out)."""
    request = prefill_pb.PrefillRequest(
        request_id=call.request_id, model=call.model, prompt=call.prompt, sampling=call.sampling
    )
    prefill = peers.prefill(worker.endpoint).Prefill(request, timeout=call.deadline.remaining())
    try:
        if decoder is None:
            reply, chosen = await concurrently(prefill, _choose_decode(peers, call, excluded))
        else:
            reply, chosen = await prefill, decoder
    except EpdError as error:
        if error.reason != "WRONG_MODE":
            raise
        # NOTE: an encode_prefill worker without KV hand-off beside decode workers: aggregated.
        async for piece in _prefill_decode(peers, call, worker.endpoint):
            yield piece
        return
    attempt.decode_id = chosen.worker.id
    trace.get_current_span().set_attribute("epd.decode_id", chosen.worker.id)
    first = [reply.first_token_logprobs] if reply.HasField("first_token_logprobs") else []
    prompt = list(reply.prompt_logprobs)
    if reply.finish_reason:
        yield Piece([reply.first_token_id], reply.finish_reason, reply.usage, first, prompt)
        return
    yield Piece([reply.first_token_id], logprobs=first, prompt_logprobs=prompt)
    stream = peers.decode(chosen.worker.endpoint).Decode(
        decode_pb.DecodeRequest(
            request_id=call.request_id,
            model=call.model,
            prompt_token_ids=call.prompt.token_ids,
            sampling=call.sampling,
            first_token_id=reply.first_token_id,
            kv_handle=reply.kv_handle,
        ),
        timeout=call.deadline.remaining(),
    )
    attempt.in_decode = True
    async with contextlib.aclosing(_pieces(stream)) as pieces:
        async for piece in pieces:
            yield piece


async def _pieces(stream: Any) -> AsyncGenerator[Piece, None]:
    """The pieces of a PrefillDecode or Decode response stream; the call is cancelled when
    they end, however (callers close this at once: ``contextlib.aclosing``)."""
    try:
        async for response in stream:
            yield Piece(
                list(response.token_ids),
                response.finish_reason,
                response.usage if response.HasField("usage") else None,
                list(response.logprobs),
                # NOTE: a decode worker's responses have none: the prefill worker reports them
                list(getattr(response, "prompt_logprobs", ())),
            )
    finally:
        stream.cancel()  # NOTE: no-op once finished; aborts the engine request otherwise


async def _choose_decode(
    peers: Peers, call: EngineCall, excluded: Sequence[str]
) -> scheduler_pb.ChooseDecodeResponse:
    request = scheduler_pb.ChooseDecodeRequest(
        request_id=call.request_id, model=call.model, exclude_worker_ids=excluded
    )
    return await peers.scheduler.ChooseDecode(request, timeout=call.deadline.remaining())
