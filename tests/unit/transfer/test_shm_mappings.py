"""The shm consumer keeps its mappings of segments for their next leases, private ones for views and
shared ones to copy from: a kept mapping shows the segment's current bytes (never a caller's writes
to an earlier view), two views of one lease never share a mapping, a copy is private and refused if
its lease ends during the copy, mappings of unlinked segments are forgotten, and the caches keep to
their limits."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator

import pytest
import torch

from epd.common.errors import InvalidArgument, NotFound
from epd.server.transfer import shm
from epd.server.transfer.shm import SHM_DIR, SMALL_COPY_BYTES, ShmConsumer, ShmProducer
from epd.v1 import tensor_pb2

HOST = "host-a"
ELEMENTS = 64 * SMALL_COPY_BYTES // 4  # float32: a view of a mapping, 256 KiB


@pytest.fixture
def producer() -> Iterator[ShmProducer]:
    shm_producer = ShmProducer(HOST)
    yield shm_producer
    assert shm_producer.held() == []
    shm_producer.close()


@pytest.fixture
def consumer() -> Iterator[ShmConsumer]:
    shm_consumer = ShmConsumer(HOST)
    yield shm_consumer
    shm_consumer.close()
    assert len(shm_consumer.views) == len(shm_consumer.copies) == 0


def reuse(producer: ShmProducer, ref: tensor_pb2.TensorRef, fill: float) -> tensor_pb2.TensorRef:
    """Release ``ref`` and put a tensor of the same size, which lands in the same segment."""
    producer.release(ref.lease_id)
    again = producer.put(torch.full(tuple(ref.shape), fill))
    assert again.shm.name == ref.shm.name
    return again


def test_the_next_lease_of_a_segment_reuses_its_mapping(
    producer: ShmProducer, consumer: ShmConsumer
) -> None:
    first = producer.put(torch.full((ELEMENTS,), 1.0))
    address = consumer.get(first).data_ptr()
    second = reuse(producer, first, 2.0)
    view = consumer.get(second)
    assert view.data_ptr() == address, "the kept mapping serves the segment's next lease"
    assert torch.equal(view, torch.full((ELEMENTS,), 2.0))
    assert len(consumer.views) == 1
    producer.release(second.lease_id)


def test_writes_to_a_view_never_show_in_the_next_lease(
    producer: ShmProducer, consumer: ShmConsumer
) -> None:
    first = producer.put(torch.full((ELEMENTS,), 1.0))
    consumer.get(first)[::1000].fill_(9.0)
    second = reuse(producer, first, 2.0)
    assert torch.equal(consumer.get(second), torch.full((ELEMENTS,), 2.0))
    producer.release(second.lease_id)


def test_two_reads_of_one_lease_never_share_writes(
    producer: ShmProducer, consumer: ShmConsumer
) -> None:
    ref = producer.put(torch.full((ELEMENTS,), 1.0))
    written = consumer.get(ref)
    written.fill_(5.0)
    again = consumer.get(ref)
    assert again.data_ptr() != written.data_ptr()
    assert torch.equal(again, torch.full((ELEMENTS,), 1.0))
    assert torch.equal(consumer.get(ref, copy=True), torch.full((ELEMENTS,), 1.0)), (
        "the producer's segment is never written by a consumer"
    )
    producer.release(ref.lease_id)


def test_a_stale_reference_never_resets_the_view_of_a_live_lease(
    producer: ShmProducer, consumer: ShmConsumer
) -> None:
    first = producer.put(torch.full((ELEMENTS,), 1.0))
    consumer.get(first)
    second = reuse(producer, first, 2.0)
    live = consumer.get(second)
    live.fill_(5.0)
    with pytest.raises(NotFound) as caught:
        consumer.get(first)
    assert caught.value.reason == "LEASE_RELEASED"
    assert torch.equal(live, torch.full((ELEMENTS,), 5.0)), "a live view keeps its writes"
    producer.release(second.lease_id)


def test_a_malformed_lease_id_never_resets_the_view_of_a_live_lease(
    producer: ShmProducer, consumer: ShmConsumer
) -> None:
    # NOTE: the live lease's id plus a character once matched the segment's stamp as far as the
    # cache compared it (40 bytes), and the mapping was reset under the live view.
    first = producer.put(torch.full((ELEMENTS,), 1.0))
    consumer.get(first)
    second = reuse(producer, first, 2.0)
    live = consumer.get(second)
    live.fill_(5.0)
    malformed = tensor_pb2.TensorRef()
    malformed.CopyFrom(second)
    malformed.lease_id += "0"
    with pytest.raises(InvalidArgument) as caught:
        consumer.get(malformed)
    assert caught.value.reason == "BAD_TENSOR_REF"
    assert torch.equal(live, torch.full((ELEMENTS,), 5.0)), "a live view keeps its writes"
    producer.release(second.lease_id)


def anonymous_kib() -> int:
    """This process's anonymous memory (pages written to private mappings included), in KiB."""
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Anonymous:"))


def test_trim_frees_pages_written_to_views_once_every_view_is_gone(
    producer: ShmProducer, consumer: ShmConsumer
) -> None:
    elements = 8 << 20  # float32: 32 MiB
    ref = producer.put(torch.ones(elements))
    view = consumer.get(ref)
    view.fill_(2.0)
    written = anonymous_kib()
    consumer.trim()
    assert anonymous_kib() > written - (8 << 10), "a live view keeps the pages written to it"
    assert float(view[-1]) == 2.0
    del view
    gc.collect()
    consumer.trim()
    assert anonymous_kib() < written - (24 << 10)
    assert torch.equal(consumer.get(ref, copy=True), torch.ones(elements))
    producer.release(ref.lease_id)


