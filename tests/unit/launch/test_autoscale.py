"""``epd up --encoders MIN:MAX``: the range, the slots and groups it lays out, each group's
decisions (windows, hysteresis, bounds) and the flags that reach the scheduler."""

from __future__ import annotations

import argparse

import pytest

from epd.launch import up_cli
from epd.launch.autoscale_cli import encoder_kind, scaling_groups, scheduler_flags
from epd.launch.encoders import EncoderGroup, EncoderRange, encoder_range
from epd.launch.scaling import GroupScaler, ScalingOptions
from epd.launch.topology import Topology, check_ports


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    up_cli.add_arguments(parser)
    return parser.parse_args(list(flags))


def test_encoders_take_a_count_or_a_range() -> None:
    assert encoder_range("2") == EncoderRange(2, 2) and not EncoderRange(2, 2).scales
    assert encoder_range("1:3") == EncoderRange(1, 3) and EncoderRange(1, 3).scales
    assert str(EncoderRange(1, 3)) == "1:3" and str(EncoderRange(2, 2)) == "2"
    for bad in ("0", "3:1", "0:2", "one", "1:x"):
        with pytest.raises(ValueError):
            encoder_range(bad)
    assert parse().encoders == EncoderRange(1, 1)
    assert parse("--encoders", "1:3").encoders == EncoderRange(1, 3)
    with pytest.raises(SystemExit):
        parse("--encoders", "3:1")


def test_a_range_lays_out_a_slot_for_every_encoder_it_may_run() -> None:
    topology = Topology("e-pd", num_encoders=EncoderRange(1, 3))
    assert topology.scales_encoders
    assert topology.encoder_devices == ["auto"] * 3
    assert topology.encoder_groups == [EncoderGroup("auto", (0, 1, 2), 1, 3)]
    assert topology.initial_encoders == [0]
    assert [s.name for s in topology.services(False)][-3:] == ["encode0", "encode1", "encode2"]
    per_device = Topology(
        "e-pd", num_encoders=EncoderRange(2, 3), devices=("cuda", "cpu"), encoder_threads=(0, 4)
    )
    assert per_device.encoder_devices == ["cuda"] * 3 + ["cpu"] * 3
    assert per_device.initial_encoders == [0, 1, 3, 4]
    assert per_device.encoder_args(5) == ["--device", "cpu", "--threads", "4"]
    assert per_device.encoder_args(1) == ["--device", "cuda"]


def test_fixed_counts_keep_one_encoder_per_group() -> None:
    topology = Topology("e-pd", num_encoders=EncoderRange(2, 2))
    assert not topology.scales_encoders
    assert topology.initial_encoders == [0, 1]
    assert [g.slots for g in topology.encoder_groups] == [(0,), (1,)]
    assert not Topology("epd1", num_encoders=EncoderRange(1, 3)).scales_encoders


def test_the_launchers_metrics_port_is_counted_among_the_fixed_ports() -> None:
    scaled = Topology("e-pd", num_encoders=EncoderRange(1, 6))
    assert ("launcher metrics", 40) in scaled.port_offsets(True)
    check_ports(scaled, True)
    with pytest.raises(ValueError, match="would share a port"):
        check_ports(Topology("e-pd", num_encoders=EncoderRange(1, 7)), True)


def test_each_group_follows_its_kind_once() -> None:
    both = Topology("e-pd", num_encoders=EncoderRange(1, 2), devices=("cuda:0", "cpu"))
    assert [g.kind for g in scaling_groups(both, accelerator="cuda")] == ["cuda", "cpu"]
    assert encoder_kind("auto", None) == "cpu" and encoder_kind("xpu:1", None) == "xpu"
    dual = Topology("dual-encoder", num_encoders=EncoderRange(1, 2))
    with pytest.raises(ValueError, match="name one kind twice"):
        scaling_groups(dual, accelerator=None)  # NOTE: auto is the CPU on a CPU-only machine
    assert [g.kind for g in scaling_groups(dual, accelerator="cuda")] == ["cuda", "cpu"]


def test_a_group_moves_only_after_its_window() -> None:
    scaler = GroupScaler(1, 3, up_after_s=10, down_after_s=30)
    assert [scaler.decide(t, 1, 3) for t in (0, 5, 9.9)] == [0, 0, 0]
    assert scaler.decide(10, 1, 3) == 1
    assert scaler.decide(11, 2, 3) == 0  # NOTE: the window starts again after a change
    assert scaler.decide(21, 2, 3) == 1
    assert scaler.decide(22, 3, 9) == 0  # at the maximum
    assert [scaler.decide(t, 3, 0) for t in (30, 59.9)] == [0, 0]
    assert scaler.decide(60, 3, 0) == -1
    assert scaler.decide(200, 1, 0) == 0  # at the minimum


def test_a_count_that_flaps_never_moves_the_group() -> None:
    scaler = GroupScaler(1, 3, up_after_s=3, down_after_s=3)
    decisions = [scaler.decide(t, 2, 3 if t % 2 else 1) for t in range(100)]
    assert decisions == [0] * 100
    assert scaler.decide(100, 2, 2) == 0


def test_the_signal_settings_reach_the_scheduler() -> None:
    args = parse("--encode-wait-target-s", "0.1", "--demand-smoothing-s", "3")
    assert scheduler_flags(args) == ("--encode-wait-target-s", "0.1", "--demand-smoothing-s", "3.0")
    assert scheduler_flags(parse()) == ()
    defaults = parse()
    assert (defaults.scale_up_after_s, defaults.scale_down_after_s) == (
        ScalingOptions().scale_up_after_s,
        ScalingOptions().scale_down_after_s,
    )
    with pytest.raises(ValueError):
        ScalingOptions(scale_interval_s=0)
