"""The engine hops of a request: choose a prefill worker, then stream PrefillDecode, or Prefill
and Decode on a decode worker (P/D). A failure before the first token is retried on another
prefill worker; after it, another replica continues the stream from the tokens already sent
(``resumption``).

Scheduler calls stay off the critical path where they can: one ``Place`` call names the first
attempt's encoders, prefill worker and decode worker together (``place``); a retry asks for
another prefill worker (``choose_prefill``) and chooses its decode worker while the prompt is
prefilled; each call costs about a millisecond here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from epd.common.errors import EpdError
from epd.common.roles import Role, hands_off_kv, role_from_proto, role_to_proto
from epd.common.tasks import concurrently
from epd.common.telemetry import FIRST_TOKEN_EVENT
from epd.server.engine.base import KV_LOAD_FAILED
from epd.server.route.peers import Peers
from epd.server.route.request import Deadline
from epd.server.route.resumption import (
    DEFAULT_MAX_RESUMPTIONS,
    Progress,
    is_no_worker,
    is_resumable,
)
from epd.server.route.topology import Plan
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import scheduler_service_pb2 as scheduler_pb

logger = logging.getLogger(__name__)
MAX_PREFILL_ATTEMPTS = 3
RESUMED_EVENT = "epd.resumed"
OnPrefilled = Callable[[], Awaitable[None]]
# told of each resumption: the failed worker's role ("prefill" or "decode"), tokens sent before
OnResumed = Callable[[str, int], None]
# the prompt for a chosen prefill worker (embeddings the worker can read from its host)
PromptFor = Callable[[scheduler_pb.WorkerInfo], Awaitable[generation_pb2.Prompt]]


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
    live_roles: frozenset[Role]
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
        prefill_roles=[role_to_proto(role) for role in call.plan.prefill_roles],
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
        roles=[role_to_proto(role) for role in call.plan.prefill_roles],
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
    """Stream the request's tokens; ``on_prefilled`` (releasing the embeddings) starts in the
    background once the prompt has been read, so it does not delay the first token.
    ``placement``: the workers the scheduler's ``Place`` gave the first attempt, if asked
    already (else it is asked here); up to MAX_PREFILL_ATTEMPTS prefill workers are tried before
    the first token, each after the first chosen by ``ChoosePrefill``. A worker that fails
    after it (its stream ends UNAVAILABLE or CANCELLED: it died, or drained past its grace) is
    replaced by another replica that continues the request (``resumption``), up to
    ``max_resumptions`` times; ``on_resumed`` is told each time (the failed role's name, tokens
    sent so far). ``prompt_for``: the prompt for each chosen worker (a retry on another host needs
    its embeddings there, a resumption needs them again), else ``call.prompt``."""
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


@dataclass
class Attempt:
    """One attempt at a request: its workers, where it failed, its release of the embeddings."""

    prefill: scheduler_pb.WorkerInfo | None = None
    decode_id: str = ""
    # the decode worker's stream had started when the attempt failed
    in_decode: bool = False
    release: asyncio.Future[Any] | None = None

    def failed_role(self, error: EpdError) -> str:
        """The role of the worker whose failure, ``error``, ended the attempt: a decode stream
        that could not read its KV failed for want of the prefill worker."""
        return "decode" if self.in_decode and error.reason != KV_LOAD_FAILED else "prefill"


@dataclass
class Excluded:
    """Workers that failed this request, not chosen again for it."""

    prefill: list[str] = field(default_factory=list)
    decode: list[str] = field(default_factory=list)

    def add(self, attempt: Attempt, error: EpdError) -> str:
        """Exclude the worker whose ``error`` failed ``attempt``; returns its id."""
        if attempt.failed_role(error) == "decode":
            self.decode.append(attempt.decode_id)
            return attempt.decode_id
        assert attempt.prefill is not None
        self.prefill.append(attempt.prefill.id)
        return attempt.prefill.id


@dataclass
class Recovery:
    """Where one request's stream stands between attempts: what it sent, the workers it excluded,
    its failures and resumptions so far, the failure being recovered from. The transitions:
    ``check_recoverable`` (raise what ends the request), then ``recover_from`` (exclude the
    failed worker and count the failure)."""

    progress: Progress
    max_resumptions: int
    excluded: Excluded = field(default_factory=Excluded)
    num_failures: int = 0
    num_resumptions: int = 0
    lost: EpdError | None = None

    @property
    def is_resuming(self) -> bool:
        """Whether the client has tokens already: the next attempt continues after them."""
        return bool(self.progress.sent)

    def check_recoverable(self, attempt: Attempt, error: EpdError) -> None:
        """Raise what ends the request after ``attempt`` failed with ``error``: the loss being
        resumed from when no replica is left to resume on, else ``error`` itself when it is not
        a worker's loss (or no worker was reached) or the tries are spent."""
        lost = self.lost if self.is_resuming else None
        if lost is not None and (attempt.prefill is None or is_no_worker(error)):
            raise lost from error
        if attempt.prefill is None or not is_resumable(error) or self._tries_spent():
            raise error
        if self.is_resuming and not self.progress.can_resume:
            raise error

    def recover_from(self, attempt: Attempt, error: EpdError, on_resumed: OnResumed | None) -> None:
        """Exclude the worker whose ``error`` failed ``attempt`` and count the failure (a
        resumption when tokens were sent: a span event, and ``on_resumed`` told)."""
        self.lost = error
        failed = self.excluded.add(attempt, error)
        self.num_failures += 1
        self.num_resumptions += self.is_resuming
        num_sent = len(self.progress.sent)
        _log_failure(self.progress.call.request_id, attempt, failed, error, num_sent)
        if not self.is_resuming:
            return
        trace.get_current_span().add_event(
            RESUMED_EVENT, {"epd.failed_worker": failed, "epd.tokens_sent": num_sent}
        )
        if on_resumed is not None:
            on_resumed(attempt.failed_role(error), num_sent)

    def _tries_spent(self) -> bool:
        if self.is_resuming:
            return self.num_resumptions >= self.max_resumptions
        return self.num_failures + 1 >= MAX_PREFILL_ATTEMPTS


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
    prompt = call.prompt if prompt_for is None else await _prompt(attempt, prompt_for, worker)
    call = progress.continued(prompt)
    span = trace.get_current_span()
    span.set_attribute("epd.prefill_id", worker.id)
    span.set_attribute("epd.cached_blocks", choice.num_cached_blocks)
    if hands_off_kv(role_from_proto(worker.role), Role.DECODE in call.live_roles):
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


