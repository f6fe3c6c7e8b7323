"""In-memory stand-ins for the clients the route calls, recording every call (no servers); like
the real clients they fail with domain errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models

from epd.common.errors import EpdError, Unavailable
from epd.common.roles import Role, hands_off_kv, role_from_proto, role_to_proto
from epd.common.tasks import BackgroundCalls
from epd.server.media.grid import ImageGridder
from epd.server.media.loader import MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.route.prompt import PromptBuilder, Rendered
from epd.server.route.request import ChatMessage, ChatPart, ChatRequest, new_request_id
from epd.server.route.router import Router
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import generation_pb2, tensor_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import scheduler_service_pb2 as scheduler_pb


class FakeStream:
    """A server stream: yields ``responses`` (the first once ``hold`` is set, if given), then
    raises ``error`` if set; records cancel()."""

    def __init__(
        self,
        responses: list[Any],
        error: EpdError | None = None,
        hold: asyncio.Event | None = None,
        linger: asyncio.Event | None = None,
    ) -> None:
        """``linger``: after the responses, the stream ends only once it is set."""
        self.responses = responses
        self.error = error
        self.hold = hold
        self.linger = linger
        self.is_cancelled = False
        self.num_yielded = 0
        self._iterator: AsyncIterator[Any] | None = None

    def cancel(self) -> bool:
        self.is_cancelled = True
        return True

    async def _iterate(self) -> AsyncIterator[Any]:
        if self.hold is not None:
            await self.hold.wait()
        for response in self.responses:
            await asyncio.sleep(0)
            self.num_yielded += 1
            yield response
        if self.linger is not None:
            await self.linger.wait()
        if self.error is not None:
            raise self.error

    def __aiter__(self) -> AsyncIterator[Any]:
        # NOTE: like a grpc call, iterating again goes on where the last iteration stopped.
        if self._iterator is None:
            self._iterator = self._iterate()
        return self._iterator


@dataclass
class FakeScheduler:
    """Assigns encoders round robin over ``encoders`` minus exclusions; prefill likewise."""

    encoders: list[str] = field(default_factory=lambda: ["enc0", "enc1"])
    prefills: list[tuple[str, Role]] = field(default_factory=lambda: [("pd0", Role.PREFILL_DECODE)])
    decoders: list[str] = field(default_factory=lambda: ["dec0"])
    prefill_host_id: str = ""
    # host ids of particular prefill workers (the others: prefill_host_id)
    prefill_hosts: dict[str, str] = field(default_factory=dict)
    # embeddings devices of particular prefill workers (the others: none given)
    prefill_devices: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    reports_may_finish: asyncio.Event = field(default_factory=asyncio.Event)
    prefill_chosen: asyncio.Event = field(default_factory=asyncio.Event)
    decode_chosen: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.reports_may_finish.set()

    async def AssignEncoders(self, request: Any, timeout: float | None = None) -> Any:
        self.calls.append(("AssignEncoders", request))
        live = [e for e in self.encoders if e not in request.exclude_worker_ids]
        if not live:
            raise Unavailable("no encoder", reason="NO_ENCODER")
        return scheduler_pb.AssignEncodersResponse(
            assignment_id=f"a{len(self.calls)}",
            assignments=[
                scheduler_pb.EncoderAssignment(
                    item_index=i, worker_id=live[i % len(live)], endpoint=live[i % len(live)]
                )
                for i in range(len(request.items))
            ],
        )

    async def ListWorkers(self, request: Any, timeout: float | None = None) -> Any:
        self.calls.append(("ListWorkers", request))
        workers = [(e, Role.ENCODE) for e in self.encoders] + self.prefills
        workers += [(d, Role.DECODE) for d in self.decoders]
        return scheduler_pb.ListWorkersResponse(
            workers=[
                scheduler_pb.WorkerStatus(
                    info=scheduler_pb.WorkerInfo(
                        id=w, role=role_to_proto(r), endpoint=w, model="tiny"
                    ),
                    state=scheduler_pb.WORKER_STATE_LIVE,
                )
                for w, r in workers
            ]
        )

    async def CompleteEncoding(self, request: Any, timeout: float | None = None) -> Any:
        await self.reports_may_finish.wait()
        self.calls.append(("CompleteEncoding", request))
        return scheduler_pb.CompleteEncodingResponse()

    async def ChoosePrefill(self, request: Any, timeout: float | None = None) -> Any:
        self.calls.append(("ChoosePrefill", request))
        self.prefill_chosen.set()
        live = [
            (w, r)
            for w, r in self.prefills
            if w not in request.exclude_worker_ids and role_to_proto(r) in request.roles
        ]
        if not live:
            raise Unavailable("no prefill worker", reason="NO_WORKER")
        worker, role = live[0]
        return scheduler_pb.ChoosePrefillResponse(
            worker=scheduler_pb.WorkerInfo(
                id=worker,
                role=role_to_proto(role),
                endpoint=worker,
                host_id=self.prefill_hosts.get(worker, self.prefill_host_id),
                embeddings_device=self.prefill_devices.get(worker, ""),
            )
        )  # type: ignore[arg-type]

    async def ChooseDecode(self, request: Any, timeout: float | None = None) -> Any:
        self.calls.append(("ChooseDecode", request))
        self.decode_chosen.set()
        live = [d for d in self.decoders if d not in request.exclude_worker_ids]
        if not live:
            raise Unavailable("no decode worker", reason="NO_DECODE_WORKER")
        return scheduler_pb.ChooseDecodeResponse(
            worker=scheduler_pb.WorkerInfo(id=live[0], endpoint=live[0])
        )

    async def Place(self, request: Any, timeout: float | None = None) -> Any:
        """The scheduler's composition of the three calls (each recorded as its own call too)."""
        self.calls.append(("Place", request))
        choose = scheduler_pb.ChoosePrefillRequest(
            model=request.model, block_hashes=request.block_hashes, roles=request.prefill_roles
        )
        reply = scheduler_pb.PlaceResponse(prefill=await self.ChoosePrefill(choose))
        if hands_off_kv(role_from_proto(reply.prefill.worker.role), bool(self.decoders)):
            decode = scheduler_pb.ChooseDecodeRequest(model=request.model)
            reply.decode.CopyFrom(await self.ChooseDecode(decode))
        if request.items:
            assign = scheduler_pb.AssignEncodersRequest(
                model=request.model, items=request.items, policy=request.policy
            )
            reply.encoders.CopyFrom(await self.AssignEncoders(assign))
        return reply


