"""The embedding store in the chart: with store.enabled, the Mooncake master runs as one more
Deployment (one replica, replaced with Recreate) and Service, listening where its Service says,
the segment holder as another Deployment lending store.segmentMb, and every encoder joins the
store with epd encode's store flags, lending no segment; without it, none of them exists."""

from __future__ import annotations

from tests.unit.deploy.chart import by_component, only_container, render, workloads

STORE = ("store.enabled=true", "store.segmentMb=64")


def encoder_args() -> list[str]:
    objects = render(sets=STORE)
    (encoder,) = [w for w in workloads(objects) if only_container(w)["command"][-1] == "encode"]
    return [str(arg) for arg in only_container(encoder)["args"]]


def test_the_master_is_one_deployment_and_a_service_the_encoders_name() -> None:
    objects = render(sets=STORE)
    master = by_component(objects, "Deployment")["store-master"]
    service = by_component(objects, "Service")["store-master"]
    assert master["spec"]["replicas"] == 1 and master["spec"]["strategy"]["type"] == "Recreate"
    container = only_container(master)
    assert container["command"] == ["mooncake_master"]
    assert "--rpc_port=50090" in container["args"]
    assert "--http_metadata_server_port=50091" in container["args"]
    ports = {port["name"]: port["port"] for port in service["spec"]["ports"]}
    assert ports == {"rpc": 50090, "metadata": 50091}
    args = encoder_args()
    name = service["metadata"]["name"]
    assert args[args.index("--embedding-store") + 1] == "mooncake"
    assert args[args.index("--store-master") + 1] == f"{name}:50090"
    assert args[args.index("--store-metadata-server") + 1] == f"http://{name}:50091/metadata"
    assert args[args.index("--store-segment-mb") + 1] == "0"


def test_the_holder_lends_the_segment_to_the_master_its_service_names() -> None:
    objects = render(sets=STORE)
    holder = by_component(objects, "Deployment")["store-holder"]
    name = by_component(objects, "Service")["store-master"]["metadata"]["name"]
    assert holder["spec"]["replicas"] == 1 and holder["spec"]["strategy"]["type"] == "Recreate"
    container = only_container(holder)
    assert container["command"] == ["epd", "store-holder"]
    args = [str(arg) for arg in container["args"]]
    assert args[args.index("--store-master") + 1] == f"{name}:50090"
    assert args[args.index("--store-metadata-server") + 1] == f"http://{name}:50091/metadata"
    assert args[args.index("--store-segment-mb") + 1] == "64"
    assert container["ports"][0] == {"name": "grpc", "containerPort": 50093, "protocol": "TCP"}


def test_without_the_store_there_is_no_master_and_no_store_flag() -> None:
    objects = render()
    assert "store-master" not in by_component(objects, "Deployment")
    assert "store-master" not in by_component(objects, "Service")
    assert "store-holder" not in by_component(objects, "Deployment")
    for workload in workloads(objects):
        assert "--embedding-store" not in only_container(workload)["args"]