async def _prompt(
    attempt: Attempt, prompt_for: PromptFor, worker: scheduler_pb.WorkerInfo
) -> generation_pb2.Prompt:
    """The prompt for ``worker``. When it cannot be made (its images could not be encoded
    again for the worker's host), the failure is the request's, not the worker's: the attempt
    then names no worker, and none is excluded or retried for it."""
    try:
        return await prompt_for(worker)
    except EpdError:
        attempt.prefill = None
        raise


async def _settle(release: asyncio.Future[Any] | None) -> None:
    """Wait for an attempt's release of the embeddings before the next attempt reads them."""
    if release is not None:
        await asyncio.shield(release)


def _log_failure(
    request_id: str, attempt: Attempt, failed: str, error: EpdError, sent: int
) -> None:
    if sent:
        logger.warning(
            "request %s: %s worker %s failed after %d tokens (%s); resuming on another",
            request_id,
            attempt.failed_role(error),
            failed,
            sent,
            error,
        )
    else:
        logger.warning(
            "request %s: prefill on %s failed before the first token (%s); retrying elsewhere",
            request_id,
            failed,
            error,
        )


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
    try:
        if decoder is None:
            reply, chosen = await concurrently(
                _prefill(peers, call, worker.endpoint), _choose_decode(peers, call, excluded)
            )
        else:
            reply, chosen = await _prefill(peers, call, worker.endpoint), decoder
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


async def _prefill(peers: Peers, call: EngineCall, endpoint: str) -> prefill_pb.PrefillResponse:
    request = prefill_pb.PrefillRequest(
        request_id=call.request_id, model=call.model, prompt=call.prompt, sampling=call.sampling
    )
    return await peers.prefill(endpoint).Prefill(request, timeout=call.deadline.remaining())


async def _choose_decode(
    peers: Peers, call: EngineCall, excluded: Sequence[str]
) -> scheduler_pb.ChooseDecodeResponse:
    request = scheduler_pb.ChooseDecodeRequest(
        request_id=call.request_id, model=call.model, exclude_worker_ids=excluded
    )
    return await peers.scheduler.ChooseDecode(request, timeout=call.deadline.remaining())