def embeddings(endpoint: str, lease: str, location: str = "shm") -> tensor_pb2.TensorRef:
    ref = tensor_pb2.TensorRef(lease_id=lease, producer_endpoint=endpoint, byte_size=4)
    if location == "nixl":
        ref.nixl.agent_name = f"agent-{endpoint}"
    else:
        ref.shm.name = f"segment-{lease}"
    return ref


@dataclass
class FakeEncoder:
    """Encodes every item, or fails with ``error`` after ``num_before_error`` items; answers
    once ``hold`` is set, if given."""

    endpoint: str
    error: EpdError | None = None
    num_before_error: int = 0
    hold: asyncio.Event | None = None
    linger: asyncio.Event | None = None
    location: str = "shm"
    streams: list[FakeStream] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)

    def Encode(self, request: Any, timeout: float | None = None) -> FakeStream:
        self.requests.append(request)
        count = self.num_before_error if self.error else len(request.items)
        responses = [
            encode_pb.EncodeResponse(
                item_index=i,
                mm_hash=request.items[i].mm_hash,
                embeddings=embeddings(
                    self.endpoint, f"{self.endpoint}/{request.items[i].mm_hash}", self.location
                ),
            )
            for i in range(count)
        ]
        self.streams.append(FakeStream(responses, self.error, self.hold, self.linger))
        return self.streams[-1]

    async def Release(self, request: Any, timeout: float | None = None) -> Any:
        self.released.extend(request.lease_ids)
        return encode_pb.ReleaseResponse()


