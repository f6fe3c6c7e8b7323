"""``epd up --prefill-workers 2``: both engine replicas start, register with the scheduler under
their own ids and ports, and the route's answers equal the reference tokens, through the other
replica once the first is killed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

from epd.client import EpdClient, user
from epd.common.channels import create_channel
from epd.server.engine.reference import ReferenceEngine
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc
from tests.integration.e2e.launcher import Stack, running_stack
from tests.pictures import picture, png

QUESTION = "What is in this picture?"
MAX_TOKENS = 4


async def list_workers(scheduler: str) -> list[pb.WorkerStatus]:
    async with create_channel(scheduler) as channel:
        reply = await pb_grpc.SchedulerServiceStub(channel).ListWorkers(
            pb.ListWorkersRequest(), timeout=10
        )
    return list(reply.workers)


def prefill_ids_of_answers(stack: Stack, num_answers: int) -> list[str]:
    """The ``epd.prefill_id`` the route recorded for each answer, once all are written."""
    deadline = time.monotonic() + 10
    while True:
        lines = (stack.run_dir / "spans.jsonl").read_text().splitlines()
        spans = [json.loads(line) for line in lines if line.strip()]
        ids = [
            s["attributes"]["epd.prefill_id"] for s in spans if "epd.prefill_id" in s["attributes"]
        ]
        if len(ids) >= num_answers or time.monotonic() > deadline:
            return ids
        time.sleep(0.2)


def test_two_prefill_decode_replicas_register_and_answer_with_the_reference_tokens(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    flags = ("--topology", "e-pd", "--engine", "transformers", "--prefill-workers", "2")
    with running_stack(tiny_model_dir, tmp_path, *flags) as stack:
        endpoints = stack.endpoints
        assert {"prefill", "prefill1"} <= set(endpoints) and "decode" not in endpoints
        assert endpoints["prefill"] != endpoints["prefill1"]
        assert len({endpoints["pids"]["prefill"], endpoints["pids"]["prefill1"]}) == 2
        workers = asyncio.run(list_workers(endpoints["scheduler"]))
        engines = {w.info.id: w.info.role for w in workers if w.info.id.startswith("prefill")}
        assert engines == {
            "prefill0": pb.WORKER_ROLE_PREFILL_DECODE,
            "prefill1": pb.WORKER_ROLE_PREFILL_DECODE,
        }
        answers = [ask(stack, tiny_model_dir, seed=1)]
        os.kill(endpoints["pids"]["prefill"], signal.SIGKILL)
        answers.append(ask(stack, tiny_model_dir, seed=2))
        assert prefill_ids_of_answers(stack, 2)[-1] == "prefill1"
        assert all(answer == expected for answer, expected in answers)


def ask(stack: Stack, model_dir: Path, seed: int) -> tuple[list[int], list[int]]:
    """(the route's answer, the reference tokens) for a question about picture ``seed``."""
    image = picture(seed, 64, 64)
    with EpdClient(stack.route, timeout_s=120) as client:
        answer = client.generate(
            [user(QUESTION, image=png(image))], max_tokens=MAX_TOKENS, ignore_eos=True
        )
    content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    expected = ReferenceEngine(model_dir).generate(
        [{"role": "user", "content": content}], [image], max_tokens=MAX_TOKENS, ignore_eos=True
    )
    return list(answer.token_ids), list(expected.token_ids)
