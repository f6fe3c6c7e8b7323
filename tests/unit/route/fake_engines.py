"""In-memory stand-ins for the prefill and decode workers' clients, recording every call: one
answering set tokens, one continuing a script as greedy decoding does; like the real clients
they fail with domain errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epd.common.errors import EpdError
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from tests.unit.route.fake_stream import FakeStream


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
