"""scripts/gpu_wheels.sh carries every runtime dependency a lent GPU machine lacks."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# What the lent machine's image holds (../shared/GPU.md, "What the machine lacks"), with what
# its transformers and torchvision ran on there (session 17).
ON_THE_GPU_IMAGE = {
    "torch",
    "torchvision",
    "numpy",
    "pillow",
    "aiohttp",
    "prometheus-client",
    "psutil",
    "pytest",
    "hypothesis",
    "huggingface-hub",
    "tokenizers",
    "safetensors",
    "pyyaml",
}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_runtime_dependency_is_on_the_gpu_image_or_carried() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {
        normal(re.split(r"[<>=!~ ;\[]", spec, maxsplit=1)[0]) for spec in project["dependencies"]
    }
    script = (ROOT / "scripts" / "gpu_wheels.sh").read_text()
    names = re.search(r"^NAMES=\((.*?)^\)", script, re.MULTILINE | re.DOTALL)
    assert names, "gpu_wheels.sh lists its wheels in NAMES=( ... )"
    carried = {normal(name) for name in names[1].split()}
    assert needed - carried - ON_THE_GPU_IMAGE == set()
