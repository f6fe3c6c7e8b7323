"""``epd encode``: run an encode server."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from epd.common.server import ServerOptions, serve
from epd.common.server_cli import add_server_arguments, pin_to_cpus, server_options
from epd.common.telemetry_cli import add_telemetry_arguments, configure_from_args
from epd.server.encode.app import EncodeConfig, build_encode_server
from epd.server.encode.fast_tower import ATTENTIONS, PATCH_EMBEDDINGS
from epd.server.encode.vision import DTYPES, PREPROCESS_DEVICES
from epd.server.media.media_cli import add_media_arguments, media_policy
from epd.server.models.model_cli import add_model_arguments, resolve_model_arguments
from epd.server.transfer.transfer_cli import (
    add_transfer_arguments,
    set_nixl_log_level,
    transfer_options,
)

DEFAULT_PORT = 50061


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
        default="",
        help="model name clients use (default: the hub id, or the directory name)",
    )
    parser.add_argument(
        "--device",
        default=env("EPD_ENCODER_DEVICE", "auto"),
        help="cpu, cuda, cuda:N, xpu or auto: the accelerator where there is one, else CPU "
        "(env EPD_ENCODER_DEVICE; default auto)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", *DTYPES],
        help="vision tower dtype (default auto: bfloat16 on an accelerator, float32 on CPU)",
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
        default=int(env("EPD_PREPROCESS_THREADS", "0")),
        help="threads that decode images and run the model's image processor, in parallel with "
        "the tower (env EPD_PREPROCESS_THREADS; default 0: one per CPU this process may use)",
    )
    parser.add_argument(
        "--preprocess-device",
        choices=PREPROCESS_DEVICES,
        default="auto",
        help="where the image processor runs: auto (the tower's device where the processor can "
        "run there: transformers' torchvision backend; else CPU) or cpu (default auto)",
    )
    parser.add_argument(
        "--vision-attention",
        choices=ATTENTIONS,
        default="auto",
        help="the tower's attention: packed (one SDPA call per run of equally long images or "
        "windows of a batch packed in one sequence), sdpa or eager (transformers' own, per "
        "image or window) or auto: packed on an accelerator where the family's tower packs "
        "images (Qwen), else transformers' default (default auto)",
    )
    parser.add_argument(
        "--patch-embedding",
        choices=PATCH_EMBEDDINGS,
        default="auto",
        help="a patch-embedding convolution whose stride is its kernel (Qwen's) runs as a "
        "matrix product (matmul, as vLLM runs it) or as the convolution (conv); auto: matmul "
        "on an accelerator, conv on CPU (default auto)",
    )
    parser.add_argument(
        "--worker-id",
        default=env("EPD_WORKER_ID", ""),
        help="id in the scheduler's registry (env EPD_WORKER_ID; default encode-HOST-PORT)",
    )
    parser.add_argument(
        "--weight",
        type=float,
        default=1.0,
        help="share of work under weighted policies (default 1)",
    )
    parser.add_argument(
        "--scheduler",
        default=env("EPD_SCHEDULER"),
        help="scheduler host:port to register with (env EPD_SCHEDULER; "
        "default: none, serve direct calls only)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=0,
        help="images per vision-tower call at most (default 0: 8 on an accelerator, 1 on CPU, "
        "where a batch costs its images' sum and only delays the first)",
    )
    parser.add_argument(
        "--max-batch-wait-ms",
        type=float,
        default=float(env("EPD_MAX_BATCH_WAIT_MS", "0")),
        help="how long the first image of a batch waits for others (env "
        "EPD_MAX_BATCH_WAIT_MS; default 0: a batch takes the images already "
        "queued, which under load are those that arrived while the tower "
        "ran)",
    )
    parser.add_argument(
        "--max-inline-ms",
        default=env("EPD_MAX_INLINE_MS", "auto"),
        help="batches expected to finish within this many ms run on the event "
        "loop instead of the tower's thread, whose hand-off costs more than "
        "that on small CPU machines (env EPD_MAX_INLINE_MS; default auto: 10 "
        "on CPU, 0 on an accelerator; 0: always the tower's thread)",
    )
    parser.add_argument(
        "--cache-mb",
        type=float,
        default=256.0,
        help="encoder cache budget in MiB, held in the memory of --device (GPU memory for a "
        "GPU encoder), 0 disables (default 256)",
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
        default=60.0,
        help="seconds an unreleased result is kept (default 60)",
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


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; bad flags exit 2 with a message."""
    try:
        resolve_model_arguments(args)
        inline = args.max_inline_ms
        max_inline_ms = None if inline == "auto" else non_negative_ms(inline)
        if args.max_batch_size < 0 or args.max_batch_wait_ms < 0 or args.cache_mb < 0:
            raise ValueError("batch size, wait and cache must not be negative")
        if args.threads < 0 or args.preprocess_threads < 0:
            raise ValueError("--threads and --preprocess-threads must be 0 (the default) or more")
        config = EncodeConfig(
            args.model,
            args.model_id,
            args.device,
            args.dtype,
            args.worker_id,
            args.weight,
            args.max_batch_size,
            args.max_batch_wait_ms,
            args.cache_mb,
            media_policy(args),
            args.scheduler,
            None if args.transfer == "auto" else args.transfer,
            args.lease_ttl_s,
            max_inline_ms=max_inline_ms,
            transfer=transfer_options(args),
            preprocess_threads=args.preprocess_threads,
            preprocess_device=args.preprocess_device,
            attention=args.vision_attention,
            patch_embedding=args.patch_embedding,
        )
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
    try:
        app = await build_encode_server(config, options)
    except ValueError as e:
        print(f"epd encode: {e}", file=sys.stderr)
        return 2
    print(
        f"epd encode listening on {options.host}:{app.port} as {app.worker.worker_id} "
        f"(device {app.device})",
        flush=True,
    )
    await serve(app.server)
    await app.worker.close()
    app.plane.close()
    return 0
