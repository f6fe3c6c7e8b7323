"""The chaos test: ``epd up --encoders 2 --prefill-workers 2`` (E/PD, transformers engine) under a
steady load through the OpenAI port while each role is killed -9 once and SIGTERMed once, one at a
time, each kill waiting for the deployment to be whole again (``scripts/bench_soak.py --chaos``):
no request fails, no stream has a token repeated, missing or changed, every lease the encoders
lent is back once the load is over, and nothing is left in /dev/shm. Before it: both engine
replicas register under their own ids and ports, and answers equal the reference tokens, through
the other replica once the first is killed.

The decode role is E/P/D's (vLLM): ``stack_e2e`` kills one under load, and the whole chaos
over E/P/D is ``scripts/bench_soak.py --chaos -- --topology epd --prefill-workers 2
--decode-workers 2`` (about 4 min here; docs/deploy.md)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from epd.client import EpdClient, user
from epd.common.channels import create_channel
from epd.server.engine.reference import ReferenceEngine
from epd.v1 import scheduler_service_pb2 as pb
from epd.v1 import scheduler_service_pb2_grpc as pb_grpc
from tests.integration.e2e.launcher import Stack, is_alive, running_stack, segments_of
from tests.pictures import picture, png

ROOT = Path(__file__).resolve().parents[3]
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


def test_every_role_killed_and_drained_under_load_fails_no_request(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    flags = ("--topology", "e-pd", "--engine", "transformers", "--encoders", "2")
    flags += ("--prefill-workers", "2", "--max-restarts", "8")
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
        figures = chaos(stack, tmp_path / "endpoints.json")
        pids_seen = chaos_pids(figures, stack, tmp_path / "endpoints.json")
    assert figures["failed"] == 0 and figures["corrupted"] == 0, figures["reasons"]
    assert figures["ok"] == figures["requests"] == 240
    sent = [(k["role"], k["signal"]) for k in figures["kills"] if k["pid"]]
    assert sorted(sent) == sorted(
        (role, signal_name)
        for role in ("encoder", "prefill", "scheduler")
        for signal_name in ("SIGKILL", "SIGTERM")
    )
    assert all(k["back_after_s"] is not None for k in figures["kills"] if k["pid"])
    assert {"encode0", "encode1"} <= set(figures["transfers"]), "the encoders' data planes"
    assert figures["leases_outstanding"] == 0, figures["transfers"]
    assert not [pid for pid in pids_seen if is_alive(pid)]
    assert segments_of(pids_seen) == []


def chaos(stack: Stack, endpoints_file: Path) -> dict[str, Any]:
    """``bench_soak.py --chaos`` against ``stack``: its figures."""
    url = str(stack.endpoints["http"]).removesuffix("/v1") + "/v1"
    command = [sys.executable, str(ROOT / "scripts" / "bench_soak.py"), "--json", "--chaos"]
    command += ["--requests", "240", "--concurrency", "8", "--heal-timeout-s", "90"]
    command += ["--url", url, "--endpoints-file", str(endpoints_file)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.stdout.strip(), done.stderr[-3000:]
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def chaos_pids(figures: dict[str, Any], stack: Stack, endpoints_file: Path) -> list[int]:
    """Every pid the deployment had: the killed ones and those serving at the end."""
    killed = [int(kill["pid"]) for kill in figures["kills"] if kill["pid"]]
    now = json.loads(endpoints_file.read_text())["pids"].values()
    return sorted({*killed, *now, *stack.pids.values()})


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
