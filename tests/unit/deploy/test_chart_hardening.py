"""What the chart does for production, for the default values and every example: restricted
pods whose writes all land on volumes, requests and limits on every container, liveness apart
from readiness, a PodDisruptionBudget per role selecting exactly its pods, the metrics port on
every Service and monitors that scrape it, the route's TLS from a Secret, and a hub id model
with its token from a Secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from epd.common.server_cli import server_options
from tests.unit.deploy.chart import (
    EXAMPLES,
    NAMESPACE,
    by_component,
    component,
    environment,
    only_container,
    pod_spec,
    quantity,
    render,
    selects,
    workloads,
)
from tests.unit.deploy.commands import parse_container

VALUES = [None, *EXAMPLES]
# Pod Security `restricted`: the volume types it admits (no hostPath), and no host namespaces.
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
HOST_NAMESPACES = {"hostPID", "hostIPC", "hostNetwork"}
CLAIM = '--set-json model.volume={"persistentVolumeClaim":{"claimName":"epd-models"}}'


def values_id(values: Path | None) -> str:
    return values.stem if values else "default"


TLS = ("route.tls.secretName=route-tls",)
HUB = (
    "model.source=hub",
    "model.hub.repo=Qwen/Qwen2-VL-2B-Instruct",
    "model.hub.revision=v1.0",
    "model.hub.tokenSecret.name=hf",
    "model.hub.tokenSecret.key=read-token",
)


def rendered(values: Path | None, *sets: str) -> list[dict[str, Any]]:
    return render(*([values] if values else []), sets=sets)


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_every_pod_and_container_runs_restricted(values: Path | None) -> None:
    """Pod Security `restricted`, and a numeric user (a name cannot be checked as non-root)."""
    for workload in workloads(rendered(values)):
        name, pod, container = component(workload), pod_spec(workload), only_container(workload)
        for context in (pod["securityContext"], container["securityContext"]):
            assert context["runAsNonRoot"] is True, name
            assert isinstance(context["runAsUser"], int) and context["runAsUser"] > 0, name
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"] == {"drop": ["ALL"]}, name
        assert security["readOnlyRootFilesystem"] is True, name
        assert "privileged" not in security, name


@pytest.mark.parametrize(
    ("values", "sets"),
    [(None, (CLAIM,)), (None, ("model.source=hub", "model.hub.repo=Qwen/Qwen2-VL-2B-Instruct"))]
    + [(v, ()) for v in EXAMPLES if v.stem != "e-pd-node-shm"],
    ids=["claim", "hub", *[v.stem for v in EXAMPLES if v.stem != "e-pd-node-shm"]],
)
def test_pods_with_a_claimed_or_hub_model_are_admitted_as_restricted(
    values: Path | None, sets: tuple[str, ...]
) -> None:
    """Beside the security contexts: only the volume types `restricted` admits (the default
    hostPath model directory and node-scoped shared memory are not) and no host namespaces."""
    for workload in workloads(rendered(values, *sets)):
        pod = pod_spec(workload)
        assert not HOST_NAMESPACES & pod.keys(), component(workload)
        for volume in pod["volumes"]:
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, (component(workload), volume)
        assert all("hostPort" not in p for p in only_container(workload)["ports"])


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_what_the_processes_write_is_on_writable_volumes(
    values: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root filesystem is read-only: temporary files, the user's caches (home), shared
    memory and a hub cache are volumes mounted writable; the model directory read-only."""
    objects = rendered(values)
    for workload in workloads(objects):
        name, container = component(workload), only_container(workload)
        by_path = mounts(container)
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        for path in ("/tmp", "/home/epd"):
            assert "readOnly" not in by_path[path], (name, path)
            assert "emptyDir" in volumes[by_path[path]["name"]], (name, path)
        if name == "scheduler":
            continue
        assert "readOnly" not in by_path["/dev/shm"], name
        env = environment(objects, container)
        if "HF_HOME" in env:
            assert "readOnly" not in by_path[env["HF_HOME"]], name
        else:
            model = parse_container(container, env, monkeypatch).model
            [model_mount] = [m for p, m in by_path.items() if model.startswith(p + "/")]
            assert model_mount["readOnly"] is True, name


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_every_container_requests_and_limits_cpu_and_memory(values: Path | None) -> None:
    for workload in workloads(rendered(values)):
        resources = only_container(workload)["resources"]
        for resource in ("cpu", "memory"):
            request = quantity(resources["requests"][resource])
            limit = quantity(resources["limits"][resource])
            assert 0 < request <= limit, (component(workload), resource)


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_liveness_is_not_readiness(values: Path | None) -> None:
    """Readiness (and startup) ask the health service, which a drain turns NOT_SERVING;
    liveness asks what stays up through a drain (test_chart_drain runs both against a server)."""
    for workload in workloads(rendered(values)):
        container = only_container(workload)
        ready, alive = container["readinessProbe"], container["livenessProbe"]
        actions = {"grpc", "httpGet", "tcpSocket", "exec"}
        assert ready.keys() & actions == container["startupProbe"].keys() & actions
        assert {k: ready[k] for k in ready.keys() & actions} != {
            k: alive[k] for k in alive.keys() & actions
        }, component(workload)
        assert "grpc" not in alive, component(workload)


