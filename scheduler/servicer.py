"""SchedulerService over gRPC: convert, call the Scheduler, convert back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import grpc

from epd.common.errors import Unavailable
from epd.common.roles import Role, hands_off_kv, role_from_proto
from epd.common.status import handle_errors
from epd.scheduler import convert
from epd.scheduler.core import NO_DECODE_WORKER, Scheduler
from epd.scheduler.model import RegisteredWorker
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
# The most held items ListWorkers shows per encoder (the route polls the listing every second).
LISTED_HELD_ITEMS = 256


class SchedulerServicer(pb_grpc.SchedulerServiceServicer):  # type: ignore[misc]
    """Thin adapter over ``Scheduler``; every error mapping happens in ``handle_errors``."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    @handle_errors
    async def RegisterWorker(
        self, request: pb.RegisterWorkerRequest, context: Context
    ) -> pb.RegisterWorkerResponse:
        worker = self.scheduler.register(convert.spec_from_proto(request.worker))
        return pb.RegisterWorkerResponse(lease_id=worker.lease_id, ttl_ms=self._ttl_ms)

    @handle_errors
    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: Context
    ) -> pb.HeartbeatResponse:
        load = convert.load_from_proto(request.load) if request.HasField("load") else None
        self.scheduler.heartbeat(
            request.lease_id,
            load,
            list(request.load.stored_block_hashes),
            list(request.load.removed_block_hashes),
            convert.held_from_proto(request.load),
        )
        return pb.HeartbeatResponse(ttl_ms=self._ttl_ms)

    @handle_errors
    async def Deregister(
        self, request: pb.DeregisterRequest, context: Context
    ) -> pb.DeregisterResponse:
        self.scheduler.deregister(request.lease_id)
        return pb.DeregisterResponse()

    @handle_errors
    async def AssignEncoders(
        self, request: pb.AssignEncodersRequest, context: Context
    ) -> pb.AssignEncodersResponse:
        return self._assign_encoders(
            request.items, request.model, request.policy, request.exclude_worker_ids
        )

    @handle_errors
    async def CompleteEncoding(
        self, request: pb.CompleteEncodingRequest, context: Context
    ) -> pb.CompleteEncodingResponse:
        self.scheduler.complete_encoding(
            request.assignment_id,
            convert.outcomes_from_proto(list(request.outcomes)),
            final=not request.partial,
        )
        return pb.CompleteEncodingResponse()

    @handle_errors
    async def ChoosePrefill(
        self, request: pb.ChoosePrefillRequest, context: Context
    ) -> pb.ChoosePrefillResponse:
        return self._choose_prefill(
            request.block_hashes, request.model, request.roles, request.exclude_worker_ids
        )

    @handle_errors
    async def ChooseDecode(
        self, request: pb.ChooseDecodeRequest, context: Context
    ) -> pb.ChooseDecodeResponse:
        worker = self.scheduler.choose_decode(
            model=request.model, exclude=list(request.exclude_worker_ids)
        )
        return pb.ChooseDecodeResponse(worker=convert.spec_to_proto(worker.spec))

    @handle_errors
    async def Place(self, request: pb.PlaceRequest, context: Context) -> pb.PlaceResponse:
        prefill = self._choose_prefill(
            request.block_hashes, request.model, request.prefill_roles, ()
        )
        reply = pb.PlaceResponse(prefill=prefill)
        decode = self._decode_for(role_from_proto(prefill.worker.role), request.model)
        if decode is not None:
            reply.decode.worker.CopyFrom(convert.spec_to_proto(decode.spec))
        if request.items:
            reply.encoders.CopyFrom(
                self._assign_encoders(request.items, request.model, request.policy, ())
            )
        return reply

    @handle_errors
    async def ListWorkers(
        self, request: pb.ListWorkersRequest, context: Context
    ) -> pb.ListWorkersResponse:
        role = role_from_proto(request.role) if request.role != pb.WORKER_ROLE_UNSPECIFIED else None
        workers = self.scheduler.list_workers(role, request.model)
        age, held = self.scheduler.registry.heartbeat_age, self.scheduler.held_items
        return pb.ListWorkersResponse(
            workers=[
                convert.status_to_proto(
                    w, age(w), held(w.id, LISTED_HELD_ITEMS) if w.spec.role is Role.ENCODE else None
                )
                for w in workers
            ]
        )

    @handle_errors
    async def GetEncoderDemand(
        self, request: pb.GetEncoderDemandRequest, context: Context
    ) -> pb.GetEncoderDemandResponse:
        demands = self.scheduler.encoder_demand(request.model)
        return pb.GetEncoderDemandResponse(
            demands=[convert.demand_to_proto(d) for d in demands],
            wait_target_seconds=self.scheduler.config.encode_wait_target_s,
        )

    def _assign_encoders(
        self,
        items: Sequence[pb.EncodeItem],
        model: str,
        policy: pb.EncoderPolicy,
        exclude: Sequence[str],
    ) -> pb.AssignEncodersResponse:
        assignment = self.scheduler.assign_encoders(
            convert.items_from_proto(list(items)),
            model=model,
            policy=convert.policy_from_proto(policy),
            exclude=list(exclude),
        )
        return pb.AssignEncodersResponse(
            assignment_id=assignment.assignment_id,
            policy=convert.POLICY_VALUES[assignment.policy],  # type: ignore[arg-type]
            assignments=[
                pb.EncoderAssignment(item_index=i, worker_id=w, endpoint=e)
                for i, (w, e) in enumerate(
                    zip(assignment.worker_ids, assignment.endpoints, strict=True)
                )
            ],
        )

    def _choose_prefill(
        self,
        block_hashes: Sequence[int],
        model: str,
        roles: Sequence[pb.WorkerRole],
        exclude: Sequence[str],
    ) -> pb.ChoosePrefillResponse:
        worker, cached = self.scheduler.choose_prefill(
            list(block_hashes),
            model=model,
            exclude=list(exclude),
            roles=[role_from_proto(role) for role in roles],
        )
        return pb.ChoosePrefillResponse(
            worker=convert.spec_to_proto(worker.spec), num_cached_blocks=cached
        )

    def _decode_for(self, prefill_role: Role, model: str) -> RegisteredWorker | None:
        """The decode worker a prefill worker of ``prefill_role`` hands its KV to
        (``hands_off_kv``): UNAVAILABLE when none is live for a role that always hands it over;
        None for a role that hands it over only while one is live, or never."""
        if not hands_off_kv(prefill_role, is_decode_live=True):
            return None
        try:
            return self.scheduler.choose_decode(model=model)
        except Unavailable as e:
            if e.reason != NO_DECODE_WORKER or hands_off_kv(prefill_role, is_decode_live=False):
                raise
            return None

    @property
    def _ttl_ms(self) -> int:
        return int(self.scheduler.registry.ttl_s * 1000)