@dataclass
class FakeEngine:
    """A prefill or decode worker producing ``tokens``, failing first with ``error`` if set;
    Prefill and PrefillDecode answer once ``hold`` is set, if given, the prompt's logprobs
    ``prompt_logprobs`` with the first token."""

    tokens: list[int] = field(default_factory=lambda: [7, 8, 9])
    error: EpdError | None = None
    num_before_error: int = 0
    hold: asyncio.Event | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)
    streams: list[FakeStream] = field(default_factory=list)
    prompt_logprobs: list[generation_pb2.TokenLogprobs] = field(default_factory=list)

    def _stream(self, tokens: list[int], response_type: Callable[..., Any]) -> FakeStream:
        count = self.num_before_error if self.error else len(tokens)
        responses = [response_type(token_ids=[t]) for t in tokens[:count]]
        if not self.error:
            responses[-1].finish_reason = generation_pb2.FINISH_REASON_LENGTH
            responses[-1].usage.completion_tokens = len(self.tokens)
        self.streams.append(FakeStream(responses, self.error))
        return self.streams[-1]

    def PrefillDecode(self, request: Any, timeout: float | None = None) -> FakeStream:
        self.calls.append(("PrefillDecode", request))
        stream = self._stream(self.tokens, prefill_pb.PrefillDecodeResponse)
        if stream.responses:
            stream.responses[0].prompt_logprobs.extend(self.prompt_logprobs)
        for response in stream.responses:  # NOTE: the token, then the next ids, less likely
            response.logprobs.extend(candidates(response.token_ids, request.sampling.logprobs))
        stream.hold = self.hold
        return stream

    async def Prefill(self, request: Any, timeout: float | None = None) -> Any:
        self.calls.append(("Prefill", request))
        if self.hold is not None:
            try:
                await self.hold.wait()
            except asyncio.CancelledError:
                self.calls.append(("Prefill cancelled", request))
                raise
        if self.error is not None:
            raise self.error
        return prefill_pb.PrefillResponse(
            first_token_id=self.tokens[0], prompt_logprobs=self.prompt_logprobs
        )

    def Decode(self, request: Any, timeout: float | None = None) -> FakeStream:
        from epd.v1 import decode_service_pb2

        self.calls.append(("Decode", request))
        return self._stream(self.tokens[1:], decode_service_pb2.DecodeResponse)


def candidates(token_ids: Any, num_candidates: int) -> list[generation_pb2.TokenLogprobs]:
    """Each of ``token_ids``' logprobs as a fake engine reports them when asked for
    ``num_candidates``: the token itself (rank 1), then the ids after it."""
    if not num_candidates:
        return []
    return [
        generation_pb2.TokenLogprobs(
            candidates=[
                generation_pb2.Logprob(
                    token_id=token + rank, logprob=-0.5 * (rank + 1), rank=rank + 1
                )
                for rank in range(num_candidates + 1)
            ]
        )
        for token in token_ids
    ]


SCRIPT = list(range(100, 140))


@dataclass
class ScriptedEngine:
    """A prefill or decode worker whose model continues ``SCRIPT`` from wherever its prompt (two
    tokens, then tokens of the script already generated) stops, as greedy decoding of a real
    model continues its sequence; it fails with ``error`` after ``num_before_error`` tokens of
    each stream, if set, as a worker that died mid-stream. Records every call."""

    error: EpdError | None = None
    num_before_error: int = 0
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def _due(self, request: Any) -> list[int]:
        token_ids = _prompt_token_ids(request)
        done = len(token_ids) - 2
        assert token_ids[2:] == SCRIPT[:done], "not a continuation"
        return SCRIPT[done : done + (request.sampling.max_tokens or 16)]

    def _stream(self, request: Any, tokens: list[int], response_type: Any) -> FakeStream:
        count = min(self.num_before_error, len(tokens)) if self.error else len(tokens)
        responses = [response_type(token_ids=[t]) for t in tokens[:count]]
        if not self.error and responses:
            responses[-1].finish_reason = generation_pb2.FINISH_REASON_LENGTH
            responses[-1].usage.prompt_tokens = len(_prompt_token_ids(request))
            responses[-1].usage.completion_tokens = len(self._due(request))
        return FakeStream(responses, self.error)

    def PrefillDecode(self, request: Any, timeout: float | None = None) -> FakeStream:
        self.calls.append(("PrefillDecode", request))
        return self._stream(request, self._due(request), prefill_pb.PrefillDecodeResponse)

    async def Prefill(self, request: Any, timeout: float | None = None) -> Any:
        self.calls.append(("Prefill", request))
        if self.error is not None and not self.num_before_error:
            raise self.error
        return prefill_pb.PrefillResponse(first_token_id=self._due(request)[0])

    def Decode(self, request: Any, timeout: float | None = None) -> FakeStream:
        from epd.v1 import decode_service_pb2

        self.calls.append(("Decode", request))
        tokens = self._due(request)
        assert request.first_token_id == tokens[0]
        return self._stream(request, tokens[1:], decode_service_pb2.DecodeResponse)


