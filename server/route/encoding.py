"""The encode stage of a request: assignment, concurrent Encode calls, retries, release.

Encoding is idempotent by mm_hash, so items whose encoder fails with UNAVAILABLE (or dies
mid-stream) are assigned again excluding that encoder. Every lease obtained is released at its
producer when the request ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from epd.common.errors import Cancelled, EpdError, Unavailable
from epd.server.media.hashing import pixels_tag
from epd.server.route.peers import Peers
from epd.server.route.request import Deadline
from epd.server.transfer.plane import DataPlane
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import multimodal_pb2, tensor_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb

logger = logging.getLogger(__name__)
MAX_ATTEMPTS = 3


@dataclass
class EncodeStage:
    """The images of one request and what became of them."""

    request_id: str
    model: str
    items: list[multimodal_pb2.MediaItem]
    policy: Any = 0
    # the host of the prefill worker the items are encoded for ("": none chosen yet)
    consumer_host_id: str = ""
    # the device the prefill worker reads the embeddings into (its embeddings_device)
    consumer_device: str = ""
    num_tokens: list[int] = field(default_factory=list)
    results: dict[int, encode_pb.EncodeResponse] = field(default_factory=dict)
    encoder_ids: set[str] = field(default_factory=set)
    # leases of the items' decoded pixels in the route's data plane (released once encoded)
    pixel_leases: list[str] = field(default_factory=list)
    # images sent to another encoder after theirs failed
    num_retried: int = 0


def share_pixels(
    plane: DataPlane | None,
    stage: EncodeStage,
    pixels: Iterable[tuple[multimodal_pb2.MediaItem, np.ndarray]],
) -> None:
    """Put each item's decoded pixels (an image's, or a video chunk's kept frames) into the
    route's data plane, tagged with the item's mm_hash (workers on this host trust them as that
    item, ``payload_layout``), and name them in the item; each lease joins the stage's
    ``pixel_leases`` as soon as it exists. Best effort: an item whose pixels cannot be put is
    sent by its source alone. Nothing without a plane."""
    if plane is None:
        return
    for item, array in pixels:
        try:
            ref = plane.put(
                torch.from_numpy(array),
                plane.host_id,
                preferred=tensor_pb2.TRANSFER_KIND_SHM,
                content_tag=pixels_tag(item.mm_hash),
            )
        except (EpdError, OSError) as e:
            logger.debug("pixels of %s not shared (%s): workers load the source", item.mm_hash, e)
            continue
        stage.pixel_leases.append(ref.lease_id)
        item.pixels.CopyFrom(ref)


def release_pixels(plane: DataPlane | None, stage: EncodeStage) -> None:
    """Release the stage's pixel leases (once every item is encoded or prefilled, or at the
    end)."""
    leases, stage.pixel_leases = stage.pixel_leases, []
    if leases and plane is not None:
        plane.release(leases)


def encode_items(stage: EncodeStage, indices: list[int]) -> list[scheduler_pb.EncodeItem]:
    """What the scheduler is told of the items ``indices`` (into ``stage.items``)."""
    return [
        scheduler_pb.EncodeItem(
            mm_hash=stage.items[i].mm_hash,
            num_tokens=stage.num_tokens[i] if i < len(stage.num_tokens) else 0,
        )
        for i in indices
    ]


async def assign_encoders(
    peers: Peers, stage: EncodeStage, missing: list[int], excluded: list[str], deadline: Deadline
) -> scheduler_pb.AssignEncodersResponse:
    """The scheduler's encoders for the items ``missing`` (indices into ``stage.items``)."""
    request = scheduler_pb.AssignEncodersRequest(
        request_id=stage.request_id,
        model=stage.model,
        policy=stage.policy,
        items=encode_items(stage, missing),
        exclude_worker_ids=excluded,
    )
    return await peers.scheduler.AssignEncoders(request, timeout=deadline.remaining())


