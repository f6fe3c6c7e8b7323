"""A client run inside a test host's namespace (``python -m tests.integration.e2e.netns_client``).

``wait ENDPOINT...``: wait until each answers health SERVING. ``workers SCHEDULER``: print the
registered workers as JSON, [role name, endpoint] each. ``generate ROUTE SPEC``: send the
requests of SPEC (JSON: ``requests`` [{``seeds``, ``max_tokens``}], ``timeout_s``,
``started_file``) at once, touch ``started_file`` once each has streamed a token, print one JSON
result per request: ``tokens`` or ``error`` {code, reason, message}, ``elapsed_s``, and ``ended_at``
(``time.time()`` when its stream ended).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from epd.client import AsyncEpdClient, EpdClientError, user
from epd.common.channels import create_channel, wait_for_health
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc
from tests.pictures import picture, png

QUESTION = "describe this picture"


async def _one(
    client: AsyncEpdClient, request: dict[str, Any], timeout_s: float, started: asyncio.Event
) -> dict[str, Any]:
    images = [png(picture(seed, 96, 64)) for seed in request["seeds"]]
    begin = time.monotonic()
    tokens: list[int] = []
    try:
        async for chunk in client.stream(
            [user(QUESTION, images=images)],
            timeout_s=timeout_s,
            max_tokens=request["max_tokens"],
            ignore_eos=True,
        ):
            tokens += chunk.token_ids
            started.set()
    except EpdClientError as e:
        error = {"code": e.code, "reason": e.reason, "message": e.message}
        return {"error": error, "elapsed_s": time.monotonic() - begin, "ended_at": time.time()}
    return {"tokens": tokens, "elapsed_s": time.monotonic() - begin, "ended_at": time.time()}


async def generate(route: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    events = [asyncio.Event() for _ in spec["requests"]]

    async def mark_started() -> None:
        await asyncio.gather(*(event.wait() for event in events))
        if spec.get("started_file"):
            Path(spec["started_file"]).touch()

    marker = asyncio.ensure_future(mark_started())
    async with AsyncEpdClient(route) as client:
        results = await asyncio.gather(
            *(
                _one(client, request, spec["timeout_s"], event)
                for request, event in zip(spec["requests"], events, strict=True)
            )
        )
    marker.cancel()
    return list(results)


async def workers(scheduler: str) -> list[list[str]]:
    async with create_channel(scheduler) as channel:
        reply = await scheduler_grpc.SchedulerServiceStub(channel).ListWorkers(
            scheduler_pb.ListWorkersRequest(), timeout=30
        )
    return [[scheduler_pb.WorkerRole.Name(w.info.role), w.info.endpoint] for w in reply.workers]


def main(argv: list[str]) -> None:
    if argv[0] == "wait":
        for endpoint in argv[1:]:
            asyncio.run(wait_for_health(endpoint, timeout_s=300))
        return
    if argv[0] == "workers":
        print(json.dumps(asyncio.run(workers(argv[1]))))
        return
    print(json.dumps(asyncio.run(generate(argv[1], json.loads(argv[2])))))


if __name__ == "__main__":
    main(sys.argv[1:])
