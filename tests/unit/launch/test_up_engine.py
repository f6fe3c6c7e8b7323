"""``epd up`` passes its engine settings on to the prefill and decode workers it starts."""

from __future__ import annotations

import argparse
import os

import pytest

from epd.launch import up_cli
from epd.launch.topology import Topology
from epd.launch.up_engine import engine_settings
from epd.server.engine.engine_cli import engine_options
from epd.server.engine.vllm_process import model_cpus
from epd.server.prefill import cli as prefill_cli


def parse_up(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="epd up")
    up_cli.add_arguments(parser)
    return parser.parse_args(list(flags))


def worker_options(flags: tuple[str, ...], kv_cache_mb: int | None, device: str) -> object:
    """The VllmOptions a prefill worker started with ``flags`` builds on ``device``."""
    parser = argparse.ArgumentParser(prog="epd prefill")
    prefill_cli.add_arguments(parser)
    size = [] if kv_cache_mb is None else ["--kv-cache-mb", str(kv_cache_mb)]
    return engine_options(parser.parse_args(["--model", "/m", *size, *flags]), None, device)


@pytest.fixture(autouse=True)
def no_engine_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "EPD_DEVICE",
        "EPD_DTYPE",
        "EPD_KV_CACHE_MB",
        "EPD_GPU_MEMORY_UTILIZATION",
        "EPD_CPU_THREADS",
    ):
        monkeypatch.delenv(name, raising=False)


def test_on_cpu_engines_get_todays_cache_and_their_own_defaults() -> None:
    kv_cache_mb, flags = engine_settings(parse_up(), "cpu", num_engines=1)
    assert (kv_cache_mb, flags) == (128, ("--device", "cpu"))
    options = worker_options(flags, kv_cache_mb, "cpu")
    assert options.kv_cache_bytes == 128 << 20 and options.dtype == "float32"
    assert options.cpu_threads is None


def test_two_cpu_engines_split_the_model_threads_between_them() -> None:
    threads = max(1, model_cpus(None, kv=True)[1] // 2)
    assert model_cpus(None, kv=True)[1] <= max(1, len(os.sched_getaffinity(0)) - 1)
    kv_cache_mb, flags = engine_settings(parse_up(), "cpu", num_engines=2)
    assert flags == ("--device", "cpu", "--cpu-threads", str(threads))
    assert worker_options(flags, kv_cache_mb, "cpu").cpu_threads == threads
    _, given = engine_settings(parse_up("--cpu-threads", "5"), "cpu", num_engines=2)
    assert given == ("--device", "cpu", "--cpu-threads", "5")
    _, on_gpu = engine_settings(parse_up(), "cuda:0", num_engines=2)
    assert "--cpu-threads" not in on_gpu
    _, pinned = engine_settings(parse_up(), "cpu", num_engines=2, engines_pinned=True)
    assert "--cpu-threads" not in pinned


def test_engines_sharing_a_gpu_split_its_memory() -> None:
    kv_cache_mb, flags = engine_settings(parse_up(), "cuda:0", num_engines=2)
    assert kv_cache_mb is None
    assert flags == ("--device", "cuda", "--gpu-memory-utilization", "0.45")
    options = worker_options(flags, kv_cache_mb, "cuda:0")
    assert options.gpu_memory_utilization == 0.45 and options.kv_cache_bytes is None
    assert options.dtype == "bfloat16" and options.enforce_eager is False
    assert engine_settings(parse_up(), "cuda:0", num_engines=1) == (None, ("--device", "cuda"))


def test_given_settings_reach_every_engine() -> None:
    args = parse_up(
        "--dtype",
        "float16",
        "--kv-cache-mb",
        "64",
        "--gpu-memory-utilization",
        "0.3",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "2048",
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "1024",
        "--no-enforce-eager",
    )
    kv_cache_mb, flags = engine_settings(args, "cuda:0", num_engines=2)
    options = worker_options(flags, kv_cache_mb, "cuda:0")
    assert kv_cache_mb == 64 and options.kv_cache_bytes == 64 << 20
    assert (options.dtype, options.gpu_memory_utilization, options.tensor_parallel_size) == (
        "float16",
        0.3,
        2,
    )
    assert (options.max_model_len, options.max_num_seqs, options.max_num_batched_tokens) == (
        2048,
        8,
        1024,
    )
    assert options.enforce_eager is False
    eager = engine_settings(parse_up("--enforce-eager"), "cpu", 1)[1]
    assert eager == ("--device", "cpu", "--enforce-eager")


def test_topologies_pass_the_settings_to_their_engines() -> None:
    topology = Topology("epd", kv_cache_mb=None, engine_flags=("--device", "cuda"))
    assert topology.num_engines == 2 and topology.engine_args() == ["--device", "cuda"]
    assert Topology("e-pd").num_engines == 1
    assert Topology("e-pd", kv_cache_mb=64).engine_args() == ["--kv-cache-mb", "64"]


def test_cuda_asked_where_there_is_none_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert up_cli.run(parse_up("--device", "cuda")) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_the_cpu_kv_cache_of_epd_up_is_a_named_launcher_choice() -> None:
    """``epd up`` runs several engines on one machine: each gets LAUNCHER_CPU_KV_CACHE_MB on
    CPU, its own named choice (Topology's default too), not `epd prefill`'s CPU default."""
    from epd.launch.topology import LAUNCHER_CPU_KV_CACHE_MB
    from epd.server.engine.device import CPU_KV_CACHE_MB, DEFAULTS

    kv_cache_mb, _ = engine_settings(parse_up(), "cpu", num_engines=2)
    assert kv_cache_mb == LAUNCHER_CPU_KV_CACHE_MB == Topology().kv_cache_mb
    assert DEFAULTS["cpu"].kv_cache_mb == CPU_KV_CACHE_MB != LAUNCHER_CPU_KV_CACHE_MB
    parser = argparse.ArgumentParser(prog="epd up")
    up_cli.add_arguments(parser)
    help_text = " ".join(parser.format_help().split())
    assert f"default {LAUNCHER_CPU_KV_CACHE_MB} on CPU" in help_text
    assert f"`epd prefill` alone takes {CPU_KV_CACHE_MB}" in help_text
