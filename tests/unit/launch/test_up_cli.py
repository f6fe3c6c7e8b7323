"""``epd up`` flags that are checked before anything starts: a usage error, never a traceback."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import constants

from epd.common.config_file import config_arguments
from epd.launch import topology_cli, up_cli
from epd.launch.topology import Topology
from tests.hub_cache import place_in_hub_cache


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="epd up")
    up_cli.add_arguments(parser)
    return parser.parse_args(list(flags))


def test_negative_restarts_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert up_cli.run(parse("--max-restarts", "-1", "--model", "nowhere")) == 2
    assert "--max-restarts must be 0 or more" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--cpus", "router=0"), "this deployment has no service 'router'"),
        (("--cpus", "route=0-x"), "CPU list '0-x'"),
        (("--cpus", "route=4095"), "which this process may not use"),
        (("--cpu-layout", "split", "--encoders", "64"), "--cpu-layout split needs at least"),
    ],
)
def test_cpus_that_cannot_be_had_are_a_usage_error(
    flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert up_cli.run(parse(*flags, "--model", "nowhere", "--device", "cpu")) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("size", ["-1", "64MiB"])
def test_a_bad_span_file_cap_is_a_usage_error(size: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--trace-max-mb", size)
    assert exit_info.value.code == 2


def test_the_span_file_cap_is_64_mib_unless_its_variable_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse().trace_max_mb == 64
    monkeypatch.setenv("EPD_TRACE_FILE_MAX_MB", "8")
    assert parse().trace_max_mb == 8


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--encoder-devices", "cuda"), "cuda asked for, but CUDA is not available here"),
        (("--encoder-devices", "cpu,tpu"), "encoder device 'tpu'"),
        (("--encoders", "2", "--encoder-devices", "cpu,cpu,cpu"), "--encoders 2 but"),
        (("--topology", "epd1", "--encoder-devices", "cpu"), "starts no encoder"),
    ],
)
def test_encoder_devices_that_cannot_be_met_are_a_usage_error(
    flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert up_cli.run(parse(*flags, "--model", "nowhere", "--device", "cpu")) == 2
    assert message in capsys.readouterr().err


def test_encoders_follow_the_accelerator_of_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a (fake) GPU and 16 CPUs, encoders on auto or cuda are accelerator services (a few
    CPUs for their loop and preprocessing) and a CPU encoder is CPU-bound, with engines on CPU."""
    monkeypatch.setattr(up_cli, "cuda_device_index", lambda: 0)
    monkeypatch.setattr(up_cli, "allowed_cpus", lambda: list(range(16)))
    args = parse("--topology", "e-pd", "--encoder-devices", "auto,cuda,cpu", "--device", "cpu")
    topology_cli.check_encoder_devices(list(args.encoder_devices), lambda: 0)
    topology = Topology("e-pd", devices=args.encoder_devices)
    plan = up_cli.cpu_plan(args, topology)
    assert len(plan["encode0"]) == len(plan["encode1"]) == 2
    assert len(plan["encode2"]) > 2 and len(plan["prefill"]) > 2
    without_gpu = Topology("e-pd")
    monkeypatch.setattr(up_cli, "cuda_device_index", lambda: None)
    assert len(up_cli.cpu_plan(parse("--cpu-layout", "split"), without_gpu)["encode0"]) > 2


