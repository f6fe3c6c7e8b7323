"""An in-memory stand-in for the scheduler client the route calls, recording every call; like the
real client it fails with domain errors."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from epd.common.errors import Unavailable
from epd.common.roles import Role, hands_off_kv, role_from_proto
from epd.v1 import scheduler_service_pb2 as scheduler_pb


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
                    info=scheduler_pb.WorkerInfo(id=w, role=r.value, endpoint=w, model="tiny"),
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
            if w not in request.exclude_worker_ids and r.value in request.roles
        ]
        if not live:
            raise Unavailable("no prefill worker", reason="NO_WORKER")
        worker, role = live[0]
        return scheduler_pb.ChoosePrefillResponse(
            worker=scheduler_pb.WorkerInfo(
                id=worker,
                role=role.value,
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
