"""SchedulerService over gRPC: convert, call the Scheduler, convert back."""

from __future__ import annotations

from epd.common.held_items import held_from_proto
from epd.common.roles import Role, role_from_proto
from epd.common.status import Context, handle_errors
from epd.scheduler import convert
from epd.scheduler.core import Scheduler
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc

# The most held items ListWorkers shows per encoder (the route polls the listing every second).
LISTED_HELD_ITEMS = 256


class SchedulerServicer(pb_grpc.SchedulerServiceServicer):  # type: ignore[misc]
    """Thin adapter over ``Scheduler``; every error mapping happens in ``handle_errors``."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._ttl_ms = int(scheduler.registry.ttl_s * 1000)

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
            held_from_proto(request.load),
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
        assignment = self.scheduler.assign_encoders(
            convert.items_from_proto(list(request.items)),
            model=request.model,
            policy=convert.policy_from_proto(request.policy),
            exclude=list(request.exclude_worker_ids),
        )
        return convert.assignment_to_proto(assignment)

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
        worker, num_cached = self.scheduler.choose_prefill(
            list(request.block_hashes),
            model=request.model,
            exclude=list(request.exclude_worker_ids),
            roles=[role_from_proto(role) for role in request.roles],
        )
        return pb.ChoosePrefillResponse(
            worker=convert.spec_to_proto(worker.spec), num_cached_blocks=num_cached
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
        placement = self.scheduler.place(
            convert.items_from_proto(list(request.items)),
            list(request.block_hashes),
            model=request.model,
            policy=convert.policy_from_proto(request.policy),
            prefill_roles=[role_from_proto(role) for role in request.prefill_roles],
        )
        return convert.placement_to_proto(placement)

    @handle_errors
    async def ListWorkers(
        self, request: pb.ListWorkersRequest, context: Context
    ) -> pb.ListWorkersResponse:
        role = role_from_proto(request.role) if request.role != pb.WORKER_ROLE_UNSPECIFIED else None
        workers = self.scheduler.registry.all(role, request.model)
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
