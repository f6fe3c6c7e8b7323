"""``epd encode``: run an encode server."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from epd.common.options import field_default
from epd.common.server import ServerOptions, serve, stop_signals
from epd.common.server_cli import add_server_arguments, pin_to_cpus, server_options
from epd.common.telemetry_cli import add_telemetry_arguments, configure_from_args
from epd.server.encode.app import (
    ACCELERATOR_BATCH_SIZE,
    CPU_MAX_INLINE_MS,
    EncodeConfig,
    build_encode_server,
)
from epd.server.encode.fast_tower import ATTENTIONS, PATCH_EMBEDDINGS
from epd.server.encode.vision import DTYPES, PREPROCESS_DEVICES
from epd.server.media.media_cli import add_media_arguments, media_policy
from epd.server.models.model_cli import add_model_arguments, resolve_model_arguments
from epd.server.transfer.transfer_cli import (
    add_transfer_arguments,
    set_nixl_log_level,
    transfer_options,
)
from epd.server.worker.worker_cli import add_worker_arguments

DEFAULT_PORT = 50061
# NOTE: the encoder's --device read this variable before every service's --device read
# EPD_DEVICE; when set it still wins, so a shell setting both keeps its encoders where they were.
DEPRECATED_DEVICE_VARIABLE = "EPD_ENCODER_DEVICE"


def default_of(name: str) -> Any:
    """The default of ``EncodeConfig``'s field ``name``: the default of the flag that sets it."""
    return field_default(EncodeConfig, name)


def device_fallback() -> str:
    """``--device``'s fallback: $EPD_ENCODER_DEVICE (deprecated, with a warning), else
    $EPD_DEVICE, else EncodeConfig's default."""
    deprecated = os.environ.get(DEPRECATED_DEVICE_VARIABLE)
    if deprecated:
        print(
            f"epd encode: ${DEPRECATED_DEVICE_VARIABLE} is deprecated: set EPD_DEVICE (or "
            "--device) instead",
            file=sys.stderr,
        )
        return deprecated
    return os.environ.get("EPD_DEVICE") or default_of("device")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Encoder flags, then media, data-plane, server and telemetry flags."""
    env = os.environ.get
    add_model_arguments(
        parser,
        required=True,
        what="a checkpoint of a supported family; only its vision tower is loaded",
    )
    parser.add_argument(
        "--model-id",
        default=default_of("model_id"),
        help="model name clients use (default: the hub id, or the directory name)",
    )
    parser.add_argument(
        "--device",
        default=device_fallback(),
        help="cpu, cuda, cuda:N, xpu or auto: the accelerator where there is one, else CPU "
        f"(env EPD_DEVICE; the old env {DEPRECATED_DEVICE_VARIABLE}, deprecated, wins when "
        f"set; default {default_of('device')})",
    )
    parser.add_argument(
        "--dtype",
        default=default_of("dtype"),
        choices=["auto", *DTYPES],
        help=f"vision tower dtype (default {default_of('dtype')}: bfloat16 on an accelerator, "
        "float32 on CPU)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=int(env("EPD_ENCODER_THREADS", "0")),
        help="CPU threads of the vision tower (env EPD_ENCODER_THREADS; default "
        "0: the --cpus count when given, else torch's default, one per core); give CPU "
        "encoders that share a machine with engines fewer",
    )
    parser.add_argument(
        "--preprocess-threads",
        type=int,
        default=int(env("EPD_PREPROCESS_THREADS", default_of("preprocess_threads"))),
        help="threads that decode images and run the model's image processor, in parallel with "
        f"the tower (env EPD_PREPROCESS_THREADS; default {default_of('preprocess_threads')}: "
        "one per CPU this process may use)",
    )
    parser.add_argument(
        "--preprocess-device",
        choices=PREPROCESS_DEVICES,
        default=default_of("preprocess_device"),
        help="where the image processor runs: auto (the tower's device where the processor can "
        "run there: transformers' torchvision backend; else CPU) or cpu "
        f"(default {default_of('preprocess_device')})",
    )
    parser.add_argument(
        "--vision-attention",
        choices=ATTENTIONS,
        default=default_of("attention"),
        help="the tower's attention: packed (one SDPA call per run of equally long images or "
        "windows of a batch packed in one sequence), sdpa or eager (transformers' own, per "
        "image or window) or auto: packed on an accelerator where the family's tower packs "
        f"images (Qwen), else transformers' default (default {default_of('attention')})",
    )
    parser.add_argument(
        "--patch-embedding",
        choices=PATCH_EMBEDDINGS,
        default=default_of("patch_embedding"),
        help="a patch-embedding convolution whose stride is its kernel (Qwen's) runs as a "
        "matrix product (matmul, as vLLM runs it) or as the convolution (conv); auto: matmul "
        f"on an accelerator, conv on CPU (default {default_of('patch_embedding')})",
    )
    add_worker_arguments(parser, EncodeConfig, "encode")
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=default_of("max_batch_size"),
        help=f"images per vision-tower call at most (default {default_of('max_batch_size')}: "
        f"{ACCELERATOR_BATCH_SIZE} on an accelerator, 1 on CPU, where a batch costs its images' "
        "sum and only delays the first)",
    )
    parser.add_argument(
        "--max-batch-wait-ms",
        type=float,
        default=float(env("EPD_MAX_BATCH_WAIT_MS", default_of("max_batch_wait_ms"))),
        help="how long the first image of a batch waits for others (env "
        f"EPD_MAX_BATCH_WAIT_MS; default {default_of('max_batch_wait_ms'):g}: a batch takes the "
        "images already queued, which under load are those that arrived while the tower ran)",
    )
    parser.add_argument(
        "--max-inline-ms",
        default=env("EPD_MAX_INLINE_MS", "auto"),
        help="batches expected to finish within this many ms run on the event "
        "loop instead of the tower's thread, whose hand-off costs more than "
        "that on small CPU machines (env EPD_MAX_INLINE_MS; default auto: "
        f"{CPU_MAX_INLINE_MS:g} on CPU, 0 on an accelerator; 0: always the tower's thread)",
    )
    parser.add_argument(
        "--cache-mb",
        type=float,
        default=default_of("cache_mb"),
        help="encoder cache budget in MiB, held in the memory of --device (GPU memory for a "
        f"GPU encoder), 0 disables (default {default_of('cache_mb'):g})",
    )
    parser.add_argument(
        "--transfer",
        choices=["auto", "shm", "nixl", "inline"],
        default=env("EPD_TRANSFER_KIND", "auto"),
        help="data-plane backend for results, unless a request asks for one (env "
        "EPD_TRANSFER_KIND; default auto: shm on the same host, nixl to "
        "another host when nixl is installed, else inline)",
    )
    parser.add_argument(
        "--lease-ttl-s",
        type=float,
        default=default_of("lease_ttl_s"),
        help=f"seconds an unreleased result is kept (default {default_of('lease_ttl_s'):g})",
    )
    add_media_arguments(parser)
    add_transfer_arguments(parser)
    add_server_arguments(parser, default_port=DEFAULT_PORT)
    add_telemetry_arguments(parser)


def non_negative_ms(text: str) -> float:
    """``--max-inline-ms`` as a number of ms (``auto`` is read by the caller)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--max-inline-ms must be auto or a number of ms, not {text!r}") from None
    if not value >= 0:
        raise ValueError("--max-inline-ms must not be negative")
    return value


