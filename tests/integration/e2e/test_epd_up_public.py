"""``epd up --host 0.0.0.0 --auth-token --tls-cert --tls-key``: the route listens on every
interface with the token and the certificate, answers the launcher's demo request over TLS, and
its HTTPS port wants the token; the other services stay plaintext on loopback."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.grpc.common.servicers import self_signed_cert
from tests.integration.e2e.launcher import stop

TOKEN = "s3cret-token"


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp*) listening on TCP ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def get(url: str, cert: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context(cafile=cert)
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), context=context, timeout=30
        ) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as e:
        return e.code


def wait_for(log: Path, text: str, launcher: subprocess.Popen[bytes], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while text not in (output := log.read_text(errors="replace")):
        if launcher.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} from epd up:\n{output[-3000:]}")
        time.sleep(1)
    return output


def test_the_route_is_reachable_with_token_and_tls_and_the_rest_stays_on_loopback(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cert, key = self_signed_cert(tmp_path, "localhost")
    endpoints_file = tmp_path / "endpoints.json"
    # NOTE: a client CA that does not exist: a service that took it would fail to start.
    env = {**os.environ, "EPD_TLS_CLIENT_CA": str(tmp_path / "missing.pem")}
    flags = ["--host", "0.0.0.0", "--auth-token", TOKEN, "--tls-cert", cert, "--tls-key", key]
    command = [
        *(sys.executable, "-m", "epd", "up", "--model", str(tiny_model_dir), "--model-id", "tiny"),
        *("--topology", "e-pd", "--engine", "transformers", "--max-tokens", "8"),
        *("--keep", "--endpoints-file", str(endpoints_file), "--run-dir", str(tmp_path / "run")),
        *flags,
    ]
    log = tmp_path / "launcher.log"
    with open(log, "wb") as out:
        launcher = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        output = wait_for(log, "running; route at", launcher, 300)
        assert "(tokens [" in output and "request failed" not in output, output[-3000:]
        assert (
            f"--tls-ca-file {Path(cert).resolve()} --auth-token TOKEN" in output
            and TOKEN not in output
        )
        endpoints = json.loads(endpoints_file.read_text())
        route_port = int(endpoints["route"].rpartition(":")[2])
        http_port = int(endpoints["http"].removesuffix("/v1").rpartition(":")[2])
        assert endpoints["http"].startswith("https://")
        route_addresses = listening_addresses(route_port)  # gRPC may take 0.0.0.0 as [::]
        assert route_addresses and route_addresses <= {"00000000", "0" * 32}
        scheduler_port = int(endpoints["scheduler"].rpartition(":")[2])
        scheduler_addresses = listening_addresses(scheduler_port)  # 127.0.0.1, maybe v6-mapped
        assert scheduler_addresses and all(a.endswith("0100007F") for a in scheduler_addresses)
        models = f"https://localhost:{http_port}/v1/models"
        assert get(models, cert) == 401
        assert get(models, cert, TOKEN) == 200
    finally:
        stop(launcher)
