"""Engine flags, their defaults on each device, and what reaches vLLM's engine arguments.

CUDA is simulated by the injectable device finder; no test here needs a GPU or starts an engine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from epd.server.decode import cli as decode_cli
from epd.server.engine.device import resolve_device
from epd.server.engine.engine_cli import engine_options, transformers_options
from epd.server.prefill import cli as prefill_cli

MiB = 1 << 20
ENGINE_VARIABLES = (
    "EPD_DEVICE",
    "EPD_DTYPE",
    "EPD_MAX_MODEL_LEN",
    "EPD_KV_CACHE_MB",
    "EPD_GPU_MEMORY_UTILIZATION",
    "EPD_TENSOR_PARALLEL_SIZE",
    "EPD_MAX_NUM_SEQS",
    "EPD_MAX_NUM_BATCHED_TOKENS",
    "EPD_ENFORCE_EAGER",
    "EPD_CPU_THREADS",
)


@pytest.fixture(autouse=True)
def no_engine_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENGINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def parse(*flags: str, command: str = "prefill") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"epd {command}")
    (prefill_cli if command == "prefill" else decode_cli).add_arguments(parser)
    return parser.parse_args(["--model", "/m", *flags])


def no_cuda() -> int | None:
    return None


def first_cuda() -> int | None:
    return 0


def test_auto_is_cuda_where_usable_and_registered_with_its_index() -> None:
    assert resolve_device("auto", no_cuda) == "cpu"
    assert resolve_device("auto", first_cuda) == "cuda:0"
    assert resolve_device("cuda", first_cuda) == "cuda:0"
    assert resolve_device("cpu", first_cuda) == "cpu"
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda", no_cuda)
    with pytest.raises(ValueError, match="auto, cpu, cuda"):
        resolve_device("tpu", first_cuda)


@pytest.mark.parametrize("command", ["prefill", "decode"])
def test_every_engine_knob_is_in_help_with_its_variable(command: str) -> None:
    parser = argparse.ArgumentParser(prog=f"epd {command}")
    (prefill_cli if command == "prefill" else decode_cli).add_arguments(parser)
    text = " ".join(parser.format_help().split())
    for flag in (
        "--device",
        "--dtype",
        "--gpu-memory-utilization",
        "--tensor-parallel-size",
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--enforce-eager",
        "--no-enforce-eager",
        "--kv-cache-mb",
        "--cpu-threads",
    ):
        assert flag in text, flag
    for variable in ENGINE_VARIABLES:
        assert f"env {variable}" in text, variable
    assert "bfloat16 on CUDA, float32 on CPU" in text
    assert "EPD_MAX_MODEL_LEN; default: the model's own context" in text


def test_cpu_defaults_are_todays_settings() -> None:
    options = engine_options(parse(), "kv_producer", resolve_device("auto", no_cuda))
    assert options.device == "cpu" and options.dtype == "float32"
    assert options.enforce_eager is True and options.kv_cache_bytes == 256 * MiB
    assert options.max_model_len is None, "the model's own, which the engine resolves"
    assert options.tensor_parallel_size == 1
    assert options.max_num_seqs is None and options.max_num_batched_tokens is None
    assert options.kv_role == "kv_producer"


def test_cuda_defaults_are_bfloat16_compiled_and_a_cache_sized_by_utilization() -> None:
    options = engine_options(parse(), None, resolve_device("auto", first_cuda))
    assert options.device == "cuda:0" and options.dtype == "bfloat16"
    assert options.enforce_eager is False and options.kv_cache_bytes is None
    assert options.gpu_memory_utilization == 0.92


def test_flags_override_the_device_defaults() -> None:
    args = parse(
        "--dtype",
        "float16",
        "--enforce-eager",
        "--kv-cache-mb",
        "512",
        "--gpu-memory-utilization",
        "0.4",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "16",
        "--max-num-batched-tokens",
        "2048",
        "--cpu-threads",
        "6",
        command="decode",
    )
    options = engine_options(args, "kv_consumer", "cuda:0")
    assert (options.dtype, options.enforce_eager, options.kv_cache_bytes) == (
        "float16",
        True,
        512 * MiB,
    )
    assert (options.gpu_memory_utilization, options.tensor_parallel_size) == (0.4, 2)
    assert (options.max_model_len, options.max_num_seqs, options.max_num_batched_tokens) == (
        8192,
        16,
        2048,
    )
    assert options.cpu_threads == 6
    assert engine_options(parse("--no-enforce-eager"), None, "cpu").enforce_eager is False


def test_variables_stand_in_for_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (
        ("EPD_DEVICE", "cpu"),
        ("EPD_DTYPE", "bfloat16"),
        ("EPD_ENFORCE_EAGER", "false"),
        ("EPD_KV_CACHE_MB", "64"),
        ("EPD_GPU_MEMORY_UTILIZATION", "0.5"),
        ("EPD_TENSOR_PARALLEL_SIZE", "4"),
        ("EPD_MAX_MODEL_LEN", "2048"),
        ("EPD_MAX_NUM_SEQS", "8"),
        ("EPD_MAX_NUM_BATCHED_TOKENS", "1024"),
        ("EPD_CPU_THREADS", "3"),
    ):
        monkeypatch.setenv(name, value)
    args = parse()
    assert args.device == "cpu"
    options = engine_options(args, None, resolve_device(args.device, first_cuda))
    assert (options.device, options.dtype, options.enforce_eager) == ("cpu", "bfloat16", False)
    assert options.kv_cache_bytes == 64 * MiB and options.gpu_memory_utilization == 0.5
    assert (options.tensor_parallel_size, options.max_model_len) == (4, 2048)
    assert (options.max_num_seqs, options.max_num_batched_tokens) == (8, 1024)
    assert options.cpu_threads == 3


def test_the_transformers_engine_follows_the_device_too() -> None:
    cpu = transformers_options(parse("--engine", "transformers"), "cpu")
    assert (cpu.device, cpu.dtype, cpu.kv_cache_bytes) == ("cpu", "float32", 256 * MiB)
    assert cpu.max_model_len is None
    given = transformers_options(parse("--engine", "transformers", "--max-model-len", "512"), "cpu")
    assert given.max_model_len == 512
    cuda = transformers_options(parse("--engine", "transformers"), "cuda:0")
    assert (cuda.device, cuda.dtype, cuda.kv_cache_bytes) == ("cuda:0", "bfloat16", 256 * MiB)


@pytest.mark.parametrize(
    "flags",
    [
        ["--kv-cache-mb", "0"],
        ["--max-model-len", "0"],
        ["--max-num-seqs", "0"],
        ["--gpu-memory-utilization", "1.5"],
        ["--tensor-parallel-size", "0"],
        ["--cpu-threads", "0"],
    ],
)
def test_out_of_range_engine_flags_are_usage_errors(
    flags: list[str], tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = parse(*flags)
    args.model = tiny_model_dir
    assert prefill_cli.run(args) == 2
    assert flags[0] in capsys.readouterr().err


def test_cuda_asked_where_there_is_none_is_a_usage_error(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for command, cli in (("prefill", prefill_cli), ("decode", decode_cli)):
        args = parse("--device", "cuda", command=command)
        args.model = tiny_model_dir
        assert cli.run(args) == 2, command
        assert "CUDA is not available" in capsys.readouterr().err


def test_vllm_engine_args_carry_the_options(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from epd.server.engine.vllm_args import engine_args

    cpu = engine_args(tmp_path, "tiny", engine_options(parse(), "kv_producer", "cpu"))
    assert (cpu.model, cpu.served_model_name, cpu.dtype) == (str(tmp_path), "tiny", "float32")
    assert cpu.enforce_eager is True and cpu.kv_cache_memory_bytes == 256 * MiB
    assert cpu.max_num_seqs is None and cpu.max_num_batched_tokens is None
    assert cpu.max_model_len is None, "vLLM derives the model's own"
    assert cpu.kv_transfer_config.kv_buffer_device == "cpu"
    assert cpu.kv_transfer_config.kv_connector_module_path == "epd.server.engine.nixl_cpu"
    args = parse(
        "--gpu-memory-utilization",
        "0.45",
        "--tensor-parallel-size",
        "2",
        "--max-num-seqs",
        "32",
        "--max-num-batched-tokens",
        "4096",
    )
    cuda = engine_args(tmp_path, "", engine_options(args, "kv_consumer", "cuda:0"))
    assert cuda.served_model_name == tmp_path.name
    assert (cuda.dtype, cuda.enforce_eager, cuda.kv_cache_memory_bytes) == ("bfloat16", False, None)
    assert (cuda.gpu_memory_utilization, cuda.tensor_parallel_size) == (0.45, 2)
    assert (cuda.max_num_seqs, cuda.max_num_batched_tokens) == (32, 4096)
    assert cuda.kv_transfer_config.kv_buffer_device == "cuda"
    assert cuda.kv_transfer_config.kv_role == "kv_consumer"
    assert cuda.kv_transfer_config.kv_connector_module_path is None
    assert (
        engine_args(tmp_path, "", engine_options(parse(), None, "cpu")).kv_transfer_config is None
    )


def test_an_engine_for_another_device_than_vllms_build_is_refused() -> None:
    pytest.importorskip("vllm")
    from epd.server.engine.vllm_args import check_platform

    check_platform("cuda:0", "cuda")
    check_platform("cpu", "cpu")
    with pytest.raises(ValueError, match="runs on cpu, not cuda:0"):
        check_platform("cuda:0", "cpu")