def test_a_hub_id_is_resolved_once_and_its_directory_handed_on(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The services get the snapshot directory (no hub look-up of their own) and the hub id as
    --model-id, the name the demo request and clients use."""
    cache = tmp_path / "hub"
    snapshot = place_in_hub_cache(tiny_model_dir, cache, "epd-test/tiny", commit="d" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    handed_on: list[tuple[Path, str]] = []

    async def up(args: argparse.Namespace, deployment: up_cli.Deployment) -> int:
        handed_on.append((args.model, args.model_id))
        return 0

    monkeypatch.setattr(up_cli, "_up", up)
    flags = ("--model", "epd-test/tiny", "--device", "cpu", "--run-dir", str(tmp_path / "run"))
    assert up_cli.run(parse(*flags)) == 0
    assert handed_on == [(snapshot, "epd-test/tiny")]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--prefill-workers", "0"), "argument --prefill-workers: expected at least 1, got 0"),
        (("--decode-workers", "two"), "argument --decode-workers: expected a whole number"),
    ],
)
def test_replica_counts_below_one_are_a_usage_error(
    flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(*flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("topology", ["e-pd", "epd1", "dual-encoder"])
def test_decode_workers_without_a_decode_side_are_a_usage_error(
    topology: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ("--topology", topology, "--decode-workers", "2", "--engine", "transformers")
    assert up_cli.run(parse(*flags, "--model", "nowhere", "--device", "cpu")) == 2
    err = capsys.readouterr().err
    assert f"topology {topology} starts no decode worker" in err and "Traceback" not in err


def test_replicas_that_overflow_the_fixed_ports_are_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ("--base-port", "40000", "--prefill-workers", "6", "--decode-workers", "6")
    assert up_cli.run(parse(*flags, "--model", "nowhere", "--device", "cpu")) == 2
    assert "decode5 and route metrics would share a port" in capsys.readouterr().err


def test_replica_counts_default_to_one_each() -> None:
    assert (parse().prefill_workers, parse().decode_workers) == (1, 1)
    args = parse("--prefill-workers", "3", "--decode-workers", "2")
    assert topology_cli.topology_of(args).num_engines == 5


def test_each_replica_is_a_service_of_the_cpu_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 CPUs, no GPU, E/P/D with 2 prefill and 2 decode workers split: every engine replica
    gets CPUs of its own, and --cpus pins a replica by its name."""
    monkeypatch.setattr(up_cli, "cuda_device_index", lambda: None)
    monkeypatch.setattr(up_cli, "xpu_available", lambda: False)
    monkeypatch.setattr(up_cli, "allowed_cpus", lambda: list(range(16)))
    args = parse("--prefill-workers", "2", "--decode-workers", "2", "--cpu-layout", "split")
    plan = up_cli.cpu_plan(args, topology_cli.topology_of(args))
    engines = ["prefill", "prefill1", "decode", "decode1"]
    assert all(len(plan[name]) >= 2 for name in [*engines, "encode0"])
    pinned = [cpu for name in [*engines, "encode0"] for cpu in plan[name]]
    assert len(pinned) == len(set(pinned))
    args = parse("--prefill-workers", "2", "--cpus", "prefill1=12-15", "--cpu-layout", "split")
    plan = up_cli.cpu_plan(args, topology_cli.topology_of(args))
    assert plan["prefill1"] == [12, 13, 14, 15] and not set(plan["prefill"]) & {12, 13, 14, 15}


def test_replica_counts_come_from_a_config_file() -> None:
    parser = argparse.ArgumentParser(prog="epd up")
    up_cli.add_arguments(parser)
    document = {"prefill-workers": 2, "up": {"decode-workers": 3}}

    def arguments(environ: dict[str, str]) -> list[str]:
        return config_arguments(
            document, "up", parser, commands=["up"], environ=environ, is_flag_elsewhere=bool
        )

    assert arguments({}) == ["--prefill-workers=2", "--decode-workers=3"]


def test_the_scheduler_policy_has_the_schedulers_flag_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--default-policy``, as ``epd scheduler`` names it; ``--policy`` is its deprecated alias,
    hidden from --help."""
    assert parse().default_policy == Topology().policy == "adaptive"
    assert topology_cli.topology_of(parse("--default-policy", "per_image")).policy == "per_image"
    assert parse("--policy", "per_request").default_policy == "per_request"
    assert "--policy is deprecated: use --default-policy" in capsys.readouterr().err
    parser = argparse.ArgumentParser(prog="epd up")
    up_cli.add_arguments(parser)
    assert "--default-policy" in parser.format_help()
    assert "--policy " not in parser.format_help() and "--policy\n" not in parser.format_help()
    with pytest.raises(SystemExit):
        parse("--policy", "fastest")


def test_a_tiny_model_an_older_epd_built_is_built_again(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded default is rebuilt when its builder changed since (an older build may lack
    e.g. the chat template's video clause), and reused while it has not."""
    from epd.server.models.tiny import build

    default = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, default)
    monkeypatch.setattr(up_cli, "DEFAULT_MODEL", default)
    built: list[Path] = []
    monkeypatch.setattr(build, "build_tiny_model", lambda out: built.append(Path(out)))
    flags = ("--device", "cpu", "--run-dir", str(tmp_path / "run"))
    args = parse(*flags)
    up_cli._resolve_model(args)
    assert built == [] and Path(args.model) == default
    manifest = default / build.MANIFEST
    stale = json.loads(manifest.read_text()) | {"builder_sha256": "0" * 64}
    manifest.write_text(json.dumps(stale))
    up_cli._resolve_model(parse(*flags))
    assert built == [default]


def test_a_tiny_build_is_current_only_for_its_builder_and_config(tiny_model_dir: Path) -> None:
    from epd.server.models.tiny.build import PRESETS, is_current

    assert is_current(tiny_model_dir)
    assert not is_current(tiny_model_dir, PRESETS["small"])
    assert not is_current(tiny_model_dir / "missing")
