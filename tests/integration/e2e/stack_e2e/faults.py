"""Faults injected into the stack: the services SIGKILLed (whose logs the teardown cannot hold to
clean), a load of requests disturbed once two are answered, and the wait for the launcher to
have a killed service serving again."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

from PIL import Image

from epd.client import AsyncEpdClient, user
from epd.common.channels import create_channel
from epd.common.clients import HealthClient
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc
from tests.integration.e2e.launcher import Stack
from tests.integration.e2e.stack_e2e.checks import QUESTION
from tests.pictures import png

# The services SIGKILLed so far (the stack's teardown reads the logs of the others only).
KILLED: set[str] = set()


async def load(
    stack: Stack, images: list[Image.Image], max_tokens: int, disturb: Callable[[], None]
) -> list[list[int]]:
    """Ask about each of ``images``, 4 at once; ``disturb`` once two have been answered."""
    semaphore = asyncio.Semaphore(4)
    done = asyncio.Event()
    finished = 0

    async def one(client: AsyncEpdClient, image: Image.Image) -> list[int]:
        nonlocal finished
        async with semaphore:
            answer = await client.generate(
                [user(QUESTION, image=png(image))], max_tokens=max_tokens, ignore_eos=True
            )
        finished += 1
        if finished == 2:
            done.set()
        return answer.token_ids

    async with AsyncEpdClient(stack.route, timeout_s=300) as client:
        tasks = [asyncio.create_task(one(client, image)) for image in images]
        await done.wait()
        disturb()
        return list(await asyncio.gather(*tasks))


async def wait_until_restarted(
    stack: Stack, service: str, worker_id: str, timeout_s: float
) -> None:
    """Wait until the launcher has started ``service`` again (a new pid in the endpoints file),
    the new process answers SERVING and the scheduler lists its ``worker_id`` live."""
    endpoints_file = stack.work_dir / "endpoints.json"
    deadline = time.monotonic() + timeout_s
    while json.loads(endpoints_file.read_text())["pids"][service] == stack.pids[service]:
        assert time.monotonic() < deadline, f"{service} not restarted"
        await asyncio.sleep(1)
    endpoint = stack.endpoints[service]
    async with create_channel(endpoint) as channel:
        while not await HealthClient(channel, endpoint).is_serving(timeout=5):
            assert time.monotonic() < deadline, f"{service} not serving again"
            await asyncio.sleep(1)
    async with create_channel(stack.endpoints["scheduler"]) as channel:
        stub = scheduler_grpc.SchedulerServiceStub(channel)
        while True:
            listing = await stub.ListWorkers(scheduler_pb.ListWorkersRequest(), timeout=10)
            live = {w.info.id for w in listing.workers if w.state == scheduler_pb.WORKER_STATE_LIVE}
            if worker_id in live:
                return
            assert time.monotonic() < deadline, f"{worker_id} not registered again"
            await asyncio.sleep(1)
