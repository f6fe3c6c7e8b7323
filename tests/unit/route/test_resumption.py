"""A stream whose worker fails mid-stream goes on on another replica: one stream, no token
repeated or missing, the uninterrupted run's tokens (greedy), against in-memory fakes."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from epd.common.errors import Cancelled, InvalidArgument, Unavailable
from epd.common.roles import Role
from epd.server.engine.base import KV_LOAD_FAILED
from epd.server.route.hops import EngineCall, Piece, stream_tokens
from epd.server.route.metrics import RouteMetrics
from epd.server.route.request import Deadline
from epd.server.route.resumption import Progress
from epd.server.route.topology import plan_for
from epd.v1 import generation_pb2, multimodal_pb2
from tests.unit.route.fake_engines import SCRIPT, ScriptedEngine
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fakes import FakePeers, text_router
from tests.unit.route.test_orchestration import engine_pieces, stage_of

E_PD = frozenset({Role.PREFILL_DECODE})
E_P_D = frozenset({Role.PREFILL, Role.DECODE})


def call_of(live_roles: frozenset[int], max_tokens: int = 6, num_images: int = 0) -> EngineCall:
    return EngineCall(
        "req",
        "tiny",
        generation_pb2.Prompt(token_ids=[1, 2]),
        generation_pb2.SamplingParams(max_tokens=max_tokens),
        [],
        plan_for(live_roles, num_images),
        Deadline(30),
    )  # type: ignore[arg-type]


async def _nothing() -> None:
    return None


async def pieces_of(peers: FakePeers, call: EngineCall, **options: Any) -> list[Piece]:
    return [p async for p in stream_tokens(peers, call, _nothing, **options)]  # type: ignore[arg-type]


def tokens(pieces: list[Piece]) -> list[int]:
    return [t for p in pieces for t in p.token_ids]


@pytest.mark.parametrize("error", [Unavailable("down"), Cancelled("drained")])
async def test_a_prefill_decode_worker_dying_mid_stream_is_continued_on_another(
    error: Exception,
) -> None:
    scheduler = FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)])
    dying = ScriptedEngine(error=error, num_before_error=2)  # type: ignore[arg-type]
    peers = FakePeers(scheduler, engines={"pd0": dying, "pd1": ScriptedEngine()})
    pieces = await pieces_of(peers, call_of(E_PD))
    assert tokens(pieces) == SCRIPT[:6]
    assert pieces[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
    [(_, resumed)] = peers.engines["pd1"].calls
    assert list(resumed.prompt.token_ids) == [1, 2, *SCRIPT[:2]]
    assert resumed.sampling.max_tokens == 4
    assert resumed.request_id == "req-resumed-1"
    chooses = [r for name, r in scheduler.calls if name == "ChoosePrefill"]
    assert list(chooses[-1].exclude_worker_ids) == ["pd0"]
    assert pieces[-1].usage is not None
    assert (pieces[-1].usage.prompt_tokens, pieces[-1].usage.completion_tokens) == (2, 6)


async def test_a_decode_worker_dying_mid_stream_is_continued_through_another_prefill() -> None:
    scheduler = FakeScheduler(prefills=[("p0", Role.PREFILL)], decoders=["dec0", "dec1"])
    dying = ScriptedEngine(error=Unavailable("down"), num_before_error=3)
    engines = {"p0": ScriptedEngine(), "dec0": dying, "dec1": ScriptedEngine()}
    peers = FakePeers(scheduler, engines=engines)
    pieces = await pieces_of(peers, call_of(E_P_D, max_tokens=8))
    assert tokens(pieces) == SCRIPT[:8]
    prefills = [r for name, r in engines["p0"].calls if name == "Prefill"]
    assert [list(r.prompt.token_ids) for r in prefills] == [[1, 2], [1, 2, *SCRIPT[:4]]]
    decodes = [r for name, r in scheduler.calls if name == "ChooseDecode"]
    assert list(decodes[-1].exclude_worker_ids) == ["dec0"]
    assert [name for name, _ in engines["dec1"].calls] == ["Decode"]


@pytest.mark.parametrize(
    "sampling",
    [
        {"structured_output": generation_pb2.StructuredOutput(regex="[a-z]+")},
        {"presence_penalty": 1.0},
        {"frequency_penalty": -0.5},
        {
            "repetition_detection": generation_pb2.RepetitionDetection(
                max_pattern_size=3, min_count=2
            )
        },
        {"thinking_token_budget": 0},
    ],
    ids=[
        "grammar",
        "presence_penalty",
        "frequency_penalty",
        "repetition_detection",
        "thinking_token_budget",
    ],
)
async def test_a_stream_whose_output_shapes_its_sampling_is_not_resumed(
    sampling: dict[str, Any],
) -> None:
    """A grammar would start again mid-answer and output penalties would count the tokens sent
    as prompt: the loss ends the stream instead of an answer the request would not give."""
    scheduler = FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)])
    dying = ScriptedEngine(error=Unavailable("down"), num_before_error=2)
    peers = FakePeers(scheduler, engines={"pd0": dying, "pd1": ScriptedEngine()})
    call = call_of(E_PD)
    call.sampling.MergeFrom(generation_pb2.SamplingParams(**sampling))
    received: list[int] = []
    with pytest.raises(Unavailable):
        async for piece in stream_tokens(peers, call, _nothing):  # type: ignore[arg-type]
            received.extend(piece.token_ids)
    assert received == SCRIPT[:2] and not peers.engines["pd1"].calls


def test_a_continued_call_asks_for_the_min_tokens_still_due() -> None:
    call = call_of(E_PD, max_tokens=10)
    call.sampling.min_tokens = 5
    progress = Progress(call, sent=[7, 8, 9])
    assert progress.continued(call.prompt).sampling.min_tokens == 2
    progress = Progress(call, sent=list(range(7)))
    assert progress.continued(call.prompt).sampling.min_tokens == 0


def test_a_continued_call_does_not_ask_for_the_prompts_logprobs_again() -> None:
    call = call_of(E_PD, max_tokens=10)
    call.sampling.prompt_logprobs = 1
    assert Progress(call).continued(call.prompt).sampling.prompt_logprobs == 1, "none sent yet"
    continued = Progress(call, sent=[7]).continued(call.prompt)
    assert not continued.sampling.HasField("prompt_logprobs"), "its prompt holds the sent tokens"


async def test_the_resumptions_of_a_request_are_limited() -> None:
    scheduler = FakeScheduler(prefills=[(f"pd{i}", Role.PREFILL_DECODE) for i in range(4)])
    engines = {f"pd{i}": ScriptedEngine(Unavailable("down"), num_before_error=1) for i in range(4)}
    peers = FakePeers(scheduler, engines=engines)
    received: list[int] = []
    with pytest.raises(Unavailable):
        async for piece in stream_tokens(peers, call_of(E_PD), _nothing, max_resumptions=2):  # type: ignore[arg-type]
            received.extend(piece.token_ids)
    assert received == SCRIPT[:3]
    assert not engines["pd3"].calls


async def test_an_error_that_is_not_a_lost_worker_is_not_resumed() -> None:
    scheduler = FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)])
    engines = {"pd0": ScriptedEngine(InvalidArgument("bad"), 1), "pd1": ScriptedEngine()}
    peers = FakePeers(scheduler, engines=engines)
    with pytest.raises(InvalidArgument):
        await pieces_of(peers, call_of(E_PD))
    assert not engines["pd1"].calls


async def test_a_failure_after_the_last_piece_is_not_resumed() -> None:
    """The worker sent every token due (the last with its finish reason), then its stream
    failed: the request is complete."""
    scheduler = FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)])
    peers = FakePeers(scheduler, engines={"pd1": ScriptedEngine()})

    def finished_then_lost(request: Any, timeout: float | None = None) -> Any:
        from epd.v1 import prefill_service_pb2 as prefill_pb
        from tests.unit.route.fake_stream import FakeStream

        last = prefill_pb.PrefillDecodeResponse(token_ids=SCRIPT[:6], finish_reason=2)
        return FakeStream([last], Unavailable("down"))

    engine = ScriptedEngine()
    engine.PrefillDecode = finished_then_lost  # type: ignore[method-assign]
    peers.engines["pd0"] = engine
    assert tokens(await pieces_of(peers, call_of(E_PD))) == SCRIPT[:6]
    assert not peers.engines["pd1"].calls


async def test_a_worker_lost_after_every_token_due_ends_the_stream_without_another() -> None:
    scheduler = FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)])
    engines = {"pd0": ScriptedEngine(Unavailable("down"), 6), "pd1": ScriptedEngine()}
    peers = FakePeers(scheduler, engines=engines)
    pieces = await pieces_of(peers, call_of(E_PD))
    assert tokens(pieces) == SCRIPT[:6]
    assert pieces[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert not engines["pd1"].calls


async def test_a_resumption_encodes_the_images_again_and_releases_every_lease() -> None:
    """The first worker prefilled (its embeddings were released) and died mid-stream: the
    images are encoded again (the encoders' caches answer) for the next worker, whose prompt
    has them, and every lease is released."""
    scheduler = FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)])
    engines = {"pd0": ScriptedEngine(Unavailable("down"), 2), "pd1": ScriptedEngine()}
    peers = FakePeers(scheduler, engines=engines)
    worker = text_router(peers)
    call = call_of(frozenset({Role.ENCODE, Role.PREFILL_DECODE}), num_images=2)
    pieces = [p async for p in engine_pieces(worker, call, stage_of(2))]
    await peers.background.settle()
    assert tokens(pieces) == SCRIPT[:6]
    [(_, resumed)] = engines["pd1"].calls
    assert len(resumed.prompt.images) == 2
    assert all(image.embeddings.lease_id for image in resumed.prompt.images)
    requests = [r for e in peers.encoders.values() for r in e.requests]
    assert sum(len(r.items) for r in requests) == 4
    released = [lease for e in peers.encoders.values() for lease in e.released]
    assert len(released) == 4


async def test_resumptions_are_counted_by_the_failed_role() -> None:
    scheduler = FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)])
    engines = {"pd0": ScriptedEngine(Unavailable("down"), 2), "pd1": ScriptedEngine()}
    worker = text_router(FakePeers(scheduler, engines=engines))
    registry = CollectorRegistry()
    worker.metrics = RouteMetrics(registry)
    call = call_of(E_PD)
    assert tokens([p async for p in engine_pieces(worker, call, stage_of(0))]) == SCRIPT[:6]
    count = registry.get_sample_value("epd_route_resumptions_total", {"role": "prefill"})
    assert count == 1


def test_a_continued_call_asks_for_the_rest_after_the_tokens_sent() -> None:
    call = call_of(E_PD, max_tokens=0)
    progress = Progress(call)
    progress.record(Piece([5, 6, 7]))
    image = multimodal_pb2.ImageInput(mm_hash="h")
    continued = progress.continued(generation_pb2.Prompt(token_ids=[1, 2], images=[image]))
    assert list(continued.prompt.token_ids) == [1, 2, 5, 6, 7]
    assert len(continued.prompt.images) == 1
    assert continued.sampling.max_tokens == 13
    assert list(call.prompt.token_ids) == [1, 2] and call.sampling.max_tokens == 0
    usage = generation_pb2.Usage(prompt_tokens=9, completion_tokens=4, cached_prompt_tokens=9)
    last = progress.record(Piece([8], generation_pb2.FINISH_REASON_STOP, usage))
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (6, 7)
    assert last.usage.cached_prompt_tokens == 6
    assert progress.is_finished


async def test_with_no_replica_to_resume_on_the_stream_ends_with_the_worker_s_loss() -> None:
    scheduler = FakeScheduler(prefills=[("pd0", Role.PREFILL_DECODE)])
    lost = Unavailable("pd0 is unreachable", reason="PEER_UNREACHABLE")
    peers = FakePeers(scheduler, engines={"pd0": ScriptedEngine(lost, 2)})
    with pytest.raises(Unavailable) as caught:
        await pieces_of(peers, call_of(E_PD))
    assert caught.value.reason == "PEER_UNREACHABLE"


async def test_with_no_decode_worker_left_the_stream_ends_with_the_decode_worker_s_loss() -> None:
    scheduler = FakeScheduler(prefills=[("p0", Role.PREFILL)], decoders=["dec0"])
    lost = Unavailable("dec0 is unreachable", reason="PEER_UNREACHABLE")
    engines = {"p0": ScriptedEngine(), "dec0": ScriptedEngine(lost, 2)}
    peers = FakePeers(scheduler, engines=engines)
    with pytest.raises(Unavailable) as caught:
        await pieces_of(peers, call_of(E_P_D))
    assert caught.value.reason == "PEER_UNREACHABLE"
    assert len([name for name, _ in engines["p0"].calls if name == "Prefill"]) == 2


class FailsItsFirstDecode(ScriptedEngine):
    """A decode worker whose first stream could not read its KV."""

    def Decode(self, request: Any, timeout: float | None = None) -> Any:
        stream = super().Decode(request, timeout)
        self.error = None
        return stream


async def test_a_kv_load_failure_is_the_prefill_worker_s_and_resumes_on_another() -> None:
    scheduler = FakeScheduler(
        prefills=[("p0", Role.PREFILL), ("p1", Role.PREFILL)], decoders=["dec0"]
    )
    lost_kv = Unavailable("the KV could not be loaded", reason=KV_LOAD_FAILED)
    engines = {"p0": ScriptedEngine(), "p1": ScriptedEngine(), "dec0": FailsItsFirstDecode(lost_kv)}
    peers = FakePeers(scheduler, engines=engines)
    pieces = await pieces_of(peers, call_of(E_P_D, max_tokens=8))
    assert tokens(pieces) == SCRIPT[:8]
    chooses = [r for name, r in scheduler.calls if name == "ChoosePrefill"]
    assert [list(r.exclude_worker_ids) for r in chooses] == [[], ["p0"]]
    decodes = [r for name, r in scheduler.calls if name == "ChooseDecode"]
    assert [list(r.exclude_worker_ids) for r in decodes] == [[], []]
    [(_, resumed)] = [c for c in engines["p1"].calls if c[0] == "Prefill"]
    assert list(resumed.prompt.token_ids) == [1, 2, SCRIPT[0]]
