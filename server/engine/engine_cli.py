"""Engine flags shared by ``epd prefill`` and ``epd decode``, and the options built from them.

Device-dependent flags default to None here; ``engine_options`` fills them from the defaults of
the device ``--device`` resolves to (``epd.server.engine.device``). Any other vLLM engine argument
comes as ``--engine-arg NAME=VALUE`` or after ``--`` in vLLM's spelling, parsed by vLLM's parser;
those win over the values epd computes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from typing import TYPE_CHECKING

from epd.common.options import field_default
from epd.server.engine.device import (
    DEFAULTS,
    DEVICE_CHOICES,
    DTYPE_CHOICES,
    defaults_for,
)
from epd.server.engine.vllm_args import parse_engine_args
from epd.server.engine.vllm_engine import VllmOptions
from epd.server.engine.vllm_inputs import MIN_KV_LEASE_S
from epd.server.models.model_cli import add_model_arguments, resolve_model_arguments

if TYPE_CHECKING:
    from epd.server.engine.transformers_engine import TransformersOptions

MiB = 1 << 20


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def _optional_int(value: str | None) -> int | None:
    return int(value) if value else None


def _optional_bool(value: str | None) -> bool | None:
    if not value:
        return None
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {value!r}")


def has_engine_args(args: argparse.Namespace) -> bool:
    """Whether vLLM engine arguments were given (``--engine-arg`` or after ``--``)."""
    return bool(args.engine_arg or args.vllm_args)


def refuse_engine_args(args: argparse.Namespace) -> None:
    """ValueError when vLLM engine arguments were given to the transformers engine."""
    if has_engine_args(args):
        raise ValueError(
            "--engine-arg and arguments after -- are vLLM engine arguments; the transformers "
            "engine takes none (use --engine vllm)"
        )


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """The engine flags, each with an ``EPD_*`` environment fallback; ``VllmOptions`` owns the
    defaults of those that are not the device's (``epd.server.engine.device``)."""
    env = os.environ.get
    cpu, cuda = DEFAULTS["cpu"], DEFAULTS["cuda"]
    vllm = VllmOptions()
    add = parser.add_argument
    add_model_arguments(parser, required=True, what="the whole checkpoint is loaded")
    add(
        "--model-id",
        default="",
        help="model name clients use (default: the hub id, or the directory name)",
    )
    add(
        "--device",
        choices=DEVICE_CHOICES,
        default=env("EPD_DEVICE", "auto"),
        help="where the engine runs: cuda (the current CUDA device, registered as cuda:N), cpu, "
        "or auto: cuda where usable, else cpu (env EPD_DEVICE, default auto); vLLM runs on "
        "the device its build is for (scripts/install.sh --target)",
    )
    add(
        "--dtype",
        choices=DTYPE_CHOICES,
        default=env("EPD_DTYPE", "auto"),
        help=f"model dtype; auto: {cuda.dtype} on CUDA, {cpu.dtype} on CPU (env EPD_DTYPE, "
        "default auto)",
    )
    add(
        "--max-model-len",
        type=int,
        default=int(env("EPD_MAX_MODEL_LEN", vllm.max_model_len)),
        help="longest prompt + output in tokens (env EPD_MAX_MODEL_LEN, default "
        f"{vllm.max_model_len})",
    )
    add(
        "--kv-cache-mb",
        type=int,
        default=_optional_int(env("EPD_KV_CACHE_MB")),
        help=f"KV cache size in MiB (env EPD_KV_CACHE_MB; default {cpu.kv_cache_mb} on CPU, "
        "where vLLM's automatic sizing fails on small machines; on CUDA vLLM sizes it from "
        "--gpu-memory-utilization)",
    )
    add(
        "--gpu-memory-utilization",
        type=float,
        default=float(env("EPD_GPU_MEMORY_UTILIZATION", vllm.gpu_memory_utilization)),
        help="share of the GPU's memory this vLLM engine may use, weights and KV cache "
        "together; engines sharing a GPU need shares that add up to less than 1 (env "
        f"EPD_GPU_MEMORY_UTILIZATION, default {vllm.gpu_memory_utilization}: vLLM's; CUDA only)",
    )
    add(
        "--tensor-parallel-size",
        type=int,
        default=int(env("EPD_TENSOR_PARALLEL_SIZE", vllm.tensor_parallel_size)),
        help="GPUs the model is split across (env EPD_TENSOR_PARALLEL_SIZE, default "
        f"{vllm.tensor_parallel_size})",
    )
    add(
        "--max-num-seqs",
        type=int,
        default=_optional_int(env("EPD_MAX_NUM_SEQS")),
        help="sequences vLLM runs in one step (env EPD_MAX_NUM_SEQS; default vLLM's for the "
        "device)",
    )
    add(
        "--max-num-batched-tokens",
        type=int,
        default=_optional_int(env("EPD_MAX_NUM_BATCHED_TOKENS")),
        help="tokens vLLM computes in one step, prompt chunks included (env "
        "EPD_MAX_NUM_BATCHED_TOKENS; default vLLM's for the device)",
    )
    add(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=_optional_bool(env("EPD_ENFORCE_EAGER")),
        help="run the model eagerly (--no-enforce-eager: compile it and capture CUDA graphs); "
        f"env EPD_ENFORCE_EAGER; default {'eager' if cpu.enforce_eager else 'compiled'} "
        f"on CPU, {'eager' if cuda.enforce_eager else 'compiled'} on CUDA",
    )
    add(
        "--max-pending",
        type=int,
        default=vllm.max_pending_requests,
        help="requests admitted at once; more get RESOURCE_EXHAUSTED (default "
        f"{vllm.max_pending_requests})",
    )
    add(
        "--cpu-threads",
        type=int,
        default=_optional_int(env("EPD_CPU_THREADS")),
        help="on CPU: the model's threads (env EPD_CPU_THREADS; default for vLLM: as vLLM's CPU "
        "worker would bind them, VLLM_CPU_OMP_THREADS_BIND: a CPU list it names, or one per "
        "physical core of the first NUMA node less those vLLM reserves and at most every CPU "
        "but one; for the transformers engine: the --cpus count when given, else torch's "
        "default)",
    )
    add(
        "--kv-host",
        default=env("EPD_KV_HOST", vllm.side_channel.host),
        help="address of this worker's NIXL KV handshake listener, reachable by its peers "
        f"(env EPD_KV_HOST, default {vllm.side_channel.host})",
    )
    add(
        "--kv-port",
        type=int,
        default=int(env("EPD_KV_PORT", vllm.side_channel.port)),
        help="port of the NIXL handshake listener (env EPD_KV_PORT; default "
        f"{vllm.side_channel.port}: a free port)",
    )
    add(
        "--kv-lease-s",
        type=int,
        default=int(env("EPD_KV_LEASE_S", vllm.kv_lease_s)),
        help="seconds a prefill worker keeps KV blocks no decode worker has read (a request "
        "cancelled between prefill and decode); the same on prefill and decode workers, "
        f"at least {MIN_KV_LEASE_S} (env EPD_KV_LEASE_S, default {vllm.kv_lease_s})",
    )
    add(
        "--engine-arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any field of vLLM's AsyncEngineArgs, repeatable (quantization=fp8, "
        "enable_prefix_caching=true, kv_cache_dtype=fp8, speculative_config='{...}'); parsed "
        "by vLLM's engine-args parser. It and the arguments after -- win over the values the "
        "flags above give vLLM (vLLM engine only)",
    )
    add(
        "vllm_args",
        nargs="*",
        metavar="-- VLLM_ARG",
        help="after --: vLLM engine arguments as `vllm serve` spells them (-- --max-num-seqs 4 "
        "--enable-prefix-caching); they win over --engine-arg and the flags above",
    )


