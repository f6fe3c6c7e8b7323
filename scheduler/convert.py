"""Proto <-> dataclass conversion for the scheduler (no grpc)."""

from __future__ import annotations

from epd.common.errors import InvalidArgument
from epd.common.roles import role_from_proto
from epd.scheduler.demand import EncoderDemand
from epd.scheduler.model import (
    Assignment,
    EncodeItem,
    ItemOutcome,
    Load,
    Placement,
    Policy,
    RegisteredWorker,
    WorkerSpec,
)
from epd.v1 import scheduler_service_pb2 as pb

POLICIES: dict[int, Policy] = {
    pb.ENCODER_POLICY_PER_IMAGE: Policy.PER_IMAGE,
    pb.ENCODER_POLICY_PER_REQUEST: Policy.PER_REQUEST,
    pb.ENCODER_POLICY_ADAPTIVE: Policy.ADAPTIVE,
}
POLICY_VALUES = {policy: value for value, policy in POLICIES.items()}


def policy_from_proto(value: int) -> Policy | None:
    """The Policy of an EncoderPolicy value; None for UNSPECIFIED (the deployment default)."""
    if value == pb.ENCODER_POLICY_UNSPECIFIED:
        return None
    if value not in POLICIES:
        raise InvalidArgument(f"unknown encoder policy {value}", reason="BAD_POLICY")
    return POLICIES[value]


def spec_from_proto(info: pb.WorkerInfo) -> WorkerSpec:
    """The registration in ``info`` (validated later by the registry)."""
    return WorkerSpec(
        info.id,
        role_from_proto(info.role),
        info.endpoint,
        info.model,
        info.device or "cpu",
        info.weight,
        info.capacity or 1,
        info.host_id,
        info.embeddings_device or "cpu",
    )


def spec_to_proto(spec: WorkerSpec) -> pb.WorkerInfo:
    """``spec`` as a WorkerInfo message."""
    return pb.WorkerInfo(
        id=spec.id,
        role=spec.role.value,
        endpoint=spec.endpoint,
        device=spec.device,
        weight=spec.weight,
        capacity=spec.capacity,
        host_id=spec.host_id,
        model=spec.model,
        embeddings_device=spec.embeddings_device,
    )


def load_from_proto(load: pb.WorkerLoad) -> Load:
    """The load reported in a heartbeat."""
    return Load(
        load.queue_depth,
        load.num_in_flight,
        load.item_latency_ms,
        load.kv_usage,
        load.batches_finished,
    )


def load_to_proto(load: Load, held: list[str] | None = None) -> pb.WorkerLoad:
    """``load`` as a WorkerLoad message (without KV events); ``held``: the items the scheduler
    believes the worker's cache holds, sent as a snapshot (None: no held items field)."""
    reply = pb.WorkerLoad(
        queue_depth=load.queue_depth,
        num_in_flight=load.num_in_flight,
        item_latency_ms=load.item_latency_ms,
        kv_usage=load.kv_usage,
        batches_finished=load.batches_finished,
    )
    if held is not None:
        reply.held_items.CopyFrom(pb.HeldItems(is_snapshot=True, added_mm_hashes=held))
    return reply


def items_from_proto(items: list[pb.EncodeItem]) -> list[EncodeItem]:
    """The items of a Place or AssignEncoders request."""
    return [EncodeItem(item.mm_hash, item.num_tokens or 1) for item in items]


def outcomes_from_proto(outcomes: list[pb.ItemOutcome]) -> list[ItemOutcome]:
    """The outcomes of a CompleteEncoding request."""
    return [ItemOutcome(o.item_index, o.latency_ms, o.cache_hit, o.failed) for o in outcomes]


def assignment_to_proto(assignment: Assignment) -> pb.AssignEncodersResponse:
    """Where each item of a request is encoded, as AssignEncoders answers and Place's
    ``encoders`` field carries."""
    return pb.AssignEncodersResponse(
        assignment_id=assignment.assignment_id,
        policy=POLICY_VALUES[assignment.policy],  # type: ignore[arg-type]
        assignments=[
            pb.EncoderAssignment(item_index=i, worker_id=worker_id, endpoint=endpoint)
            for i, (worker_id, endpoint) in enumerate(
                zip(assignment.worker_ids, assignment.endpoints, strict=True)
            )
        ],
    )


def placement_to_proto(placement: Placement) -> pb.PlaceResponse:
    """A request's workers, as Place answers (``decode`` and ``encoders`` unset when None)."""
    reply = pb.PlaceResponse(
        prefill=pb.ChoosePrefillResponse(
            worker=spec_to_proto(placement.prefill.spec),
            num_cached_blocks=placement.num_cached_blocks,
        )
    )
    if placement.decode is not None:
        reply.decode.worker.CopyFrom(spec_to_proto(placement.decode.spec))
    if placement.encoders is not None:
        reply.encoders.CopyFrom(assignment_to_proto(placement.encoders))
    return reply


def status_to_proto(
    worker: RegisteredWorker, heartbeat_age_s: float, held: list[str] | None = None
) -> pb.WorkerStatus:
    """One ListWorkers entry (``held``: as ``load_to_proto``)."""
    state = pb.WORKER_STATE_DRAINING if worker.draining else pb.WORKER_STATE_LIVE
    return pb.WorkerStatus(
        info=spec_to_proto(worker.spec),
        load=load_to_proto(worker.load, held),
        state=state,
        heartbeat_age_ms=int(heartbeat_age_s * 1000),
        num_assigned_in_flight=worker.num_assigned_in_flight,
    )


def demand_to_proto(demand: EncoderDemand) -> pb.EncoderDemand:
    """One kind's demand as sent by GetEncoderDemand (an unmeasured cost is 0)."""
    return pb.EncoderDemand(
        model=demand.model,
        device=demand.device,
        num_live=demand.num_live,
        num_needed=demand.num_needed,
        arrival_images_per_second=demand.arrival_rate,
        load_encoders=demand.load,
        image_cost_seconds=demand.item_s or 0.0,
        backlog_seconds=demand.backlog_s,
        cache_hit_ratio=demand.cache_hit_ratio,
    )
