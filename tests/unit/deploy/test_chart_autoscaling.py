"""The chart scales an encoder Deployment on the scheduler's count of encoders its kind needs:
a HorizontalPodAutoscaler on the external metric (prometheus-adapter) or a KEDA ScaledObject on
the Prometheus query, each aimed at exactly its encoder's Deployment (which leaves its replicas
to it), selecting the series the scheduler exports for that kind and model, so that replicas
equal the count (AverageValue 1), within the encoder's bounds. Off by default."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epd.scheduler.metrics import register_scheduler_metrics
from epd.scheduler.model import EncodeItem, ItemOutcome
from tests.unit.deploy.chart import CHART, by_component, render
from tests.unit.deploy.test_chart_schema import KEDA
from tests.unit.scheduler.factories import create_scheduler, spec

EXAMPLE = CHART / "examples" / "gpu-cpu-encoders.yaml"
SCALED = (
    '--set-json encoders=[{"name":"cpu","device":"cpu","autoscaling":{"enabled":true,'
    '"minReplicas":2,"maxReplicas":5}},{"name":"gpu","device":"cuda:0","replicas":3}]'
)


def exported_labels() -> dict[str, str]:
    """The labels of epd_scheduler_encoders_needed as a scheduler that saw work exports it."""
    scheduler, _ = create_scheduler(spec("e0", device="cuda:1", model="m"))
    assignment = scheduler.assign_encoders([EncodeItem("h")], model="m")
    scheduler.complete_encoding(assignment.assignment_id, [ItemOutcome(0, 10.0)])
    registry = CollectorRegistry()
    register_scheduler_metrics(scheduler, registry)
    text = generate_latest(registry).decode()
    [sample] = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "epd_scheduler_encoders_needed"
    ]
    return dict(sample.labels)


def test_nothing_scales_by_default() -> None:
    kinds = {o["kind"] for o in render()}
    assert not kinds & {"HorizontalPodAutoscaler", "ScaledObject"}
    assert all("replicas" in d["spec"] for d in by_component(render(), "Deployment").values())


def test_an_hpa_scales_its_encoder_on_the_count_of_its_kind() -> None:
    objects = render(sets=(SCALED, "autoscaling.metricLabels.namespace=serving"))
    deployments = by_component(objects, "Deployment")
    [hpa] = by_component(objects, "HorizontalPodAutoscaler").values()
    spec_ = hpa["spec"]
    assert spec_["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployments["encode-cpu"]["metadata"]["name"],
    }
    assert (spec_["minReplicas"], spec_["maxReplicas"]) == (2, 5)
    assert "replicas" not in deployments["encode-cpu"]["spec"]
    assert deployments["encode-gpu"]["spec"]["replicas"] == 3
    [metric] = spec_["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    selected = metric["external"]["metric"]
    assert selected["name"] == "epd_scheduler_encoders_needed"
    labels = selected["selector"]["matchLabels"]
    assert labels == {"device": "cpu", "model": "tiny", "namespace": "serving"}
    assert set(exported_labels()) <= set(labels)
    assert (
        spec_["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
        > (spec_["behavior"]["scaleUp"]["stabilizationWindowSeconds"])
    )


def test_keda_queries_the_same_series() -> None:
    objects = render(sets=(SCALED, *KEDA))
    assert "HorizontalPodAutoscaler" not in {o["kind"] for o in objects}
    [scaled] = by_component(objects, "ScaledObject").values()
    spec_: dict[str, Any] = scaled["spec"]
    deployment = by_component(objects, "Deployment")["encode-cpu"]
    assert spec_["scaleTargetRef"] == {"name": deployment["metadata"]["name"]}
    assert (spec_["minReplicaCount"], spec_["maxReplicaCount"]) == (2, 5)
    [trigger] = spec_["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"] == {
        "serverAddress": "http://prometheus:9090",
        "query": 'max(epd_scheduler_encoders_needed{device="cpu",model="tiny"})',
        "threshold": "1",
    }
    behavior = spec_["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert set(behavior) == {"scaleUp", "scaleDown"}


@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_the_example_scales_each_kind_of_encoder(name: str) -> None:
    objects = render(EXAMPLE)
    hpas = by_component(objects, "HorizontalPodAutoscaler")
    labels = hpas[f"encode-{name}"]["spec"]["metrics"][0]["external"]["metric"]["selector"]
    kind = {"cpu": "cpu", "gpu": "cuda"}[name]
    assert labels["matchLabels"] == {"device": kind, "model": "qwen2-vl-7b", "namespace": "serving"}
    assert {component for component in by_component(objects, "ServiceMonitor")} >= {"scheduler"}
