"""The chart lints, and every object it renders (default values, each example and each optional
feature) is valid against the Kubernetes API schemas, unknown fields refused, on the oldest
Kubernetes the chart accepts and the newest the validator knows. Bad values are refused by
values.schema.json (or, where a schema cannot tell, by the templates) before anything renders.
A volume of two sources, which Kubernetes refuses and its OpenAPI schemas cannot express, is
checked here too.

The Prometheus Operator's ServiceMonitor and PodMonitor are custom resources, which
kubernetes_validate has no schema for; no maintained PyPI package ships their CRD schema (the
one that models them, cloudcoil-models-prometheus-operator, ships generated pydantic classes
that need the cloudcoil runtime), so none is vendored: they are the only kinds skipped here, and
test_chart_hardening checks what they select and scrape. KEDA's ScaledObject is one too (KEDA
publishes its CRDs in its Helm chart, not on PyPI): test_chart_autoscaling checks what it scales
and queries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from tests.unit.deploy.chart import (
    CHART,
    EXAMPLES,
    RELEASE,
    component,
    helm,
    helm_refusal,
    pod_spec,
    render,
    value_args,
    workloads,
)

OLDEST_KUBERNETES = "1.27"  # Chart.yaml's kubeVersion: gRPC probes are GA from 1.27
VALUES = [None, *EXAMPLES]
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}
AUTOSCALED = '--set-json encoders=[{"name":"cpu","device":"cpu","autoscaling":{"enabled":true}}]'
KEDA = ("autoscaling.kind=keda", "autoscaling.keda.serverAddress=http://prometheus:9090")
HUB = ("model.source=hub", "model.hub.repo=Qwen/Qwen2-VL-2B-Instruct")
# Optional features with the default values: each renders objects or fields the examples may not.
FEATURES = {
    "service-monitor": ("metrics.monitor.kind=ServiceMonitor",),
    "pod-monitor": ("metrics.monitor.kind=PodMonitor", "route.tls.secretName=route-tls"),
    "route-tls": ("route.tls.secretName=route-tls",),
    "hub": (*HUB, "model.hub.revision=v1.0", "model.hub.tokenSecret.name=hf"),
    "no-metrics": ("metrics.enabled=false",),
    "no-budgets": ("podDisruptionBudget.enabled=false",),
    "budget-min": (
        "podDisruptionBudget.maxUnavailable=null",
        "podDisruptionBudget.minAvailable=50%",
    ),
    "e-pd": ("prefill.mode=prefill_decode",),
    "autoscaling-hpa": (AUTOSCALED,),
    "autoscaling-keda": (AUTOSCALED, *KEDA),
    "embedding-store": ("store.enabled=true",),
}
# Values values.schema.json refuses, and the path of the value its error names.
REFUSED = {
    "unknown top-level key": (("replica=2",), "additional properties 'replica'"),
    "unknown role key": (("decode.replica=2",), "additional properties 'replica'"),
    "encoder device": (("encoders[0].device=tpu",), "/encoders/0/device"),
    "encoder name": (("encoders[0].name=CPU_1",), "/encoders/0/name"),
    "encoder name too long for a Service": (
        ("encoders[0].name=a-sixteen-chars0",),
        "/encoders/0/name",
    ),
    "prefill mode": (("prefill.mode=prefil",), "/prefill/mode"),
    "negative replicas": (("route.replicas=-1",), "/route/replicas"),
    "metrics port": (("metrics.port=70000",), "/metrics/port"),
    "user by name": (("--set-string securityContext.runAsUser=epd",), "/securityContext/runAsUser"),
    "memory quantity": (
        ("prefill.resources.limits.memory=lots",),
        "/prefill/resources/limits/memory",
    ),
    "hub without id": (("model.source=hub",), "/model/hub"),
    "hub id form": (("model.source=hub", "model.hub.repo=no-org"), "/model/hub/repo"),
    "monitor kind": (("metrics.monitor.kind=Probe",), "/metrics/monitor/kind"),
    "monitor without metrics": (
        ("metrics.monitor.kind=PodMonitor", "metrics.enabled=false"),
        "/metrics/enabled",
    ),
    "budget with both bounds": (("podDisruptionBudget.minAvailable=1",), "/podDisruptionBudget"),
    "shared memory scope": (("sharedMemory.scope=cluster",), "/sharedMemory/scope"),
    "autoscaling kind": (("autoscaling.kind=vpa",), "/autoscaling/kind"),
    "autoscaling to no encoder": (
        ('--set-json encoders=[{"name":"cpu","autoscaling":{"minReplicas":0}}]',),
        "/encoders/0/autoscaling/minReplicas",
    ),
    "keda address": (("autoscaling.keda.serverAddress=prometheus:9090",), "/autoscaling/keda"),
    "store segment": (("store.segmentMb=0",), "/store/segmentMb"),
    "store port": (("ports.storeMaster=0",), "/ports/storeMaster"),
    "two volume sources": (
        ("model.volume.persistentVolumeClaim.claimName=models", "model.volume.nfs.path=/models"),
        "/model/volume",
    ),
}
# Values the schema cannot judge, refused by the templates with a message naming the value.
REFUSED_BY_TEMPLATES = {
    "two encoders of one name": (
        ('--set-json encoders=[{"name":"cpu"},{"name":"cpu","device":"cuda"}]',),
        'two entries are named "cpu"',
    ),
    "an autoscaled encoder on auto": (
        ('--set-json encoders=[{"name":"any","device":"auto","autoscaling":{"enabled":true}}]',),
        "name its device",
    ),
    "autoscaling bounds upside down": (
        (
            '--set-json encoders=[{"name":"cpu","device":"cpu","autoscaling":'
            '{"enabled":true,"minReplicas":3,"maxReplicas":2}}]',
        ),
        "maxReplicas 2 below minReplicas 3",
    ),
    "keda without its prometheus": (
        (AUTOSCALED, "autoscaling.kind=keda"),
        "autoscaling.keda.serverAddress",
    ),
}


def validate(objects: list[dict[str, Any]], kubernetes: str) -> None:
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(obj, kubernetes, strict=True)


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem if v else "default")
def test_the_chart_lints(values: Path | None) -> None:
    helm("lint", "--strict", str(CHART), *(["--values", str(values)] if values else []))


@pytest.mark.parametrize("kubernetes", [OLDEST_KUBERNETES, latest_version()])
@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem if v else "default")
def test_every_rendered_object_is_valid_kubernetes(values: Path | None, kubernetes: str) -> None:
    objects = render(*([values] if values else []))
    assert objects
    validate(objects, kubernetes)


@pytest.mark.parametrize("kubernetes", [OLDEST_KUBERNETES, latest_version()])
@pytest.mark.parametrize("sets", FEATURES.values(), ids=FEATURES.keys())
def test_every_feature_renders_valid_kubernetes(sets: tuple[str, ...], kubernetes: str) -> None:
    validate(render(sets=sets), kubernetes)


def test_only_the_monitors_and_scaled_objects_skip_the_kubernetes_schemas() -> None:
    """The custom kinds rendered are exactly the monitors asked for, one per workload, and a
    ScaledObject per autoscaled encoder with KEDA."""
    scaled = [
        o for o in render(sets=(AUTOSCALED, *KEDA)) if (o["apiVersion"], o["kind"]) in CUSTOM_KINDS
    ]
    assert [(o["kind"], component(o)) for o in scaled] == [("ScaledObject", "encode-cpu")]
    for kind in ("ServiceMonitor", "PodMonitor"):
        objects = render(sets=(f"metrics.monitor.kind={kind}",))
        custom = [o for o in objects if (o["apiVersion"], o["kind"]) in CUSTOM_KINDS]
        assert {o["kind"] for o in custom} == {kind}
        assert sorted(map(component, custom)) == sorted(map(component, workloads(objects)))
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(custom[0], latest_version(), strict=True)
    assert not [o for o in render() if (o["apiVersion"], o["kind"]) in CUSTOM_KINDS]


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.stem if v else "default")
def test_every_volume_has_one_source(values: Path | None) -> None:
    """Kubernetes refuses a volume of two sources; its OpenAPI schema (so the validator) can't."""
    for workload in workloads(render(*([values] if values else []))):
        for volume in pod_spec(workload)["volumes"]:
            assert len(set(volume) - {"name"}) == 1, (component(workload), volume)


def test_the_validator_refuses_what_kubernetes_refuses() -> None:
    [deployment] = [o for o in workloads(render()) if component(o) == "scheduler"]
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["grpc"]["port"] = "grpc"  # NOTE: a gRPC probe takes a number, never a port's name
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, latest_version(), strict=True)


@pytest.mark.parametrize(("sets", "names"), REFUSED.values(), ids=REFUSED.keys())
def test_the_schema_refuses_bad_values(sets: tuple[str, ...], names: str) -> None:
    args = value_args((), sets)
    for command in (["template", RELEASE], ["lint", "--strict"]):
        error = helm_refusal(*command, str(CHART), *args)
        assert "don't meet the specifications of the schema" in error, error
        assert names in error, error


@pytest.mark.parametrize(
    ("sets", "message"), REFUSED_BY_TEMPLATES.values(), ids=REFUSED_BY_TEMPLATES.keys()
)
def test_the_templates_refuse_what_the_schema_cannot(sets: tuple[str, ...], message: str) -> None:
    error = helm_refusal("template", RELEASE, str(CHART), *value_args((), sets))
    assert message in error, error
