"""Place: one call answers where a request runs (encoders, prefill worker, decode worker), as
AssignEncoders, ChoosePrefill and ChooseDecode would, and records what they record."""

from __future__ import annotations

import grpc

from epd.v1 import scheduler_service_pb2 as pb
from tests.grpc.scheduler.test_scheduler_service import fails_with, info, scheduler  # noqa: F401

ITEMS = [pb.EncodeItem(mm_hash="a" * 32, num_tokens=4), pb.EncodeItem(mm_hash="b" * 32)]


async def register(stub, *workers: tuple[str, int, int]) -> None:
    for worker_id, role, port in workers:
        await stub.RegisterWorker(
            pb.RegisterWorkerRequest(worker=info(worker_id, role=role, port=port))
        )


async def test_an_e_p_d_request_is_placed_in_one_call(scheduler) -> None:  # noqa: F811
    stub, _ = scheduler
    await register(
        stub,
        ("e1", pb.WORKER_ROLE_ENCODE, 7001),
        ("p1", pb.WORKER_ROLE_PREFILL, 7101),
        ("d1", pb.WORKER_ROLE_DECODE, 7201),
    )
    reply = await stub.Place(pb.PlaceRequest(request_id="r", items=ITEMS, block_hashes=[1, 2]))
    assert [a.worker_id for a in reply.encoders.assignments] == ["e1", "e1"]
    assert [a.item_index for a in reply.encoders.assignments] == [0, 1]
    assert reply.prefill.worker.id == "p1" and reply.decode.worker.id == "d1"
    listing = await stub.ListWorkers(pb.ListWorkersRequest(role=pb.WORKER_ROLE_ENCODE))
    assert listing.workers[0].num_assigned_in_flight == 2, "the assignment counts as in flight"
    await stub.CompleteEncoding(
        pb.CompleteEncodingRequest(
            assignment_id=reply.encoders.assignment_id,
            outcomes=[pb.ItemOutcome(item_index=i, latency_ms=5) for i in range(2)],
        )
    )
    again = await stub.Place(pb.PlaceRequest(block_hashes=[1, 2, 3]))
    assert again.prefill.num_cached_blocks == 2, "the first placement's blocks were recorded"
    assert not again.HasField("encoders"), "no items: no encoders asked for"


async def test_a_worker_that_decodes_itself_gets_no_decode_worker(scheduler) -> None:  # noqa: F811
    stub, _ = scheduler
    await register(
        stub,
        ("pd1", pb.WORKER_ROLE_PREFILL_DECODE, 7101),
        ("d1", pb.WORKER_ROLE_DECODE, 7201),
    )
    reply = await stub.Place(pb.PlaceRequest())
    assert reply.prefill.worker.id == "pd1" and not reply.HasField("decode")


async def test_an_encode_prefill_worker_hands_over_only_while_a_decode_worker_is_live(
    scheduler,  # noqa: F811
) -> None:
    stub, _ = scheduler
    await register(stub, ("epd1", pb.WORKER_ROLE_ENCODE_PREFILL, 7101))
    roles = [pb.WORKER_ROLE_ENCODE_PREFILL]
    alone = await stub.Place(pb.PlaceRequest(prefill_roles=roles))
    assert alone.prefill.worker.id == "epd1" and not alone.HasField("decode"), "EPD"
    await register(stub, ("d1", pb.WORKER_ROLE_DECODE, 7201))
    split = await stub.Place(pb.PlaceRequest(prefill_roles=roles))
    assert split.decode.worker.id == "d1", "EP/D"


async def test_what_cannot_be_placed_is_unavailable_with_the_call_s_reason(
    scheduler,  # noqa: F811
) -> None:
    stub, _ = scheduler
    unavailable = grpc.StatusCode.UNAVAILABLE
    await fails_with(stub.Place(pb.PlaceRequest()), unavailable, "NO_PREFILL_WORKER")
    await register(stub, ("p1", pb.WORKER_ROLE_PREFILL, 7101))
    await fails_with(stub.Place(pb.PlaceRequest()), unavailable, "NO_DECODE_WORKER")
    await register(stub, ("d1", pb.WORKER_ROLE_DECODE, 7201))
    await fails_with(stub.Place(pb.PlaceRequest(items=ITEMS)), unavailable, "NO_ENCODER")
