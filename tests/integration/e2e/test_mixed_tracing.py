"""A route started by hand (``epd route``, no tracing) against workers that trace (as ``epd up``
starts them) answers like the deployment's own route: traced and untraced processes call each
other with the same plain RPCs."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

from epd.client import EpdClient, user
from epd.common.channels import wait_for_health
from epd.launch.launcher import free_port
from epd.launch.up_cli import SPAN_FILE
from tests.integration.e2e.launcher import epd_command, running_stack
from tests.pictures import picture, png

QUESTION = "What is in this picture?"


def test_an_untraced_route_serves_with_traced_workers(tiny_model_dir: Path, tmp_path: Path) -> None:
    with running_stack(
        tiny_model_dir, tmp_path, "--topology", "e-pd", "--engine", "transformers", timeout_s=240
    ) as stack:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("EPD_TRACE")}
        log = open(tmp_path / "route-by-hand.log", "wb")  # noqa: SIM115 - closed below
        route = subprocess.Popen(
            epd_command(
                "route",
                tiny_model_dir,
                "--scheduler",
                str(stack.endpoints["scheduler"]),
                "--port",
                str(port),
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
        try:
            asyncio.run(wait_for_health(f"127.0.0.1:{port}", timeout_s=120))
            image = png(picture(5))
            with EpdClient(stack.route, timeout_s=120) as client:
                expected = client.generate([user(QUESTION, image=image)], max_tokens=6)
            with EpdClient(f"127.0.0.1:{port}", timeout_s=120) as client:
                answers = [
                    client.generate([user(QUESTION, image=png(picture(5 + i)))], max_tokens=6)
                    for i in range(3)
                ]
        finally:
            route.terminate()
            route.wait(60)
            log.close()
        spans = (stack.run_dir / SPAN_FILE).read_text()
    assert answers[0].token_ids == expected.token_ids and expected.token_ids
    assert all(len(answer.token_ids) == 6 for answer in answers)
    assert "EncodeService/Encode" in spans  # NOTE: the encoder did trace its calls
