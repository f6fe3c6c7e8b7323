"""Engine flags shared by ``epd prefill`` and ``epd decode``, and the options built from them.

``EngineSettings``' fields declare the flags; device-dependent ones default to auto or None, and
``engine_options`` fills them from the defaults of the device ``--device`` resolves to
(``epd.server.engine.device``). Any other vLLM engine argument
comes as ``--engine-arg NAME=VALUE`` or after ``--`` in vLLM's spelling, parsed by vLLM's parser;
those win over the values epd computes.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import TYPE_CHECKING

from epd.common.flags import add_dataclass_arguments, from_arguments
from epd.server.engine.device import defaults_for
from epd.server.engine.settings import EngineSettings
from epd.server.engine.vllm_args import check_reasoning_parser, parse_engine_args
from epd.server.engine.vllm_options import VllmOptions
from epd.server.models.model_cli import add_model_arguments, resolve_model_arguments

if TYPE_CHECKING:
    from epd.server.engine.transformers_engine import TransformersOptions

MiB = 1 << 20
ENGINE_ARGS_WIN = (
    "It and the arguments after -- win over the values the flags above give vLLM (vLLM engine only)"
)


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


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
    """The engine flags (``EngineSettings``' fields declare them), then vLLM's own arguments;
    ValueError naming an EPD_* variable whose value is malformed."""
    add_model_arguments(parser, required=True, what="the whole checkpoint is loaded")
    add_dataclass_arguments(parser, EngineSettings)
    add_vllm_arguments(parser)


def add_vllm_arguments(
    parser: argparse.ArgumentParser, *, engines: str = "", wins: str = ENGINE_ARGS_WIN
) -> None:
    """``--engine-arg NAME=VALUE`` (repeatable) and the arguments after ``--``: vLLM engine
    arguments for vLLM's own parser (no settings of ours: they fill no field). ``engines``
    says which engines get them, ``wins`` over what."""
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"any field of vLLM's AsyncEngineArgs{engines}, repeatable (quantization=fp8, "
        "enable_prefix_caching=true, kv_cache_dtype=fp8, speculative_config='{...}'); parsed "
        f"by vLLM's engine-args parser. {wins}",
    )
    parser.add_argument(
        "vllm_args",
        nargs="*",
        metavar="-- VLLM_ARG",
        help=f"after --: vLLM engine arguments as `vllm serve` spells them{engines} (-- "
        "--max-num-seqs 4 --enable-prefix-caching); they win over --engine-arg and the flags "
        "above",
    )


def engine_settings(args: argparse.Namespace) -> EngineSettings:
    """The settings of the engine flags; ValueError naming a flag out of range."""
    return from_arguments(EngineSettings, args)


def check_engine_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the first engine flag with a value no engine accepts; resolves
    ``--model`` to its directory (``resolve_model_arguments``) last, once the flags are sound."""
    engine_settings(args)
    resolve_model_arguments(args)


def engine_options(args: argparse.Namespace, kv_role: str | None, device: str) -> VllmOptions:
    """VllmOptions from the engine flags, on ``device`` (``resolve_device(args.device)``);
    ValueError naming an engine argument vLLM refuses (this imports vLLM when there are any)."""
    from epd.server.engine.vllm_inputs import SideChannel

    settings, defaults = engine_settings(args), defaults_for(device)
    kv_cache_mb = settings.kv_cache_mb or defaults.kv_cache_mb
    overrides = {}
    if has_engine_args(args):
        overrides = parse_engine_args(args.engine_arg, args.vllm_args)
    eager = settings.enforce_eager
    return VllmOptions(
        device=device,
        dtype=defaults.dtype if settings.dtype == "auto" else settings.dtype,
        max_model_len=settings.max_model_len,
        kv_cache_bytes=kv_cache_mb * MiB if kv_cache_mb else None,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        tensor_parallel_size=settings.tensor_parallel_size,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enforce_eager=defaults.enforce_eager if eager is None else eager,
        max_pending_requests=settings.max_pending,
        kv_role=kv_role,
        side_channel=SideChannel(settings.kv_host, settings.kv_port),
        kv_lease_s=settings.kv_lease_s,
        cpu_threads=settings.cpu_threads,
        reasoning_parser=check_reasoning_parser(settings.reasoning_parser),
        overrides=overrides,
    )


def transformers_options(args: argparse.Namespace, device: str) -> TransformersOptions:
    """TransformersOptions from the engine flags, on ``device``; ValueError when vLLM engine
    arguments were given (this engine has no use for them)."""
    from epd.server.engine.transformers_engine import TransformersOptions

    refuse_engine_args(args)
    settings, defaults = engine_settings(args), defaults_for(device)
    # NOTE: the transformers engine admits requests against a KV budget on every device.
    kv_cache_mb = settings.kv_cache_mb or defaults.kv_cache_mb
    given = {"kv_cache_bytes": kv_cache_mb * MiB} if kv_cache_mb else {}
    return TransformersOptions(
        device=device,
        dtype=defaults.dtype if settings.dtype == "auto" else settings.dtype,
        max_model_len=settings.max_model_len,
        max_pending_requests=settings.max_pending,
        **given,
    )
