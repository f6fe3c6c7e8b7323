"""epd up's CPU layout: disjoint sets per CPU-bound service when the CPUs allow it, sharing
otherwise, hand pins honoured, and clear errors."""

from __future__ import annotations

import pytest

from epd.launch.cpu_layout import Service, describe, lay_out, parse_pins
from epd.launch.topology import Topology

E_P_D = Topology("epd").services(accelerator=False)
NAMES = [service.name for service in E_P_D]


def cpus(n: int) -> list[int]:
    return list(range(n))


def test_split_gives_the_front_one_cpu_in_eight_and_each_engine_and_encoder_its_own() -> None:
    assert lay_out(E_P_D, cpus(16), "split", {}) == {
        "scheduler": [0, 1],
        "route": [0, 1],
        "prefill": [2, 3, 4, 5, 6],
        "decode": [7, 8, 9, 10, 11],
        "encode0": [12, 13, 14, 15],
    }


def test_services_on_the_accelerator_get_two_cpus_and_cpu_encoders_the_rest() -> None:
    dual = Topology("dual-encoder").services(accelerator=True)
    plan = lay_out(dual, cpus(16), "split", {})
    assert plan["scheduler"] == plan["route"] == [0, 1]
    assert len(plan["prefill"]) == len(plan["encode0"]) == 2
    assert plan["encode1"] == list(range(6, 16))


def test_auto_shares_when_a_cpu_bound_service_would_get_one_cpu() -> None:
    assert lay_out(E_P_D, cpus(2), "auto", {}) == {}
    assert lay_out(E_P_D, cpus(6), "auto", {}) == {}
    assert lay_out(E_P_D, cpus(7), "auto", {})["encode0"] == [5, 6]


def test_split_that_cannot_be_met_is_refused_with_the_way_out() -> None:
    way_out = r"needs at least 2 CPUs for each of 3 .*\(use --cpu-layout shared\)"
    with pytest.raises(ValueError, match=way_out):
        lay_out(E_P_D, cpus(4), "split", {})


def test_shared_pins_nothing_and_hand_pins_take_their_cpus_from_the_others() -> None:
    assert lay_out(E_P_D, cpus(16), "shared", {}) == {}
    plan = lay_out(E_P_D, cpus(4), "shared", {"prefill": [3]})
    assert plan["prefill"] == [3]
    assert all(plan[name] == [0, 1, 2] for name in NAMES if name != "prefill")


def test_hand_pins_win_over_the_split_of_the_rest() -> None:
    plan = lay_out(E_P_D, cpus(16), "auto", {"encode0": [12, 13, 14, 15]})
    assert plan["encode0"] == [12, 13, 14, 15]
    assert not set(plan["prefill"]) & {12, 13, 14, 15}
    assert not set(plan["decode"]) & {12, 13, 14, 15}


def test_pins_outside_the_allowed_cpus_or_taking_them_all_are_refused() -> None:
    with pytest.raises(ValueError, match="names CPUs 9, which this process may not use"):
        lay_out(E_P_D, cpus(4), "auto", {"prefill": [9]})
    with pytest.raises(ValueError, match="none is left for scheduler, route, decode"):
        lay_out(E_P_D, cpus(2), "auto", {"prefill": [0, 1], "encode0": [0]})


def test_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown CPU layout 'packed'"):
        lay_out(E_P_D, cpus(4), "packed", {})


def test_pin_flags_are_parsed_and_checked_against_the_deployment() -> None:
    assert parse_pins(["prefill=0-3", "route=4"], NAMES) == {"prefill": [0, 1, 2, 3], "route": [4]}
    with pytest.raises(ValueError, match="no service 'encode1'; it starts scheduler, route"):
        parse_pins(["encode1=0"], NAMES)
    with pytest.raises(ValueError, match="expected NAME=LIST"):
        parse_pins(["prefill"], NAMES)
    with pytest.raises(ValueError, match="names 'route' twice"):
        parse_pins(["route=0", "route=1"], NAMES)
    with pytest.raises(ValueError, match="CPU list"):
        parse_pins(["route=x"], NAMES)


def test_the_plan_is_described_by_cpu_list() -> None:
    assert describe({}) == "every service on every CPU"
    plan = {"scheduler": [0], "route": [0], "prefill": [1, 2, 3]}
    assert describe(plan) == "scheduler+route on 0; prefill on 1-3"


def test_topology_passes_each_pinned_service_its_list() -> None:
    topology = Topology("e-pd", cpus=(("prefill", "2-5"),))
    assert topology.cpu_args("prefill") == ["--cpus", "2-5"]
    assert topology.cpu_args("route") == []
    assert Topology("e-pd").with_cpus({"prefill": [2, 3, 4, 5]}).cpus == topology.cpus
    assert [s.name for s in topology.services(accelerator=False)] == [
        "scheduler",
        "route",
        "prefill",
        "encode0",
    ]
    assert Service("prefill", True) in Topology("e-pd").services(accelerator=True)
