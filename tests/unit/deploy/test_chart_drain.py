"""The chart's probes, run as the kubelet runs them, against a real epd server (in process, on
free ports) through a drain: readiness and startup pass while it serves and fail from the start
of the drain; liveness passes through the whole drain, so a draining pod is never restarted, and
fails once the server has stopped, so it does check something."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epd.common.metrics import new_registry
from epd.common.server import EpdServer, ServerOptions, build_server
from tests.grpc.common.servicers import ScriptedEncodeService, encode_binding
from tests.unit.deploy.chart import by_component, only_container, render

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
SERVING = health_pb2.HealthCheckResponse.SERVING


def encoder_container(*sets: str) -> dict[str, Any]:
    return only_container(by_component(render(sets=sets), "Deployment")["encode-cpu"])


async def grpc_probe(action: dict[str, Any], port: int, timeout_s: float) -> bool:
    """Success when the health service answers SERVING for the probe's service."""
    request = health_pb2.HealthCheckRequest(service=action.get("service", ""))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
    return bool(reply.status == SERVING)


def http_probe(action: dict[str, Any], port: int, timeout_s: float) -> bool:
    """Success on a status from 200 to 399."""
    url = f"{action['scheme'].lower()}://127.0.0.1:{port}{action['path']}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as answer:
            return 200 <= int(answer.status) < 400
    except OSError:
        return False


async def tcp_probe(port: int, timeout_s: float) -> bool:
    """Success when a connection opens."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout_s)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def passes(probe: dict[str, Any], container: dict[str, Any], ports: dict[str, int]) -> bool:
    """Run a rendered probe; its ports (numbers or names) map to the server's through the
    container's declared ports."""
    names = {p["containerPort"]: p["name"] for p in container["ports"]}
    timeout_s = float(probe["timeoutSeconds"])
    if "grpc" in probe:
        return await grpc_probe(probe["grpc"], ports[names[probe["grpc"]["port"]]], timeout_s)
    if "httpGet" in probe:
        port = ports[probe["httpGet"]["port"]]
        return await asyncio.to_thread(http_probe, probe["httpGet"], port, timeout_s)
    return await tcp_probe(ports[probe["tcpSocket"]["port"]], timeout_s)


async def probe_all(container: dict[str, Any], ports: dict[str, int]) -> dict[str, bool]:
    return {name: await passes(container[name], container, ports) for name in PROBES}


async def start(has_metrics: bool) -> tuple[EpdServer, dict[str, int]]:
    options = ServerOptions(metrics_port=0 if has_metrics else None, drain_grace_s=10.0)
    server, port = await build_server(
        [encode_binding(ScriptedEncodeService())], options, new_registry()
    )
    ports = {"grpc": port}
    if server.metrics is not None:
        ports["metrics"] = server.metrics.port
    return server, ports


@pytest.mark.parametrize("has_metrics", [True, False], ids=["metrics", "no-metrics"])
async def test_a_draining_server_is_unready_but_alive(has_metrics: bool) -> None:
    container = encoder_container(f"metrics.enabled={str(has_metrics).lower()}")
    server, ports = await start(has_metrics)
    loading = await probe_all(container, ports)
    await server.mark_serving()
    serving = await probe_all(container, ports)
    is_settled = [False]
    server.add_drain_hold(lambda: is_settled[0])
    draining = asyncio.ensure_future(server.drain_and_stop())
    await asyncio.sleep(0.2)
    drained = await probe_all(container, ports)
    was_held = not draining.done()
    is_settled[0] = True
    await asyncio.wait_for(draining, 10.0)
    stopped = await probe_all(container, ports)
    assert loading == {"startupProbe": False, "readinessProbe": False, "livenessProbe": True}
    assert serving == dict.fromkeys(PROBES, True)
    assert was_held
    assert drained == {"startupProbe": False, "readinessProbe": False, "livenessProbe": True}
    assert stopped == dict.fromkeys(PROBES, False)
