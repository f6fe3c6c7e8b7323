"""What vLLM reads from the environment while an engine is created: on CPU the model runs in the
EngineCore process with the threads vLLM's own worker would have had; KV engines name their NIXL
handshake listener."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from epd.common.cpus import allowed_cpus
from epd.server.engine.vllm_inputs import SideChannel
from epd.server.engine.vllm_options import VllmOptions
from epd.server.engine.vllm_process import (
    default_cpu_threads,
    engine_environment,
    model_cpus,
    vllm_bound_cpus,
)


def test_cpu_engines_run_the_model_in_the_engine_core_with_every_cpu_but_one() -> None:
    environ = engine_environment(VllmOptions(device="cpu"), Path("/r"))
    assert environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert environ["OMP_NUM_THREADS"] == str(default_cpu_threads())
    assert default_cpu_threads() == max(1, len(os.sched_getaffinity(0)) - 1)
    assert environ["VLLM_RPC_BASE_PATH"] == "/r"
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in environ


def test_cpu_threads_given_are_the_models_threads() -> None:
    environ = engine_environment(VllmOptions(device="cpu", cpu_threads=6), Path("/r"))
    assert environ["OMP_NUM_THREADS"] == "6"


def test_cuda_engines_keep_vllms_layout() -> None:
    environ = engine_environment(VllmOptions(device="cuda:0"), Path("/r"))
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in environ and "OMP_NUM_THREADS" not in environ


def test_kv_engines_name_their_handshake_listener() -> None:
    options = VllmOptions(kv_role="kv_producer", side_channel=SideChannel("10.0.0.2", 5601))
    environ = engine_environment(options, Path("/r"))
    assert environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.2"
    assert environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"


def test_the_threads_chosen_for_the_model_are_its_threads() -> None:
    environ = engine_environment(VllmOptions(device="cpu", cpu_threads=2), Path("/r"), 3)
    assert environ["OMP_NUM_THREADS"] == "3"


def test_an_engine_given_its_threads_keeps_its_services_cpus() -> None:
    assert model_cpus(1, kv=False) == (allowed_cpus(), 1)


def test_the_cpus_named_in_vllms_binding_variable_are_the_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = allowed_cpus()[0]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", str(first))
    assert vllm_bound_cpus(kv=False) == ([first], False)
    assert model_cpus(None, kv=False) == ([first], 1)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    assert vllm_bound_cpus(kv=False) == ([], False)
    assert model_cpus(None, kv=False) == (allowed_cpus(), default_cpu_threads())


def test_vllms_automatic_binding_counts_one_thread_per_physical_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    for kv in (False, True):
        bound, automatic = vllm_bound_cpus(kv=kv)
        assert automatic and bound and set(bound) <= set(allowed_cpus())
        threads = min(len(bound), default_cpu_threads())
        assert model_cpus(None, kv=kv) == (allowed_cpus(), threads)
        if platform.machine() in ("x86_64", "AMD64"):  # NOTE: vLLM keeps SMT threads elsewhere
            assert len({_physical_core(cpu) for cpu in bound}) == len(bound), bound
    if len({_physical_core(cpu) for cpu in allowed_cpus()}) > 1:
        assert len(vllm_bound_cpus(kv=False)[0]) < len(allowed_cpus())  # one left to the rest


def _physical_core(cpu: int) -> tuple[str, str]:
    topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    package = (topology / "physical_package_id").read_text().strip()
    return package, (topology / "core_id").read_text().strip()
