"""Waiting for in-process workers to register with their scheduler."""

from __future__ import annotations

import asyncio

from epd.common.channels import create_channel
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc


async def until_registered(endpoint: str, num_workers: int, timeout_s: float = 30.0) -> None:
    """Return once the scheduler at ``endpoint`` lists ``num_workers`` workers; AssertionError
    after ``timeout_s``."""
    async with create_channel(endpoint) as channel:
        stub = scheduler_grpc.SchedulerServiceStub(channel)
        for _ in range(int(timeout_s / 0.05)):
            listing = await stub.ListWorkers(scheduler_pb.ListWorkersRequest())
            if len(listing.workers) == num_workers:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{len(listing.workers)} workers registered, not {num_workers}")
