"""The package a user installs: the wheel built from this checkout goes into a fresh virtual
environment with pip's own sources (nothing of this checkout or its venv on the path, and no
vLLM: it is an extra) and ``epd up --config FILE`` in it answers with the reference tokens. The
same deployment shows three things more (one deployment instead of four, for the suite's time):
- where vLLM is not installed the prefill worker falls back to the transformers engine on its
  own (``--engine auto``);
- one YAML file starts the deployment, each service reading the keys it has a flag for and its
  own section of the file;
- the model is given by hub id: its services get the snapshot from the hub cache (offline) and
  serve it under that id."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from epd.server.transfer import shm
from tests.hub_cache import place_in_hub_cache
from tests.integration.e2e.launcher import assert_demo_answered

ROOT = Path(__file__).resolve().parents[3]
QUESTION = "What is in this picture?"
REPO_ID = "epd-test/tiny-from-the-hub"


def run(
    *command: str | Path, cwd: Path, timeout: float = 600, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("EPD_")
    }
    env.update(extra_env)
    return subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def test_the_wheel_installs_into_a_fresh_venv_and_epd_up_answers(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    dist = tmp_path / "dist"
    built = run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        dist,
        ROOT,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("epd_serve-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert "epd/server/encode/app.py" in names and "epd/v1/encode_service_pb2.py" in names
    assert "epd/launch/up_cli.py" in names and "epd/client/sdk.py" in names
    assert b"Name: epd-serve" in info and b"Requires-Python: <3.14,>=3.11" in info

    venv = tmp_path / "venv"
    base_python = (
        Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    )
    assert run(base_python, "-m", "venv", venv, cwd=tmp_path).returncode == 0
    versions = [f"{name}=={metadata.version(name)}" for name in ("torch", "torchvision")]
    # NOTE: --no-compile: byte-compiling every file of torch took 30 of pip's 90 s here; the
    # processes of epd up compile what they import.
    installed = run(
        *(venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-compile", wheel),
        *versions,
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    # NOTE: as scripts/install.sh does where a CPU torch has no CPU torchvision beside it (here).
    patched = run(venv / "bin" / "python", ROOT / "scripts" / "patch_torchvision.py", cwd=tmp_path)
    assert patched.returncode == 0, patched.stdout + patched.stderr

    no_vllm = run(venv / "bin" / "python", "-c", "import vllm", cwd=tmp_path)
    assert "ModuleNotFoundError" in no_vllm.stderr, "the fallback below needs a venv without vLLM"
    config = tmp_path / "epd.yaml"
    hub = tmp_path / "hub"
    place_in_hub_cache(tiny_model_dir, hub, REPO_ID, commit="c" * 40)
    config.write_text(
        f"model: {REPO_ID}\n"
        "topology: e-pd\n"
        "max-tokens: 8\n"
        f"question: {QUESTION}\n"
        f"run-dir: {tmp_path / 'run'}\n"
        "encode:\n"
        "  log-level: DEBUG\n"
    )
    before = set(shm.orphans())
    served = run(
        venv / "bin" / "epd",
        *("up", "--config", config),
        cwd=tmp_path,
        HF_HUB_CACHE=str(hub),
        HF_HUB_OFFLINE="1",
    )
    assert served.returncode == 0, served.stdout[-2000:] + served.stderr[-2000:]
    assert_demo_answered(served.stdout, tiny_model_dir, QUESTION, max_tokens=8)
    assert "epd-encode" in served.stdout and "epd-prefill" in served.stdout
    (run_dir,) = (tmp_path / "run").iterdir()
    prefill_log, encode_log = ((run_dir / f"{n}.log").read_text() for n in ("prefill", "encode0"))
    assert "(prefill_decode, transformers)" in prefill_log
    assert " DEBUG " in encode_log and " DEBUG " not in prefill_log
    assert f"serving {REPO_ID} on" in encode_log and f"serving {REPO_ID} on" in prefill_log
    leftovers = subprocess.run(
        ["pgrep", "-f", "-m epd (scheduler|encode|prefill|route) "], capture_output=True, text=True
    )
    assert leftovers.stdout.strip() == ""
    assert set(shm.orphans()) <= before, "processes of epd up left shared memory behind"
    location = run(venv / "bin" / "python", "-c", "import epd; print(epd.__file__)", cwd=tmp_path)
    assert location.stdout.startswith(str(venv)), location.stdout