def test_a_mapping_of_an_unlinked_segment_is_forgotten(
    producer: ShmProducer, consumer: ShmConsumer
) -> None:
    first = producer.put(torch.ones(ELEMENTS))
    consumer.get(first)
    second = reuse(producer, first, 2.0)
    os.unlink(os.path.join(SHM_DIR, second.shm.name))
    with pytest.raises(NotFound) as caught:
        consumer.get(second)
    assert caught.value.reason == "SEGMENT_NOT_FOUND"
    assert len(consumer.views) == 0
    producer.release(second.lease_id)


def test_trim_forgets_mappings_of_unlinked_segments(
    producer: ShmProducer, consumer: ShmConsumer
) -> None:
    kept, unlinked = (producer.put(torch.ones(ELEMENTS * size)) for size in (1, 2))
    view = consumer.get(unlinked)
    consumer.get(kept)
    os.unlink(os.path.join(SHM_DIR, unlinked.shm.name))
    consumer.trim()
    assert len(consumer.views) == 1
    assert torch.equal(view, torch.ones(ELEMENTS * 2)), "a view outlives its forgotten mapping"
    producer.release(kept.lease_id)
    producer.release(unlinked.lease_id)


def test_the_cache_keeps_to_its_limits(producer: ShmProducer) -> None:
    refs = [producer.put(torch.full((ELEMENTS * size,), float(size))) for size in (1, 2, 4, 8)]
    by_count = ShmConsumer(HOST, max_mappings=2)
    views = [by_count.get(ref) for ref in refs]
    assert len(by_count.views) == 2
    by_bytes = ShmConsumer(HOST, max_mapped_bytes=refs[2].byte_size * 2)
    views += [by_bytes.get(ref) for ref in refs]
    assert 0 < by_bytes.views.num_bytes <= refs[2].byte_size * 2
    for consumer in (by_count, by_bytes):
        consumer.close()
    for view, ref in zip(views, refs * 2, strict=True):
        assert torch.equal(view, torch.full(tuple(ref.shape), float(ref.shape[0] // ELEMENTS)))
    for ref in refs:
        producer.release(ref.lease_id)


def test_a_zero_budget_keeps_no_mapping(producer: ShmProducer) -> None:
    consumer = ShmConsumer(HOST, max_mapped_bytes=0)
    ref = producer.put(torch.ones(ELEMENTS))
    assert torch.equal(consumer.get(ref), torch.ones(ELEMENTS))
    assert len(consumer.views) == 0
    producer.release(ref.lease_id)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("copy", [False, True])
def test_large_payloads_of_every_dtype_read_back(
    producer: ShmProducer, consumer: ShmConsumer, dtype: torch.dtype, copy: bool
) -> None:
    tensors = [torch.randn(rows, 1031).to(dtype) for rows in (17, 33, 17)]
    for tensor in tensors:
        ref = producer.put(tensor)
        read = consumer.get(ref, copy=copy)
        assert read.dtype == dtype and read.shape == tensor.shape and torch.equal(read, tensor)
        producer.release(ref.lease_id)


def test_copies_come_out_of_a_kept_shared_mapping_and_are_private(
    producer: ShmProducer, consumer: ShmConsumer
) -> None:
    first = producer.put(torch.full((ELEMENTS,), 1.0))
    copied = consumer.get(first, copy=True)
    copied.fill_(7.0)
    assert torch.equal(consumer.get(first, copy=True), torch.full((ELEMENTS,), 1.0))
    second = reuse(producer, first, 2.0)
    assert torch.equal(consumer.get(second, copy=True), torch.full((ELEMENTS,), 2.0))
    assert torch.equal(copied, torch.full((ELEMENTS,), 7.0)), "a copy outlives its lease"
    assert len(consumer.copies) == 1 and len(consumer.views) == 0
    producer.release(second.lease_id)


def test_a_lease_released_during_a_copy_is_refused(
    monkeypatch: pytest.MonkeyPatch, producer: ShmProducer, consumer: ShmConsumer
) -> None:
    ref = producer.put(torch.full((ELEMENTS,), 1.0))
    tenant: list[tensor_pb2.TensorRef] = []
    move = shm.move

    def move_while_the_segment_changes_hands(destination: int, source: int, size: int) -> None:
        tenant.append(reuse(producer, ref, 2.0))
        move(destination, source, size)

    monkeypatch.setattr(shm, "move", move_while_the_segment_changes_hands)
    with pytest.raises(NotFound) as caught:
        consumer.get(ref, copy=True)
    assert caught.value.reason == "LEASE_RELEASED"
    producer.release(tenant[0].lease_id)


def test_threads_reading_views_and_copies_at_once_each_read_their_own_lease(
    producer: ShmProducer,
) -> None:
    consumer = ShmConsumer(HOST, max_mappings=3)  # fewer than the segments: evictions too
    errors: list[str] = []

    def work(worker: int) -> None:
        for round_index in range(40):
            fill = float(worker * 1000 + round_index)
            ref = producer.put(torch.full((ELEMENTS * (1 + round_index % 3),), fill))
            try:
                read = consumer.get(ref, copy=bool(round_index % 2))
                if not bool((read == fill).all()):
                    errors.append(f"worker {worker} round {round_index}: wrong bytes")
                del read
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(f"worker {worker} round {round_index}: {e!r}")
            producer.release(ref.lease_id)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    consumer.close()
    assert errors == []