def check_engine_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the first engine flag with a value no engine accepts; resolves
    ``--model`` to its directory (``resolve_model_arguments``) last, once the flags are sound."""
    if args.kv_lease_s < MIN_KV_LEASE_S:
        raise ValueError(
            f"--kv-lease-s must be at least {MIN_KV_LEASE_S} (decode workers renew "
            f"the lease every lease/6 s), got {args.kv_lease_s}"
        )
    for flag in ("max_model_len", "max_pending", "tensor_parallel_size"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1")
    for flag in ("kv_cache_mb", "max_num_seqs", "max_num_batched_tokens", "cpu_threads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ValueError("--gpu-memory-utilization must be in (0, 1]")
    resolve_model_arguments(args)


def engine_options(args: argparse.Namespace, kv_role: str | None, device: str) -> VllmOptions:
    """VllmOptions from the engine flags, on ``device`` (``resolve_device(args.device)``);
    ValueError naming an engine argument vLLM refuses (this imports vLLM when there are any)."""
    from epd.server.engine.vllm_inputs import SideChannel

    defaults = defaults_for(device)
    kv_cache_mb = args.kv_cache_mb or defaults.kv_cache_mb
    overrides = {}
    if has_engine_args(args):
        overrides = parse_engine_args(args.engine_arg, args.vllm_args)
    return VllmOptions(
        device=device,
        dtype=defaults.dtype if args.dtype == "auto" else args.dtype,
        max_model_len=args.max_model_len,
        kv_cache_bytes=kv_cache_mb * MiB if kv_cache_mb else None,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enforce_eager=defaults.enforce_eager if args.enforce_eager is None else args.enforce_eager,
        max_pending_requests=args.max_pending,
        kv_role=kv_role,
        side_channel=SideChannel(args.kv_host, args.kv_port),
        kv_lease_s=args.kv_lease_s,
        cpu_threads=args.cpu_threads,
        overrides=overrides,
    )


def transformers_options(args: argparse.Namespace, device: str) -> TransformersOptions:
    """TransformersOptions from the engine flags, on ``device``; ValueError when vLLM engine
    arguments were given (this engine has no use for them)."""
    from epd.server.engine.transformers_engine import TransformersOptions

    refuse_engine_args(args)
    defaults = defaults_for(device)
    # NOTE: the transformers engine admits requests against a KV budget on every device.
    kv_cache_mb = args.kv_cache_mb or defaults.kv_cache_mb
    kv_cache_bytes = kv_cache_mb * MiB if kv_cache_mb else None
    return TransformersOptions(
        device=device,
        dtype=defaults.dtype if args.dtype == "auto" else args.dtype,
        max_model_len=args.max_model_len,
        kv_cache_bytes=kv_cache_bytes or field_default(TransformersOptions, "kv_cache_bytes"),
        max_pending_requests=args.max_pending,
    )
