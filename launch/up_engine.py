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

from epd.common.flags import add_passed_on_arguments
from epd.launch.topology import LAUNCHER_CPU_KV_CACHE_MB
from epd.server.engine.device import CPU, CPU_KV_CACHE_MB, DEVICE_CHOICES, device_type
from epd.server.engine.engine_cli import (
    add_vllm_arguments,
    has_engine_args,
    refuse_engine_args,
    vllm_installed,
)
from epd.server.engine.settings import EngineSettings
from epd.server.engine.vllm_args import parse_engine_args
from epd.server.engine.vllm_options import VllmOptions
from epd.server.engine.vllm_process import model_cpus

SHARED_GPU_MEMORY = 0.9
_VLLM = VllmOptions()
# The engine flags of epd up, each with the default it applies when it is not the workers' own
# (None): the KV cache and --enforce-eager are passed on their own way, the others as given.
ENGINE_FLAGS: dict[str, str | None] = {
    "dtype": None,
    "kv_cache_mb": f"default {LAUNCHER_CPU_KV_CACHE_MB} on CPU, the launcher's choice for several "
    f"engines on one machine where `epd prefill` alone takes {CPU_KV_CACHE_MB}; on CUDA sized "
    "from each engine's share of the GPU's memory",
    "gpu_memory_utilization": f"default: vLLM's {_VLLM.gpu_memory_utilization} for one engine, "
    f"{SHARED_GPU_MEMORY} split evenly when prefill and decode workers share the GPU",
    "tensor_parallel_size": None,
    "max_model_len": None,
    "max_num_seqs": None,
    "max_num_batched_tokens": None,
    "cpu_threads": "default: vLLM's CPU binding, one per physical core of the first NUMA node "
    "less those vLLM reserves and at most every CPU but one, split evenly between the engines",
    "enforce_eager": None,
}
PASSED_ON = tuple(name for name in ENGINE_FLAGS if name not in ("kv_cache_mb", "enforce_eager"))


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Engine flags of ``epd up``: ``EngineSettings``' flags, passed to the prefill and decode
    workers when given (the launcher's own defaults in ``ENGINE_FLAGS``), and vLLM's arguments."""
    parser.add_argument(
        "--device",
        choices=DEVICE_CHOICES,
        default="auto",
        help="where the engines run: cuda, cpu or auto: cuda where usable (default auto); "
        "encoders keep their own devices (--topology)",
    )
    add_passed_on_arguments(parser, EngineSettings, ENGINE_FLAGS)
    add_vllm_arguments(
        parser,
        engines=" for every vLLM engine",
        wins="It wins over the flags above (epd prefill --help)",
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
    own (``--cpus``) and sizes its threads from them. The route's ``--reasoning-parser`` goes
    to the engines too, as ``vllm serve`` gives its engine the parser."""
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
    if args.reasoning_parser:  # NOTE: the route's flag (tools_cli): the engines need it too
        flags += ["--reasoning-parser", args.reasoning_parser]
    for pair in args.engine_arg:
        flags += ["--engine-arg", pair]
    kv_cache_mb = args.kv_cache_mb
    if kv_cache_mb is None and kind == CPU:
        kv_cache_mb = LAUNCHER_CPU_KV_CACHE_MB
    return kv_cache_mb, tuple(flags)