def _prompt_token_ids(request: Any) -> list[int]:
    """The prompt's tokens of a Prefill, PrefillDecode or Decode request."""
    if hasattr(request, "prompt_token_ids"):
        return list(request.prompt_token_ids)
    return list(request.prompt.token_ids)


@dataclass
class FakePeers:
    """``Peers`` with fakes behind each endpoint."""

    scheduler: FakeScheduler = field(default_factory=FakeScheduler)
    encoders: dict[str, FakeEncoder] = field(default_factory=dict)
    engines: dict[str, Any] = field(default_factory=dict)
    background: BackgroundCalls = field(default_factory=BackgroundCalls)

    def encoder(self, endpoint: str) -> FakeEncoder:
        return self.encoders.setdefault(endpoint, FakeEncoder(endpoint))

    def prefill(self, endpoint: str) -> FakeEngine:
        return self.engines.setdefault(endpoint, FakeEngine())

    def decode(self, endpoint: str) -> FakeEngine:
        return self.engines.setdefault(endpoint, FakeEngine())


class StubTokenizer:
    """Token i is the word ``str(i)``."""

    backend_tokenizer = Tokenizer(models.WordLevel({str(i): i for i in range(1024)}, "0"))


class StubPrompts:
    """A prompt builder for text-only requests: two tokens, no block hashes."""

    tokenizer = StubTokenizer()

    def num_chars(self, messages: Any) -> int:
        return 2

    def render(
        self,
        messages: Any,
        template_kwargs: Any = None,
        chat_template: Any = None,
        add_special_tokens: bool = False,
    ) -> Rendered:
        return Rendered("ab", [1, 2])

    def block_hashes(
        self,
        token_ids: list[int],
        images: Any,
        videos: Any = None,
        salt: str = "",
        param: str = "messages",
    ) -> list[int]:
        return []

    max_context_tokens = None

    def expanded_ids(self, token_ids: list[int], image_tokens: Any, video_tokens: Any) -> list[int]:
        return token_ids


def text_router(peers: FakePeers) -> Router:
    """A router for the model ``tiny`` serving text-only requests over ``peers``."""
    prompts: Any = StubPrompts()
    unused: Any = None  # NOTE: text only: no media to load, no image grids
    return Router(peers, prompts, unused, model_id="tiny", host_id="h", grids=unused)  # type: ignore[arg-type]


def model_router(peers: FakePeers, prompts: PromptBuilder, model_dir: Path) -> Router:
    """A router for the model ``tiny`` over ``peers``, with the real prompt builder, media rules
    and image grids of ``model_dir``."""
    loader = MediaLoader(MediaPolicy(), model_id="tiny", processor_fingerprint="x")
    grids = ImageGridder(model_dir)
    return Router(peers, prompts, loader, model_id="tiny", host_id="h", grids=grids)  # type: ignore[arg-type]


def generate_request(model: str) -> ChatRequest:
    """A text-only request for ``model``."""
    return ChatRequest(new_request_id(), model, [ChatMessage("user", [ChatPart(text="hi")])])


async def generate(worker: Router, model: str) -> list[Any]:
    return [chunk async for chunk in worker.generate(generate_request(model), timeout_s=5)]