def encode_config(args: argparse.Namespace) -> EncodeConfig:
    """The ``EncodeConfig`` of the flags (``--model`` resolved by the caller); ValueError names
    a value out of range."""
    inline = args.max_inline_ms
    return EncodeConfig(
        model_dir=args.model,
        model_id=args.model_id,
        device=args.device,
        dtype=args.dtype,
        worker_id=args.worker_id,
        weight=args.weight,
        max_batch_size=args.max_batch_size,
        max_batch_wait_ms=args.max_batch_wait_ms,
        cache_mb=args.cache_mb,
        media=media_policy(args),
        scheduler=args.scheduler,
        transfer_kind=None if args.transfer == "auto" else args.transfer,
        lease_ttl_s=args.lease_ttl_s,
        max_inline_ms=None if inline == "auto" else non_negative_ms(inline),
        transfer=transfer_options(args),
        preprocess_threads=args.preprocess_threads,
        preprocess_device=args.preprocess_device,
        attention=args.vision_attention,
        patch_embedding=args.patch_embedding,
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; bad flags exit 2 with a message."""
    try:
        resolve_model_arguments(args)
        if args.threads < 0:
            raise ValueError("--threads must be 0 (the default) or more")
        config = encode_config(args)
        options = server_options(args)
        cpus = pin_to_cpus(args)
    except ValueError as e:
        print(f"epd encode: {e}", file=sys.stderr)
        return 2
    configure_from_args("epd-encode", args)
    set_nixl_log_level(args)
    threads = args.threads or (len(cpus) if cpus else 0)
    if threads:
        import torch

        torch.set_num_threads(threads)
    return asyncio.run(_serve(config, options))


async def _serve(config: EncodeConfig, options: ServerOptions) -> int:
    with stop_signals() as stop:
        try:
            app = await build_encode_server(config, options)
        except ValueError as e:
            print(f"epd encode: {e}", file=sys.stderr)
            return 2
        print(
            f"epd encode listening on {options.host}:{app.port} as {app.info.id} "
            f"(device {app.info.device})",
            flush=True,
        )
        await serve(app.server, stop)
    await app.stop()  # NOTE: drained already: frees the worker's threads and payloads
    return 0
