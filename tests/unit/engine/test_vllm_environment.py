"""What vLLM reads from the environment while an engine is created: on CPU the model runs in the
EngineCore process with the threads vLLM's own worker would have had; KV engines name their NIXL
handshake listener."""

from __future__ import annotations

import os
from pathlib import Path

from epd.server.engine.vllm_engine import VllmOptions
from epd.server.engine.vllm_inputs import SideChannel
from epd.server.engine.vllm_process import default_cpu_threads, engine_environment


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
