"""What the chart promises per role: one workload and one Service each, gRPC health probes on
the port the server listens on (startup and readiness), GPUs asked for where a role has them,
one replica of the scheduler replaced with Recreate, and shared memory scoped as configured."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.deploy.chart import (
    CHART,
    EXAMPLES,
    by_component,
    environment,
    only_container,
    render,
)

CPU_VALUES = CHART / "examples" / "cpu.yaml"
GPU_ONLY_VALUES = CHART / "examples" / "gpu.yaml"
GPU_VALUES = CHART / "examples" / "gpu-cpu-encoders.yaml"
NODE_SHM_VALUES = CHART / "examples" / "e-pd-node-shm.yaml"
E_P_D = {"scheduler", "route", "encode-cpu", "prefill", "decode"}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (None, E_P_D),
        (CPU_VALUES, E_P_D),
        (GPU_ONLY_VALUES, E_P_D - {"encode-cpu"} | {"encode-gpu"}),
        (GPU_VALUES, E_P_D | {"encode-gpu"}),
        (NODE_SHM_VALUES, E_P_D - {"decode"}),
    ],
    ids=["default", "cpu", "gpu", "gpu-cpu-encoders", "e-pd-node-shm"],
)
def test_each_role_has_a_workload_with_grpc_probes_and_a_service(
    values: Any, expected: set[str]
) -> None:
    objects = render(*([values] if values else []))
    deployments = by_component(objects, "Deployment")
    services = by_component(objects, "Service")
    assert set(deployments) == expected
    assert set(services) == expected
    for name, deployment in deployments.items():
        container = only_container(deployment)
        grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
        if name == "route" and values == CPU_VALUES:
            continue  # NOTE: a route serving TLS is probed on HTTPS (test_chart_hardening)
        for probe in ("startupProbe", "readinessProbe"):
            assert container[probe]["grpc"] == {"port": grpc_port}, (name, probe)
        service = services[name]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items(), name
        assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
        assert {"name": "grpc", "targetPort": "grpc"}.items() <= service["spec"]["ports"][0].items()
        headless = service["spec"].get("clusterIP") == "None"
        assert headless == (name not in ("scheduler", "route")), name


def test_encode_prefill_hands_kv_to_decode_workers_only_with_kv_transfer() -> None:
    plain = by_component(render(sets=("prefill.mode=encode_prefill",)), "Deployment")
    handing = by_component(
        render(sets=("prefill.mode=encode_prefill", "prefill.kvTransfer=true")), "Deployment"
    )
    assert "decode" not in plain and "decode" in handing
    assert "--kv-transfer" in only_container(handing["prefill"])["args"]


def test_gpu_roles_ask_for_gpus_and_gpu_nodes() -> None:
    deployments = by_component(render(GPU_VALUES), "Deployment")
    for name in ("encode-gpu", "prefill", "decode"):
        pod = deployments[name]["spec"]["template"]["spec"]
        resources = only_container(deployments[name])["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == 1, name
        assert resources["limits"]["nvidia.com/gpu"] == 1, name
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}, name
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu", name
    for name in ("scheduler", "route", "encode-cpu"):
        resources = only_container(deployments[name]).get("resources", {})
        assert "nvidia.com/gpu" not in {
            **resources.get("requests", {}),
            **resources.get("limits", {}),
        }
        assert "nodeSelector" not in deployments[name]["spec"]["template"]["spec"], name


def test_one_scheduler_replaced_never_beside_another() -> None:
    scheduler = by_component(render(sets=("route.replicas=3",)), "Deployment")["scheduler"]
    assert scheduler["spec"]["replicas"] == 1
    assert scheduler["spec"]["strategy"] == {"type": "Recreate"}


def test_shared_memory_is_per_pod_by_default() -> None:
    objects = render()
    for name, deployment in by_component(objects, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        env = environment(objects, only_container(deployment))
        if name == "scheduler":
            assert {v["name"] for v in pod["volumes"]} == {"tmp", "home"}  # scratch only
            assert "EPD_HOST_ID" not in env
            continue
        assert "hostPID" not in pod, name
        [dshm] = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert dshm["emptyDir"]["medium"] == "Memory", name
        assert env["EPD_HOST_ID"] == "demo-epd-prefill-7d9f-x2", name  # the pod's name


def test_node_scope_shares_the_nodes_shared_memory_and_process_ids() -> None:
    objects = render(NODE_SHM_VALUES)
    for name, deployment in by_component(objects, "Deployment").items():
        if name == "scheduler":
            continue
        pod = deployment["spec"]["template"]["spec"]
        [dshm] = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert dshm["hostPath"]["path"] == "/dev/shm", name
        assert pod["hostPID"] is True, name
        assert environment(objects, only_container(deployment))["EPD_HOST_ID"] == "gpu-node-3"


def test_pods_roll_when_the_config_changes() -> None:
    def checksums(*sets: str) -> set[str]:
        return {
            d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for d in by_component(render(sets=sets), "Deployment").values()
        }

    [before] = checksums()
    [after] = checksums("config.EPD_LOG_LEVEL=DEBUG")
    assert before != after


def test_metrics_ports_are_declared_and_annotated_only_when_enabled() -> None:
    for enabled in (True, False):
        objects = render(sets=(f"metrics.enabled={str(enabled).lower()}",))
        for name, deployment in by_component(objects, "Deployment").items():
            container = only_container(deployment)
            annotations = deployment["spec"]["template"]["metadata"]["annotations"]
            has_port = any(p["name"] == "metrics" for p in container["ports"])
            assert has_port == enabled, name
            assert ("EPD_METRICS_PORT" in environment(objects, container)) == enabled, name
            assert (annotations.get("prometheus.io/scrape") == "true") == enabled, name


def test_examples_are_all_rendered_here() -> None:
    assert set(EXAMPLES) == {CPU_VALUES, GPU_ONLY_VALUES, GPU_VALUES, NODE_SHM_VALUES}
