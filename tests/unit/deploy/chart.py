"""The Helm chart under deploy/helm/epd, rendered offline with the helm binary that
scripts/install.sh puts beside the venv's python, and what a container of it would see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "epd"
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
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


def helm(*args: str) -> str:
    """Run the helm binary; its stdout. AssertionError with its stderr when it fails."""
    assert HELM.exists(), f"{HELM} is missing: scripts/install.sh installs helm"
    done = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr}"
    return done.stdout


def render(*values_files: Path, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every object ``helm template`` renders with these values files and --set values."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for path in values_files:
        args += ["--values", str(path)]
    for assignment in sets:
        args += ["--set", assignment]
    return [doc for doc in yaml.safe_load_all(helm(*args)) if doc]


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


def only_container(workload: dict[str, Any]) -> dict[str, Any]:
    [container] = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


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
