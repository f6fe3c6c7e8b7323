"""The Helm chart under deploy/helm/epd, rendered offline with the helm binary that
scripts/install.sh puts beside the venv's python, and what a container of it would see."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "epd"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
HELM = Path(sys.executable).parent / "helm"
RELEASE = "demo"
NAMESPACE = "serving"
# What the downward API gives a pod, for reading a container's environment as it would run.
POD = {
    "status.podIP": "10.20.30.40",
    "metadata.name": "demo-epd-prefill-7d9f-x2",
    "spec.nodeName": "gpu-node-3",
}
SECRET_VALUE = "s3cret"
WORKLOAD_KINDS = ("Deployment", "StatefulSet")
# Kubernetes quantity suffixes (resource.Quantity): binary, decimal SI, none.
QUANTITY_SUFFIXES = {
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate(("k", "M", "G", "T", "P", "E"))},
    **{"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1)},
}


def helm(*args: str) -> str:
    """Run the helm binary; its stdout. AssertionError with its stderr when it fails."""
    assert HELM.exists(), f"{HELM} is missing: scripts/install.sh installs helm"
    done = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr}"
    return done.stdout


def helm_refusal(*args: str) -> str:
    """Run the helm binary where it must fail; what it said (lint reports on stdout).
    AssertionError when it succeeds."""
    assert HELM.exists(), f"{HELM} is missing: scripts/install.sh installs helm"
    done = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, f"helm {' '.join(args)} succeeded:\n{done.stdout[:2000]}"
    return done.stdout + done.stderr


def value_args(values_files: tuple[Path, ...], sets: tuple[str, ...]) -> list[str]:
    """helm's --values and --set arguments (``--set-string NAME=VALUE`` passes through)."""
    args = [arg for path in values_files for arg in ("--values", str(path))]
    for assignment in sets:
        flag, _, rest = assignment.partition(" ")
        args += [flag, rest] if flag.startswith("--set") else ["--set", assignment]
    return args


def render(*values_files: Path, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every object ``helm template`` renders with these values files and --set values."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    return [doc for doc in yaml.safe_load_all(helm(*args, *value_args(values_files, sets))) if doc]


def quantity(value: str | int | float) -> Decimal:
    """A Kubernetes quantity ("500m", "2Gi", 4) as a number."""
    text = str(value)
    number = text.rstrip("".join({c for s in QUANTITY_SUFFIXES for c in s}))
    return Decimal(number) * QUANTITY_SUFFIXES[text[len(number) :]]


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def only_container(workload: dict[str, Any]) -> dict[str, Any]:
    [container] = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return dict(workload["spec"]["template"]["spec"])


def by_component(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The objects of one kind by their component; AssertionError when two share one."""
    found: dict[str, dict[str, Any]] = {}
    for obj in objects:
        if obj["kind"] == kind:
            assert component(obj) not in found, f"two {kind}s for {component(obj)}"
            found[component(obj)] = obj
    return found


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a matchLabels selector selects an object with these labels."""
    return selector.items() <= labels.items()


def config_map(objects: list[dict[str, Any]], name: str) -> dict[str, str]:
    [found] = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
    return dict(found.get("data", {}))


def environment(objects: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as Kubernetes builds it: envFrom ConfigMaps, then env
    (downward API fields from POD, secrets as SECRET_VALUE)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_map(objects, source["configMapRef"]["name"]))
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        elif "fieldRef" in entry["valueFrom"]:
            env[entry["name"]] = POD[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            assert "secretKeyRef" in entry["valueFrom"], entry
            env[entry["name"]] = SECRET_VALUE
    return env