async def encode_all(
    peers: Peers,
    stage: EncodeStage,
    deadline: Deadline,
    first: scheduler_pb.AssignEncodersResponse | None = None,
) -> None:
    """Fill ``stage.results`` for every item, retrying failed encoders elsewhere. ``first``:
    the assignment of every item for the first attempt, if already made."""
    excluded: list[str] = []
    for attempt in range(MAX_ATTEMPTS):
        missing = [i for i in range(len(stage.items)) if i not in stage.results]
        if not missing:
            return
        if attempt:
            stage.num_retried += len(missing)
        assignment = (
            first
            if first is not None and not attempt
            else await assign_encoders(peers, stage, missing, excluded, deadline)
        )
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for placed in assignment.assignments:
            groups[(placed.worker_id, placed.endpoint)].append(missing[placed.item_index])
        failed = await asyncio.gather(
            *(
                _encode_group(
                    peers, stage, worker, endpoint, indices, assignment, missing, deadline
                )
                for (worker, endpoint), indices in groups.items()
            )
        )
        excluded.extend(worker for worker in failed if worker)
        if any(failed) and attempt + 1 < MAX_ATTEMPTS:
            logger.warning(
                "request %s: retrying images of failed encoders %s",
                stage.request_id,
                [w for w in failed if w],
            )
    if len(stage.results) < len(stage.items):
        raise Unavailable(
            "images could not be encoded: every encoder tried failed", reason="ENCODE_FAILED"
        )


async def _encode_group(
    peers: Peers,
    stage: EncodeStage,
    worker_id: str,
    endpoint: str,
    indices: list[int],
    assignment: scheduler_pb.AssignEncodersResponse,
    missing: list[int],
    deadline: Deadline,
) -> str | None:
    """Encode ``indices`` on one encoder; returns the worker id if it failed retryably."""
    request = encode_pb.EncodeRequest(
        request_id=stage.request_id,
        model=stage.model,
        items=[stage.items[i] for i in indices],
        consumer_host_id=stage.consumer_host_id,
        consumer_device=stage.consumer_device,
    )
    start, outcomes = time.monotonic(), []
    failed: str | None = None
    received = 0
    call = peers.encoder(endpoint).Encode(request, timeout=deadline.remaining())
    try:
        async for response in call:
            index = indices[response.item_index]
            stage.results[index] = response
            outcomes.append(
                scheduler_pb.ItemOutcome(
                    item_index=missing.index(index),
                    cache_hit=response.cache_hit,
                    latency_ms=(time.monotonic() - start) * 1000,
                )
            )
            received += 1
            if received == len(indices):
                # NOTE: every item is in: the stream's end comes later and nothing in it is
                # needed; it is read in the background (which also
                # ends the call's client span).
                peers.background.start(_read_to_end(call))
                break
        stage.encoder_ids.add(worker_id)
    except EpdError as error:
        if not isinstance(error, (Unavailable, Cancelled)):
            raise
        failed = worker_id
        outcomes.extend(
            scheduler_pb.ItemOutcome(item_index=missing.index(i), failed=True)
            for i in indices
            if i not in stage.results
        )
    finally:
        if received < len(indices):
            call.cancel()  # NOTE: stops the encoder's work when the request is cancelled
    # NOTE: the scheduler's bookkeeping need not hold up the answer.
    peers.background.start(_report(peers, assignment.assignment_id, outcomes))
    return failed


async def _read_to_end(call: Any) -> None:
    try:
        async for _ in call:
            pass
    except EpdError:
        pass


async def _report(
    peers: Peers, assignment_id: str, outcomes: list[scheduler_pb.ItemOutcome]
) -> None:
    try:
        await peers.scheduler.CompleteEncoding(
            scheduler_pb.CompleteEncodingRequest(
                assignment_id=assignment_id, outcomes=outcomes, partial=True
            ),
            timeout=5,
        )
    except EpdError as e:
        logger.warning("could not report encoding outcome: %s", e)


async def release_all(
    peers: Peers, stage: EncodeStage, plane: DataPlane | None = None, *, read: bool = False
) -> None:
    """Release every lease of ``stage``: its pixels' in ``plane`` (``release_pixels``), its
    embeddings' at their producers (best effort: leases also expire). ``read``: the consumer
    has read every reference (it has prefilled), so NIXL leases are left to the notification
    its READ sent: no Release call for an encoder that handed over by NIXL alone (another host,
    or GPU memory)."""
    release_pixels(plane, stage)
    by_endpoint: dict[str, list[str]] = defaultdict(list)
    for result in stage.results.values():
        ref = result.embeddings
        if ref.lease_id and not (read and ref.WhichOneof("location") == "nixl"):
            by_endpoint[ref.producer_endpoint].append(ref.lease_id)
    for endpoint, lease_ids in by_endpoint.items():
        try:
            await peers.encoder(endpoint).Release(
                encode_pb.ReleaseRequest(lease_ids=lease_ids), timeout=5
            )
        except EpdError as e:
            logger.warning("release at %s failed (%s); leases will expire", endpoint, e)
    stage.results.clear()
