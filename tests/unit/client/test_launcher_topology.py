"""What ``epd up`` starts for each topology, and where."""

from __future__ import annotations

from pathlib import Path

import pytest

from epd.client.launcher import PREFILL_MODES, TOPOLOGIES, Deployment, Topology


@pytest.mark.parametrize(
    ("name", "devices", "has_decode", "mode"),
    [
        ("epd", ["cpu", "cpu"], True, "prefill"),
        ("e-pd", ["cpu", "cpu"], False, "prefill_decode"),
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
        "cpu",
    ]


@pytest.mark.parametrize("threads", [(1, 1, 1), (-1,)])
def test_encoder_threads_that_do_not_fit_are_refused(threads: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        Topology("dual-encoder", encoder_threads=threads)
    with pytest.raises(ValueError):
        Topology("epd1", encoder_threads=(1,))
