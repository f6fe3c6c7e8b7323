"""The same chat-completions and completions bodies sent to monolithic vLLM (``vllm serve`` on the
tiny model) and to epd's route (E/PD and E/P/D, on the session's vLLM engines): the same status
codes, and for greedy or seeded bodies the same text, finish reasons, tool calls, completion
tokens and logprobs. Both run with ``--enable-auto-tool-choice --tool-call-parser hermes
--trust-request-chat-template``. One ``vllm serve`` and one epd deployment per topology serve
every module of this package (package-scoped fixtures)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from epd.common.roles import Role
from epd.launch.launcher import Deployment
from epd.scheduler.app import build_scheduler_server
from epd.server.decode.app import DecodeConfig, build_decode_server
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.prefill.app import PrefillConfig, build_prefill_server
from epd.server.route.app import RouteConfig, build_route_server
from epd.server.route.tools import ToolOptions
from tests.integration.compat.vllm_serve.servers import (
    ENCODERS,
    FLAGLESS,
    GRPC,
    TOOL_FLAGS,
    TRUST_FLAG,
)
from tests.integration.registered import until_registered
from tests.unit.scripts.loader import load


@pytest.fixture(scope="package")
async def vllm_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``vllm serve`` on the tiny model, as a child process."""
    servers = load("vllm_servers")
    deployment = Deployment(tmp_path_factory.mktemp("vllm"), dict(os.environ))
    try:
        yield await servers.start_vllm(deployment, tiny_model_dir, "vllm", *TOOL_FLAGS, TRUST_FLAG)
    finally:
        deployment.stop()


@pytest.fixture(scope="package", params=["e-pd", "e-p-d", "ep-d"])
async def epd_url(request, tiny_model_dir: Path, engines) -> AsyncIterator[str]:
    """epd's route on the session's engines: with an encoder, one prefill+decode worker or a
    prefill worker handing its KV to a decode worker; or (``--all-families``) an
    encode_prefill worker handing its KV to a decode worker."""
    if request.param == "ep-d" and not request.config.getoption("--all-families"):
        pytest.skip("EP/D: CI runs E/PD and E/P/D; --all-families runs it")
    scheduler, scheduler_port = await build_scheduler_server()
    endpoint = f"127.0.0.1:{scheduler_port}"
    is_split = request.param != "e-pd"
    workers = []
    if request.param != "ep-d":
        encoder = EncodeConfig(tiny_model_dir, model_id="tiny", scheduler=endpoint)
        workers.append(await build_encode_server(encoder))
    mode = {"e-pd": Role.PREFILL_DECODE, "e-p-d": Role.PREFILL, "ep-d": Role.ENCODE_PREFILL}
    config = PrefillConfig(
        tiny_model_dir,
        mode=mode[request.param],
        hands_off_kv=request.param == "ep-d",
        scheduler=endpoint,
    )
    workers.append(await build_prefill_server(config, engines[0]))
    if is_split:
        workers.append(await build_decode_server(DecodeConfig(scheduler=endpoint), engines[1]))
    tools = ToolOptions(
        enable_auto_tool_choice=True, tool_call_parser="hermes", trust_request_chat_template=True
    )
    route = await build_route_server(
        RouteConfig(tiny_model_dir, endpoint, "tiny", http_port=0, tools=tools)
    )
    # NOTE: a second route without the tool flags, on the same workers
    flagless = await build_route_server(RouteConfig(tiny_model_dir, endpoint, "tiny", http_port=0))
    await until_registered(endpoint, len(workers))
    assert route.http is not None and flagless.http is not None
    url = f"http://127.0.0.1:{route.http.port}/v1"
    FLAGLESS[url] = f"http://127.0.0.1:{flagless.http.port}/v1"
    GRPC[url] = f"127.0.0.1:{route.port}"
    if request.param != "ep-d":
        ENCODERS[url] = workers[0]
    yield url
    await flagless.stop()
    await route.stop()
    for worker in reversed(workers):
        await worker.stop()
    await scheduler.drain_and_stop(0)
