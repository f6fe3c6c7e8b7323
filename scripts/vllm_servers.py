"""vLLM's OpenAI servers as ``bench_e2e.py`` starts them: monolithic vLLM, and vLLM's own
disaggregated-encoder split (an encode instance and a prefill+decode instance behind
``vllm_ec_proxy.py``), each a child of a ``Deployment`` so it is stopped with it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path

from epd.launch.free_ports import free_port
from epd.launch.launcher import Child, Deployment


async def start_vllm(
    deployment: Deployment, model_dir: Path, name: str = "vllm", *flags: str
) -> str:
    """Start ``vllm.entrypoints.openai.api_server`` (more ``flags`` appended) as ``name``; return
    its OpenAI base URL once healthy."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "tiny",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "4096",
        *flags,
    ]
    await start_http_child(deployment, name, port, command, {"VLLM_CPU_KVCACHE_SPACE": "1"})
    return f"http://127.0.0.1:{port}/v1"


async def start_vllm_ec(deployment: Deployment, model_dir: Path) -> str:
    """vLLM's own disaggregated-encoder split (E+PD): an encode instance and a prefill+decode
    instance sharing encoder outputs through ECExampleConnector's files, behind
    ``scripts/vllm_ec_proxy.py``; returns the proxy's base URL."""
    storage = deployment.run_dir / "ec_cache"
    storage.mkdir(exist_ok=True)

    def ec_config(role: str) -> str:
        return json.dumps(
            {
                "ec_connector": "ECExampleConnector",
                "ec_role": role,
                "ec_connector_extra_config": {"shared_storage_path": str(storage)},
            }
        )

    encoder, prefill_decode = await asyncio.gather(
        start_vllm(
            deployment,
            model_dir,
            "vllm-encode",
            "--no-enable-prefix-caching",
            "--ec-transfer-config",
            ec_config("ec_producer"),
        ),
        start_vllm(
            deployment, model_dir, "vllm-pd", "--ec-transfer-config", ec_config("ec_consumer")
        ),
    )
    port = free_port()
    proxy = [
        sys.executable,
        str(Path(__file__).with_name("vllm_ec_proxy.py")),
        "--port",
        str(port),
        "--encoder",
        encoder.removesuffix("/v1"),
        "--prefill-decode",
        prefill_decode.removesuffix("/v1"),
    ]
    await start_http_child(deployment, "vllm-ec-proxy", port, proxy, {})
    return f"http://127.0.0.1:{port}/v1"


async def start_http_child(
    deployment: Deployment, name: str, port: int, command: list[str], env: dict[str, str]
) -> None:
    """Start ``command`` as child ``name`` (output in ``run_dir/name.log``) and wait until
    ``GET /health`` on ``port`` answers 200."""
    import aiohttp

    log = deployment.run_dir / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**deployment.env, **env},
        )
    deployment.children.append(Child(name, port, process, log))
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited; see {log}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{port}/health") as reply:
                    if reply.status == 200:
                        return
            await asyncio.sleep(1)
    raise RuntimeError(f"{name} not healthy after 600 s; see {log}")
