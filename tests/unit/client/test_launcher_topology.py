"""What ``epd up`` starts for each topology, and where."""

from __future__ import annotations

from pathlib import Path

import pytest

from epd.client.launcher import PREFILL_MODES, TOPOLOGIES, Deployment, Topology


@pytest.mark.parametrize(
    ("name", "devices", "has_decode", "mode"),
    [
        ("epd", ["auto", "auto"], True, "prefill"),
        ("e-pd", ["auto", "auto"], False, "prefill_decode"),
        ("ep-d", [], True, "encode_prefill"),
        ("epd1", [], False, "encode_prefill"),
        ("dual-encoder", ["auto", "cpu"], False, "prefill_decode"),
    ],
)
def test_each_topology_starts_its_roles(name, devices, has_decode, mode) -> None:
    topology = Topology(name, num_encoders=2)
    assert topology.encoder_devices == devices
    assert topology.has_decode is has_decode
    assert PREFILL_MODES[name][1] == mode
    assert ("--kv-transfer" in PREFILL_MODES[name]) is (name == "ep-d")


def test_unknown_topology_is_refused() -> None:
    assert set(TOPOLOGIES) == set(PREFILL_MODES)
    with pytest.raises(ValueError):
        Topology("e/p/d")


def test_ports_follow_the_base_port_or_are_free(tmp_path: Path) -> None:
    assert Deployment(tmp_path, {}, base_port=40000).port(3) == 40003
    free = {Deployment(tmp_path, {}).port(0) for _ in range(3)}
    assert all(port > 0 for port in free)


def test_encoder_threads_go_to_their_encoders_in_order() -> None:
    topology = Topology("dual-encoder", encoder_threads=(2, 1))
    assert topology.encoder_args(0) == ["--device", "auto", "--threads", "2"]
    assert topology.encoder_args(1) == ["--device", "cpu", "--threads", "1"]
    assert Topology("e-pd", num_encoders=2, encoder_threads=(1,)).encoder_args(1) == [
        "--device",
        "auto",
    ]


@pytest.mark.parametrize("threads", [(1, 1, 1), (-1,)])
def test_encoder_threads_that_do_not_fit_are_refused(threads: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        Topology("dual-encoder", encoder_threads=threads)
    with pytest.raises(ValueError):
        Topology("epd1", encoder_threads=(1,))


def test_encoders_go_where_their_devices_say_and_count_by_them() -> None:
    topology = Topology("e-pd", devices=("cuda", "cuda:1", "cpu"))
    assert topology.encoder_devices == ["cuda", "cuda:1", "cpu"]
    assert [topology.encoder_args(i) for i in range(3)] == [
        ["--device", "cuda"],
        ["--device", "cuda:1"],
        ["--device", "cpu"],
    ]
    assert Topology("dual-encoder", devices=("cpu", "cpu")).encoder_devices == ["cpu", "cpu"]


@pytest.mark.parametrize(
    ("name", "devices"), [("e-pd", ("gpu",)), ("e-pd", ("cuda:x",)), ("epd1", ("cpu",))]
)
def test_encoder_devices_that_cannot_be_met_are_refused(name, devices) -> None:
    with pytest.raises(ValueError):
        Topology(name, devices=devices)


def test_encoders_on_the_accelerator_get_no_cpus_of_their_own() -> None:
    """On a machine with an accelerator, encoders on auto or on the GPU are not CPU-bound
    services; a CPU encoder is, and engines follow their own device."""
    topology = Topology("e-pd", devices=("auto", "cuda", "cpu"))
    on_gpu = {s.name: s.on_accelerator for s in topology.services(True, False)}
    assert on_gpu == {
        "scheduler": False,
        "route": False,
        "prefill": False,
        "encode0": True,
        "encode1": True,
        "encode2": False,
    }
    without = {s.name: s.on_accelerator for s in Topology("e-pd").services(False)}
    assert without["encode0"] is False and without["prefill"] is False
