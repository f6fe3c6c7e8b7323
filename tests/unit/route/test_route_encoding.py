"""The route's encoding step, against in-memory fakes: encode retries and lease release, the
images encoded for the chosen prefill worker's host and device, the pixels released once
encoded, and the items workers get."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from epd.common.errors import InvalidArgument, Unavailable
from epd.common.roles import Role
from epd.server.route.encoding import encode_all, release_all, release_pixels
from epd.server.route.request import Deadline
from tests.unit.route.fake_encoder import FakeEncoder
from tests.unit.route.fake_engines import FakeEngine
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fakes import FakePeers, text_router
from tests.unit.route.test_orchestration import engine_call, engine_pieces, stage_of


async def test_items_of_a_dead_encoder_are_retried_on_another_and_released_there() -> None:
    peers = FakePeers()
    peers.encoders["enc0"] = FakeEncoder("enc0", Unavailable("gone"), num_before_error=1)
    stage = stage_of(4)
    await encode_all(peers, stage, Deadline(30))  # type: ignore[arg-type]
    assert sorted(stage.results) == [0, 1, 2, 3]
    await peers.background.settle()
    assigns = [r for name, r in peers.scheduler.calls if name == "AssignEncoders"]
    assert list(assigns[1].exclude_worker_ids) == ["enc0"]
    assert [item.mm_hash for item in assigns[1].items] == ["h2"]
    assert all(item.num_tokens == 4 for item in assigns[0].items)
    failed = [
        o
        for name, r in peers.scheduler.calls
        if name == "CompleteEncoding"
        for o in r.outcomes
        if o.failed
    ]
    assert [o.item_index for o in failed] == [2]  # index of h2 in the assignment
    await release_all(peers, stage)  # type: ignore[arg-type]
    held = {"enc0/h0", "enc1/h1", "enc1/h2", "enc1/h3"}
    assert set(peers.encoders["enc0"].released + peers.encoders["enc1"].released) == held
    assert all(s.is_cancelled for s in peers.encoders["enc0"].streams)


async def test_nixl_leases_are_left_to_the_consumers_notification_once_it_has_prefilled() -> None:
    """The prefill worker's NIXL READ tells the encoder to free the payload: once it has
    prefilled, the route calls Release only for shared-memory leases; before that (an error, a
    retry elsewhere) it releases every lease."""
    encoders = {"enc0": FakeEncoder("enc0", location="nixl"), "enc1": FakeEncoder("enc1")}
    peers = FakePeers(encoders=encoders)
    call = engine_call(frozenset({Role.ENCODE, Role.PREFILL_DECODE}), 2)
    pieces = [p async for p in engine_pieces(text_router(peers), call, stage_of(2))]
    await peers.background.settle()
    assert [t for piece in pieces for t in piece.token_ids] == [7, 8, 9]
    assert [len(e.requests) for e in encoders.values()] == [1, 1]
    assert encoders["enc0"].released == [] and len(encoders["enc1"].released) == 1

    stage = stage_of(4)
    await encode_all(peers, stage, Deadline(30))  # type: ignore[arg-type]
    await release_all(peers, stage)  # type: ignore[arg-type]
    assert len(encoders["enc0"].released) == 2 and len(encoders["enc1"].released) == 3


async def test_encoding_does_not_wait_for_the_end_of_a_complete_stream() -> None:
    never = asyncio.Event()
    peers = FakePeers(encoders={name: FakeEncoder(name, linger=never) for name in ("enc0", "enc1")})
    stage = stage_of(3)
    await asyncio.wait_for(encode_all(peers, stage, Deadline(30)), 5)  # type: ignore[arg-type]
    assert sorted(stage.results) == [0, 1, 2]
    assert not any(s.is_cancelled for e in peers.encoders.values() for s in e.streams)
    never.set()  # NOTE: the streams' ends, read in the background, come now
    await peers.background.settle()


async def test_the_answer_does_not_wait_for_the_encoding_report() -> None:
    peers = FakePeers()
    peers.scheduler.reports_may_finish.clear()
    stage = stage_of(2)
    await asyncio.wait_for(encode_all(peers, stage, Deadline(30)), 5)  # type: ignore[arg-type]
    assert sorted(stage.results) == [0, 1]
    assert not [name for name, _ in peers.scheduler.calls if name == "CompleteEncoding"]
    peers.scheduler.reports_may_finish.set()
    await peers.background.settle()
    reports = [r for name, r in peers.scheduler.calls if name == "CompleteEncoding"]
    assert sum(len(r.outcomes) for r in reports) == 2


async def test_bad_input_at_an_encoder_is_not_retried() -> None:
    peers = FakePeers()
    peers.encoders["enc0"] = FakeEncoder("enc0", InvalidArgument("bad", reason="BAD_IMAGE"))
    with pytest.raises(InvalidArgument) as caught:
        await encode_all(peers, stage_of(1), Deadline(30))  # type: ignore[arg-type]
    assert caught.value.reason == "BAD_IMAGE"


async def test_every_encoder_failing_is_unavailable() -> None:
    peers = FakePeers(FakeScheduler(encoders=["enc0"]))
    peers.encoders["enc0"] = FakeEncoder("enc0", Unavailable("gone"))
    with pytest.raises(Unavailable):
        await encode_all(peers, stage_of(2), Deadline(30))  # type: ignore[arg-type]


def test_media_items_keep_their_source_when_hashed() -> None:
    from epd.server.route.media import _media_item
    from epd.server.route.request import ImageSource

    for source in (ImageSource(url="data:image/png;base64,AA"), ImageSource(data=b"png")):
        item = _media_item(source, "abc")
        assert item.mm_hash == "abc"
        assert item.WhichOneof("source") == ("url" if source.url else "data")
        assert (item.url, item.data) == (source.url, source.data)


@pytest.mark.parametrize(("prefill_host", "consumer"), [("host-b", "host-b"), ("", "h")])
async def test_images_are_encoded_for_the_host_of_the_chosen_prefill_worker(
    prefill_host: str, consumer: str
) -> None:
    # NOTE: encoders were told the route's host, so a prefill worker on another host got
    # shared-memory references it cannot read (FOREIGN_HOST).
    peers = FakePeers(FakeScheduler(prefill_host_id=prefill_host))
    call = engine_call(frozenset({Role.ENCODE, Role.PREFILL_DECODE}), 2)
    worker = text_router(peers)
    pieces = [piece async for piece in engine_pieces(worker, call, stage_of(2))]
    assert [t for piece in pieces for t in piece.token_ids] == [7, 8, 9]
    requests = [r for encoder in peers.encoders.values() for r in encoder.requests]
    assert len(requests) == 2
    assert {request.consumer_host_id for request in requests} == {consumer}


async def test_the_first_attempt_encodes_by_the_encoders_its_place_named() -> None:
    """Place assigns the first attempt's encoders with its prefill worker: its images are encoded
    by that assignment, not assigned again, before the prompt goes to the worker."""
    peers = FakePeers()
    call = engine_call(frozenset({Role.ENCODE, Role.PREFILL_DECODE}), 2)
    pieces = [piece async for piece in engine_pieces(text_router(peers), call, stage_of(2))]
    await peers.background.settle()
    assert [t for piece in pieces for t in piece.token_ids] == [7, 8, 9]
    names = [name for name, _ in peers.scheduler.calls]
    assert names.count("Place") == 1 and names.count("AssignEncoders") == 1  # NOTE: Place's
    assert [len(e.requests) for e in peers.encoders.values()] == [1, 1]
    [served] = peers.engines["pd0"].calls
    assert [image.WhichOneof("source") for image in served[1].prompt.images] == [
        "embeddings",
        "embeddings",
    ]


@pytest.mark.parametrize("device", ["cuda:0", "cpu"])
async def test_images_are_encoded_for_the_device_of_the_chosen_prefill_worker(device: str) -> None:
    peers = FakePeers(FakeScheduler(prefill_host_id="host-a", prefill_devices={"pd0": device}))
    call = engine_call(frozenset({Role.ENCODE, Role.PREFILL_DECODE}), 2)
    worker = text_router(peers)
    pieces = [piece async for piece in engine_pieces(worker, call, stage_of(2))]
    assert [t for piece in pieces for t in piece.token_ids] == [7, 8, 9]
    requests = [r for encoder in peers.encoders.values() for r in encoder.requests]
    assert [request.consumer_device for request in requests] == [device, device]


async def test_a_retry_on_another_host_encodes_the_images_again_for_that_host() -> None:
    """The first prefill worker (host a) fails before its first token; the retry goes to host b,
    where the references encoded for host a (shared memory there) cannot be read: the images
    are encoded again for host b and the first leases released, and the request answers."""
    scheduler = FakeScheduler(
        prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)],
        prefill_hosts={"pd0": "host-a", "pd1": "host-b"},
        prefill_devices={"pd0": "cuda:0", "pd1": "cpu"},
    )
    peers = FakePeers(scheduler, engines={"pd0": FakeEngine(error=Unavailable("down"))})
    call = engine_call(frozenset({Role.ENCODE, Role.PREFILL_DECODE}), 2)
    worker = text_router(peers)
    pieces = [piece async for piece in engine_pieces(worker, call, stage_of(2))]
    await peers.background.settle()
    assert [t for piece in pieces for t in piece.token_ids] == [7, 8, 9]
    requests = [r for encoder in peers.encoders.values() for r in encoder.requests]
    assert sorted((r.consumer_host_id, r.consumer_device) for r in requests) == [
        ("host-a", "cuda:0"),
        ("host-a", "cuda:0"),
        ("host-b", "cpu"),
        ("host-b", "cpu"),
    ]
    released = sorted(lease for e in peers.encoders.values() for lease in e.released)
    assert len(released) == 4  # the host-a leases at the retry, the host-b ones once prefilled
    [served] = peers.engines["pd1"].calls
    assert len(served[1].prompt.images) == 2


async def test_a_retry_whose_images_cannot_be_encoded_again_blames_no_prefill_worker() -> None:
    """The first prefill worker (host a) fails; the retry's worker is on host b, and encoding
    the images again for it fails: the request ends with that failure, without excluding the
    retry's worker and asking for a third (before: the encoding's failure was taken for the
    retry's worker's, which was excluded and replaced)."""
    scheduler = FakeScheduler(
        prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)],
        prefill_hosts={"pd0": "host-a", "pd1": "host-b"},
    )
    encoders = {name: FakeEncoder(name) for name in ("enc0", "enc1")}
    failing = EncodersBreakingEngine(encoders, error=Unavailable("down"))
    peers = FakePeers(scheduler, encoders=encoders, engines={"pd0": failing})
    call = engine_call(frozenset({Role.ENCODE, Role.PREFILL_DECODE}), 2)
    with pytest.raises(Unavailable) as caught:
        _ = [piece async for piece in engine_pieces(text_router(peers), call, stage_of(2))]
    assert caught.value.reason == "NO_ENCODER"  # NOTE: the fake scheduler's, both encoders down
    chosen = [request for name, request in scheduler.calls if name == "ChoosePrefill"]
    assert [list(request.exclude_worker_ids) for request in chosen] == [[], ["pd0"]]  # Place's, pd1
    await peers.background.settle()


class EncodersBreakingEngine(FakeEngine):
    """A prefill worker that fails, and whose failure takes every encoder down with it."""

    def __init__(self, encoders: dict[str, FakeEncoder], error: Unavailable) -> None:
        super().__init__(error=error)
        self.encoders = encoders

    def PrefillDecode(self, request: Any, timeout: float | None = None) -> Any:
        for encoder in self.encoders.values():
            encoder.error = Unavailable("gone")
        return super().PrefillDecode(request, timeout)


async def test_a_retry_on_the_same_host_keeps_the_embeddings() -> None:
    """Even where the retry's worker reads embeddings into another device: any reference is
    readable into any device."""
    scheduler = FakeScheduler(
        prefills=[("pd0", Role.PREFILL_DECODE), ("pd1", Role.PREFILL_DECODE)],
        prefill_host_id="host-a",
        prefill_devices={"pd0": "cuda:0", "pd1": "cuda:1"},
    )
    peers = FakePeers(scheduler, engines={"pd0": FakeEngine(error=Unavailable("down"))})
    call = engine_call(frozenset({Role.ENCODE, Role.PREFILL_DECODE}), 2)
    pieces = [piece async for piece in engine_pieces(text_router(peers), call, stage_of(2))]
    assert [t for piece in pieces for t in piece.token_ids] == [7, 8, 9]
    requests = [r for e in peers.encoders.values() for r in e.requests]
    assert [r.consumer_device for r in requests] == ["cuda:0", "cuda:0"]
    [served] = peers.engines["pd1"].calls
    assert len(served[1].prompt.images) == 2


class RecordingPlane:
    """A data plane stand-in that records releases."""

    def __init__(self) -> None:
        self.released: list[str] = []

    def release(self, lease_ids: list[str]) -> None:
        self.released.extend(lease_ids)


async def test_the_pixels_are_released_once_encoded_not_at_the_end_of_the_answer() -> None:
    peers = FakePeers()
    call = engine_call(frozenset({Role.ENCODE, Role.PREFILL_DECODE}), 2)
    worker = text_router(peers)
    plane = RecordingPlane()
    worker.plane = plane  # type: ignore[assignment]
    stage = stage_of(2)
    stage.pixel_leases = ["pixels-0", "pixels-1"]
    pieces = engine_pieces(worker, call, stage)
    first = await anext(pieces)
    assert first.token_ids == [7]
    assert plane.released == ["pixels-0", "pixels-1"] and stage.pixel_leases == []
    await pieces.aclose()
    release_pixels(worker.plane, stage)
    assert plane.released == ["pixels-0", "pixels-1"]


async def test_release_all_lets_go_of_the_pixels_and_the_embeddings_together() -> None:
    peers, stage, plane = FakePeers(), stage_of(2), RecordingPlane()
    await encode_all(peers, stage, Deadline(30))  # type: ignore[arg-type]
    stage.pixel_leases = ["pixels-0", "pixels-1"]
    await release_all(peers, stage, plane, read=True)  # type: ignore[arg-type]
    assert plane.released == ["pixels-0", "pixels-1"] and stage.pixel_leases == []
    assert len([i for e in peers.encoders.values() for i in e.released]) == 2  # NOTE: shm leases
    assert stage.results == {}
