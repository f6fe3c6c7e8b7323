"""What ``epd up`` starts for each topology, and where."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from epd.launch.encoders import EncoderRange
from epd.launch.launcher import Deployment, start_topology
from epd.launch.topology import PREFILL_MODES, TOPOLOGIES, Topology, check_ports
from tests.unit.launch.test_public_entry import Unstarted, flag


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
    topology = Topology(name, num_encoders=EncoderRange(2, 2))
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
    assert Topology("e-pd", num_encoders=EncoderRange(2, 2), encoder_threads=(1,)).encoder_args(
        1
    ) == [
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


def test_replicas_get_names_worker_ids_and_the_port_block_after_http() -> None:
    workers = Topology("epd", num_prefill=3, num_decode=2).engine_workers
    assert [(w.name, w.worker_id, w.command, w.offset) for w in workers] == [
        ("prefill", "prefill0", "prefill", 2),
        ("prefill1", "prefill1", "prefill", 11),
        ("prefill2", "prefill2", "prefill", 12),
        ("decode", "decode0", "decode", 3),
        ("decode1", "decode1", "decode", 13),
    ]
    assert Topology("epd", num_prefill=3, num_decode=2).num_engines == 5
    assert [w.name for w in Topology("epd1", num_prefill=2).engine_workers] == [
        "prefill",
        "prefill1",
    ]


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_no_two_ports_meet_for_any_combination_that_fits(name: str) -> None:
    """Every count of encoders and replicas that ``check_ports`` lets through has distinct
    ports (with and without metrics), and the first one that does not fit is refused."""
    num_decodes = range(1, 11) if Topology(name).has_decode else [1]
    for num_encoders, num_prefill, num_decode in itertools.product(
        range(1, 8), range(1, 11), num_decodes
    ):
        count = EncoderRange(num_encoders, num_encoders)
        topology = Topology(
            name, num_encoders=count, num_prefill=num_prefill, num_decode=num_decode
        )
        for metrics in (True, False):
            offsets = [offset for _, offset in topology.port_offsets(metrics)]
            fits = len(topology.encoder_devices) <= 6 and num_prefill + num_decode <= 11
            is_distinct = len(offsets) == len(set(offsets))
            assert (is_distinct == fits) if metrics else (is_distinct or not fits)
            if is_distinct:
                check_ports(topology, metrics)
            else:
                with pytest.raises(ValueError, match="would share a port"):
                    check_ports(topology, metrics)


def test_a_decode_worker_count_needs_a_decode_side() -> None:
    with pytest.raises(ValueError, match="starts no decode worker"):
        Topology("e-pd", num_decode=2)
    with pytest.raises(ValueError, match="at least 1"):
        Topology("epd", num_prefill=0)


def test_every_replica_is_started_with_its_worker_id_port_and_cpus(tmp_path: Path) -> None:
    topology = Topology("epd", num_prefill=2, num_decode=2, cpus=(("decode1", "3"),))
    deployment = Unstarted(tmp_path, {}, base_port=41000)
    asyncio.run(start_topology(deployment, tmp_path, "tiny", topology))
    children = {child.name: child for child in deployment.children}
    assert set(children) == {"scheduler", "route", "prefill", "prefill1", "decode"} | {
        "decode1",
        "encode0",
    }
    for name, worker_id, port in [
        ("prefill", "prefill0", 41002),
        ("prefill1", "prefill1", 41011),
        ("decode", "decode0", 41003),
        ("decode1", "decode1", 41012),
    ]:
        command = children[name].command
        assert flag(command, "--worker-id") == worker_id and children[name].port == port
        assert command[3] == name.rstrip("1") and children[name].log.name == f"{name}.log"
    assert flag(children["prefill1"].command, "--mode") == "prefill"
    assert flag(children["decode1"].command, "--cpus") == "3"
    assert "--cpus" not in children["decode"].command
