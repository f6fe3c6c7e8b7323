"""``epd up``'s engine settings: the flags it takes and passes on to its prefill and decode workers.

Flags left unset are not passed: each worker then applies its device's default (``epd prefill
--help``), and ``EPD_*`` variables reach the workers through the environment. Two settings
depend on the deployment: the KV cache of each engine (``LAUNCHER_CPU_KV_CACHE_MB`` on CPU, half of
``epd prefill``'s default: the launcher runs several engines on one machine) and, when
several engines share one GPU, each engine's share of its memory. vLLM engine arguments
(``--engine-arg NAME=VALUE``, and those after ``--``) go to every vLLM engine as given, checked
first by vLLM's parser.
"""

from __future__ import annotations

import argparse

from epd.launch.topology import LAUNCHER_CPU_KV_CACHE_MB
from epd.server.engine.base import DEFAULT_MAX_MODEL_LEN
from epd.server.engine.device import (
    CPU,
    CPU_KV_CACHE_MB,
    DEFAULTS,
    DEVICE_CHOICES,
    DTYPE_CHOICES,
    device_type,
)
from epd.server.engine.engine_cli import has_engine_args, refuse_engine_args, vllm_installed
from epd.server.engine.vllm_args import parse_engine_args
from epd.server.engine.vllm_engine import VllmOptions
from epd.server.engine.vllm_process import model_cpus

SHARED_GPU_MEMORY = 0.9
PASSED_ON = (
    "dtype",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "cpu_threads",
)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Engine flags of ``epd up`` (passed to the prefill and decode workers)."""
    add = parser.add_argument
    cpu, cuda, vllm = DEFAULTS[CPU], DEFAULTS["cuda"], VllmOptions()
    add(
        "--device",
        choices=DEVICE_CHOICES,
        default="auto",
        help="where the engines run: cuda, cpu or auto: cuda where usable (default auto); "
        "encoders keep their own devices (--topology)",
    )
    add(
        "--dtype",
        choices=DTYPE_CHOICES,
        help=f"engine dtype (default: {cuda.dtype} on CUDA, {cpu.dtype} on CPU)",
    )
    add(
        "--kv-cache-mb",
        type=int,
        help=f"KV cache per engine in MiB (default {LAUNCHER_CPU_KV_CACHE_MB} on CPU, the "
        f"launcher's choice for several engines on one machine where `epd prefill` alone takes "
        f"{CPU_KV_CACHE_MB}; on CUDA sized from each engine's share of the GPU's memory)",
    )
    add(
        "--gpu-memory-utilization",
        type=float,
        help="share of the GPU's memory of each engine (default: vLLM's "
        f"{vllm.gpu_memory_utilization} for one engine, {SHARED_GPU_MEMORY} split evenly when "
        "prefill and decode workers share the GPU)",
    )
    add(
        "--tensor-parallel-size",
        type=int,
        help=f"GPUs per engine (default {vllm.tensor_parallel_size})",
    )
    add(
        "--max-model-len",
        type=int,
        help=f"longest prompt + output in tokens (default {DEFAULT_MAX_MODEL_LEN})",
    )
    add("--max-num-seqs", type=int, help="sequences per engine step (default: vLLM's)")
    add("--max-num-batched-tokens", type=int, help="tokens per engine step (default: vLLM's)")
    add(
        "--cpu-threads",
        type=int,
        help="vLLM on CPU: each engine's model threads (default: vLLM's CPU binding, one per "
        "physical core of the first NUMA node less those vLLM reserves and at most every CPU "
        "but one, split evenly between the engines)",
    )
    add(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        help="eager engines, or compiled with --no-enforce-eager (default: "
        f"{'eager' if cpu.enforce_eager else 'compiled'} on CPU, "
        f"{'eager' if cuda.enforce_eager else 'compiled'} on CUDA)",
    )
    add(
        "--engine-arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any field of vLLM's AsyncEngineArgs for every vLLM engine, repeatable "
        "(quantization=fp8, enable_prefix_caching=true); wins over the flags above (epd "
        "prefill --help)",
    )
    add(
        "vllm_args",
        nargs="*",
        metavar="-- VLLM_ARG",
        help="after --: vLLM engine arguments in vLLM's spelling for every vLLM engine "
        "(-- --max-num-seqs 4)",
    )


def check_engine_args(args: argparse.Namespace) -> None:
    """ValueError when vLLM engine arguments were given that vLLM's parser refuses, or for the
    transformers engine (which takes none); this imports vLLM when there are any."""
    if not has_engine_args(args):
        return
    if args.engine == "transformers":
        refuse_engine_args(args)
    if vllm_installed():
        parse_engine_args(args.engine_arg, args.vllm_args)


def engine_settings(
    args: argparse.Namespace, device: str, num_engines: int, *, engines_pinned: bool = False
) -> tuple[int | None, tuple[str, ...]]:
    """(KV cache MiB or None, other flags, ``--engine-arg`` included) for engines on ``device``
    (``cpu`` or ``cuda:N``),
    ``num_engines`` of them on this machine; ``engines_pinned``: each engine has CPUs of its
    own (``--cpus``) and sizes its threads from them."""
    kind = device_type(device)
    flags = ["--device", kind]
    if kind != CPU and args.gpu_memory_utilization is None and num_engines > 1:
        flags += ["--gpu-memory-utilization", f"{SHARED_GPU_MEMORY / num_engines:.2f}"]
    for name in PASSED_ON:
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    if kind == CPU and args.cpu_threads is None and num_engines > 1 and not engines_pinned:
        threads = model_cpus(None, kv=True)[1]
        flags += ["--cpu-threads", str(max(1, threads // num_engines))]
    if args.enforce_eager is not None:
        flags.append("--enforce-eager" if args.enforce_eager else "--no-enforce-eager")
    for pair in args.engine_arg:
        flags += ["--engine-arg", pair]
    kv_cache_mb = args.kv_cache_mb
    if kv_cache_mb is None and kind == CPU:
        kv_cache_mb = LAUNCHER_CPU_KV_CACHE_MB
    return kv_cache_mb, tuple(flags)
