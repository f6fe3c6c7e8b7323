"""The chart lints, and every object it renders (default values and each example) is valid
against the Kubernetes API schemas, unknown fields refused, on the oldest Kubernetes the chart
accepts and the newest the validator knows."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from tests.unit.deploy.chart import CHART, EXAMPLES, component, helm, render, workloads

OLDEST_KUBERNETES = "1.27"  # Chart.yaml's kubeVersion: gRPC probes are GA from 1.27
VALUES = [None, *EXAMPLES]


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem if v else "default")
def test_the_chart_lints(values: Path | None) -> None:
    helm("lint", "--strict", str(CHART), *(["--values", str(values)] if values else []))


@pytest.mark.parametrize("kubernetes", [OLDEST_KUBERNETES, latest_version()])
@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem if v else "default")
def test_every_rendered_object_is_valid_kubernetes(values: Path | None, kubernetes: str) -> None:
    objects = render(*([values] if values else []))
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, kubernetes, strict=True)


def test_the_validator_refuses_what_kubernetes_refuses() -> None:
    [deployment] = [o for o in workloads(render()) if component(o) == "scheduler"]
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["grpc"]["port"] = "grpc"  # NOTE: a gRPC probe takes a number, never a port's name
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, latest_version(), strict=True)