def test_liveness_opens_the_grpc_port_when_metrics_are_off() -> None:
    for workload in workloads(render(sets=("metrics.enabled=false",))):
        container = only_container(workload)
        assert container["livenessProbe"]["tcpSocket"] == {"port": "grpc"}, component(workload)
        assert "grpc" in container["readinessProbe"], component(workload)


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_a_budget_per_role_selects_exactly_its_pods(values: Path | None) -> None:
    objects = rendered(values)
    deployments = by_component(objects, "Deployment")
    budgets = by_component(objects, "PodDisruptionBudget")
    assert budgets.keys() == deployments.keys()
    for name, budget in budgets.items():
        selector = budget["spec"]["selector"]["matchLabels"]
        chosen = [
            other
            for other, deployment in deployments.items()
            if selects(selector, deployment["spec"]["template"]["metadata"]["labels"])
        ]
        assert chosen == [name]
        assert len(budget["spec"].keys() & {"minAvailable", "maxUnavailable"}) == 1, name


def test_a_role_budget_overrides_the_charts() -> None:
    objects = render(
        sets=("encoders[0].name=cpu", "encoders[0].podDisruptionBudget.minAvailable=2")
    )
    budgets = by_component(objects, "PodDisruptionBudget")
    assert budgets["encode-cpu"]["spec"]["minAvailable"] == 2
    assert "maxUnavailable" not in budgets["encode-cpu"]["spec"]
    assert budgets["prefill"]["spec"]["maxUnavailable"] == 1
    off = render(
        sets=("podDisruptionBudget.enabled=false", "prefill.podDisruptionBudget.enabled=true")
    )
    assert set(by_component(off, "PodDisruptionBudget")) == {"prefill"}


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_every_service_exposes_the_port_the_metrics_flag_opens(
    values: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = rendered(values)
    deployments = by_component(objects, "Deployment")
    for name, service in by_component(objects, "Service").items():
        [port] = [p for p in service["spec"]["ports"] if p["name"] == "metrics"]
        container = only_container(deployments[name])
        env = environment(objects, container)
        opened = server_options(parse_container(container, env, monkeypatch)).metrics_port
        [target] = [p for p in container["ports"] if p["name"] == port["targetPort"]]
        assert port["port"] == target["containerPort"] == opened, name


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_monitors_scrape_every_roles_metrics_port(kind: str) -> None:
    objects = render(sets=(f"metrics.monitor.kind={kind}", "metrics.monitor.labels.release=prom"))
    deployments = by_component(objects, "Deployment")
    services = by_component(objects, "Service")
    monitors = by_component(objects, kind)
    assert monitors.keys() == deployments.keys()
    for name, monitor in monitors.items():
        spec = monitor["spec"]
        assert monitor["metadata"]["labels"]["release"] == "prom", name
        assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}, name
        selector = spec["selector"]["matchLabels"]
        if kind == "ServiceMonitor":
            labels = {other: s["metadata"]["labels"] for other, s in services.items()}
            names = {p["name"] for p in services[name]["spec"]["ports"]}
            [endpoint] = spec["endpoints"]
        else:
            labels = {
                o: d["spec"]["template"]["metadata"]["labels"] for o, d in deployments.items()
            }
            names = {p["name"] for p in only_container(deployments[name])["ports"]}
            [endpoint] = spec["podMetricsEndpoints"]
        assert [other for other in labels if selects(selector, labels[other])] == [name]
        assert endpoint["port"] == "metrics" and "metrics" in names, name
        assert endpoint["path"] == "/metrics" and "scheme" not in endpoint, name


def test_the_route_serves_tls_from_its_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    tls_config = '--set-json metrics.monitor.routeTlsConfig={"serverName":"epd-route"}'
    objects = render(sets=(*TLS, "metrics.monitor.kind=ServiceMonitor", tls_config))
    route = by_component(objects, "Deployment")["route"]
    container = only_container(route)
    options = server_options(
        parse_container(container, environment(objects, container), monkeypatch)
    )
    [volume] = [v for v in pod_spec(route)["volumes"] if "secret" in v]
    assert volume["secret"] == {"secretName": "route-tls"}
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert options.tls.cert_file == f"{mount['mountPath']}/tls.crt"
    assert options.tls.key_file == f"{mount['mountPath']}/tls.key"
    for probe in ("startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTPS"}
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert route["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    [endpoint] = by_component(objects, "ServiceMonitor")["route"]["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"serverName": "epd-route"}
    for name, deployment in by_component(objects, "Deployment").items():
        if name != "route":
            assert "--tls-cert" not in only_container(deployment)["args"], name


def test_a_hub_model_is_fetched_with_the_token_from_its_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = render(sets=HUB)
    for name, deployment in by_component(objects, "Deployment").items():
        container = only_container(deployment)
        env = environment(objects, container)
        entries = {e["name"]: e for e in container["env"]}
        if name == "scheduler":
            assert not {"HF_HOME", "HF_TOKEN"} & env.keys()
            continue
        args = parse_container(container, env, monkeypatch)
        assert (args.model, args.revision) == ("Qwen/Qwen2-VL-2B-Instruct", "v1.0"), name
        secret = entries["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert secret == {"name": "hf", "key": "read-token"}, name
        assert "/models" not in mounts(container), name
        assert "model" not in {v["name"] for v in pod_spec(deployment)["volumes"]}, name
        assert env["HF_HOME"] in mounts(container), name


def test_the_longest_names_the_schema_admits_are_valid_service_names() -> None:
    """A 40-character release part (fullname's cap) and a 15-character encoder name (the
    schema's cap) make Service names of at most 63 characters, a DNS label."""
    objects = render(sets=(f"fullnameOverride={'r' * 45}", "encoders[0].name=" + "e" * 15))
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "Service"]
    assert max(map(len, names)) == 63
