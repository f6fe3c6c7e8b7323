"""The engine hops of a request: choose a prefill worker, then stream PrefillDecode, or Prefill
and Decode on a decode worker (P/D). A failure before the first token is retried on another
prefill worker; after it, the failure ends the stream with its status.

Scheduler calls stay off the critical path where they can: the route chooses the first prefill
worker while the images are encoded (``choose_prefill`` beside the encoding, ``concurrently``), and
the decode worker while the prompt is prefilled; each call costs about a millisecond here."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from opentelemetry import trace

from epd.common.errors import EpdError, Unavailable
from epd.common.tasks import concurrently
from epd.common.telemetry import FIRST_TOKEN_EVENT
from epd.server.route.deadline import Deadline
from epd.server.route.peers import Peers
from epd.server.route.topology import Plan, Role, hands_off_kv
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import scheduler_service_pb2 as scheduler_pb

logger = logging.getLogger(__name__)
MAX_PREFILL_ATTEMPTS = 3
OnPrefilled = Callable[[], Awaitable[None]]
# the prompt for a chosen prefill worker (embeddings the worker can read from its host)
PromptFor = Callable[[scheduler_pb.WorkerInfo], Awaitable[generation_pb2.Prompt]]


@dataclass(frozen=True, slots=True)
class Piece:
    """Tokens from the engine since the previous piece; the last has finish reason and usage."""

    token_ids: list[int]
    finish_reason: int = 0
    usage: generation_pb2.Usage | None = None


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


async def choose_prefill(
    peers: Peers, call: EngineCall, excluded: Sequence[str] = ()
) -> scheduler_pb.ChoosePrefillResponse:
    """The scheduler's prefill worker for ``call`` (its prompt is not needed yet)."""
    request = scheduler_pb.ChoosePrefillRequest(
        request_id=call.request_id,
        model=call.model,
        block_hashes=call.block_hashes,
        exclude_worker_ids=excluded,
        roles=call.plan.prefill_roles,
    )
    return await peers.scheduler.ChoosePrefill(request, timeout=call.deadline.remaining())


async def stream_tokens(
    peers: Peers,
    call: EngineCall,
    on_prefilled: OnPrefilled,
    first_choice: scheduler_pb.ChoosePrefillResponse | None = None,
    prompt_for: PromptFor | None = None,
) -> AsyncGenerator[Piece, None]:
    """Stream the request's tokens; ``on_prefilled`` (releasing the embeddings) starts in the
    background once the prompt has been read, so it does not delay the first token.
    ``first_choice``: the prefill worker already chosen for the first attempt, if any; up to
    MAX_PREFILL_ATTEMPTS prefill workers are tried before the first token. ``prompt_for``: the
    prompt for each chosen worker (a retry on another host needs its embeddings there), else
    ``call.prompt``."""
    excluded: list[str] = []
    for attempt in range(MAX_PREFILL_ATTEMPTS):
        started, worker = False, None
        try:
            choice = (
                first_choice
                if first_choice and not attempt
                else (await choose_prefill(peers, call, excluded))
            )
            worker = choice.worker
            if prompt_for is not None:
                call = replace(call, prompt=await prompt_for(worker))
            span = trace.get_current_span()
            span.set_attribute("epd.prefill_id", worker.id)
            span.set_attribute("epd.cached_blocks", choice.num_cached_blocks)
            if hands_off_kv(worker.role, call.live_roles):
                pieces = _prefill_then_decode(peers, call, worker, on_prefilled)
            else:
                pieces = _prefill_decode(peers, call, worker.endpoint)
            async for piece in pieces:
                if not started:
                    started = True
                    span.add_event(FIRST_TOKEN_EVENT)
                    peers.background.start(on_prefilled())
                yield piece
            return
        except EpdError as e:
            error = e
        if (
            started
            or worker is None
            or not isinstance(error, Unavailable)
            or attempt + 1 == MAX_PREFILL_ATTEMPTS
        ):
            raise error
        logger.warning(
            "request %s: prefill on %s failed before the first token (%s); retrying elsewhere",
            call.request_id,
            worker.id,
            error,
        )
        excluded.append(worker.id)
    raise Unavailable("no prefill worker could serve the request", reason="PREFILL_FAILED")


async def _prefill_decode(peers: Peers, call: EngineCall, endpoint: str) -> AsyncIterator[Piece]:
    stream = peers.prefill(endpoint).PrefillDecode(
        prefill_pb.PrefillDecodeRequest(
            request_id=call.request_id, model=call.model, prompt=call.prompt, sampling=call.sampling
        ),
        timeout=call.deadline.remaining(),
    )
    try:
        async for response in stream:
            yield Piece(
                list(response.token_ids),
                response.finish_reason,
                response.usage if response.HasField("usage") else None,
            )
    finally:
        stream.cancel()  # NOTE: no-op once finished; aborts the engine request otherwise


async def _prefill_then_decode(
    peers: Peers, call: EngineCall, worker: scheduler_pb.WorkerInfo, on_prefilled: OnPrefilled
) -> AsyncIterator[Piece]:
    try:
        reply, decoder = await concurrently(
            _prefill(peers, call, worker.endpoint), _choose_decode(peers, call)
        )
    except EpdError as error:
        if error.reason != "WRONG_MODE":
            raise
        # NOTE: an encode_prefill worker without KV hand-off beside decode workers: aggregated.
        async for piece in _prefill_decode(peers, call, worker.endpoint):
            yield piece
        return
    trace.get_current_span().set_attribute("epd.decode_id", decoder.worker.id)
    peers.background.start(on_prefilled())
    if reply.finish_reason:
        yield Piece([reply.first_token_id], reply.finish_reason, reply.usage)
        return
    yield Piece([reply.first_token_id])
    stream = peers.decode(decoder.worker.endpoint).Decode(
        decode_pb.DecodeRequest(
            request_id=call.request_id,
            model=call.model,
            prompt=call.prompt,
            sampling=call.sampling,
            first_token_id=reply.first_token_id,
            kv_handle=reply.kv_handle,
        ),
        timeout=call.deadline.remaining(),
    )
    try:
        async for response in stream:
            yield Piece(
                list(response.token_ids),
                response.finish_reason,
                response.usage if response.HasField("usage") else None,
            )
    finally:
        stream.cancel()


async def _prefill(peers: Peers, call: EngineCall, endpoint: str) -> prefill_pb.PrefillResponse:
    request = prefill_pb.PrefillRequest(
        request_id=call.request_id, model=call.model, prompt=call.prompt, sampling=call.sampling
    )
    return await peers.prefill(endpoint).Prefill(request, timeout=call.deadline.remaining())


async def _choose_decode(peers: Peers, call: EngineCall) -> scheduler_pb.ChooseDecodeResponse:
    request = scheduler_pb.ChooseDecodeRequest(request_id=call.request_id, model=call.model)
    return await peers.scheduler.ChooseDecode(request, timeout=call.deadline.remaining())
