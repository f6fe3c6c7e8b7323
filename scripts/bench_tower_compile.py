"""The vision tower eager against ``torch.compile`` (on CUDA: CUDA graphs), same images, one run.

What it decides: whether ``epd encode`` should compile its tower for the batch shapes it sees.
On the 2-core CPU VM (docs/benchmarks/encode.md) it does not pay: no consistent gain on the tiny
tower, none on the small one. A GPU, where a tower's kernel launches can cost more than its
arithmetic at small batches, is where the answer may differ; ``scripts/gpu_check.sh`` runs this
there.

For each batch size (distinct random 336x448 pictures, every batch the same shape): the tower
eager, the seconds the first compiled call took (tracing and compiling that shape), the tower
compiled, and the largest difference of the compiled embeddings from the eager ones relative to
their largest value.

    .venv/bin/python scripts/bench_tower_compile.py [--preset tiny|small | --model DIR]
        [--device cuda] [--dtype auto] [--mode auto|default|reduce-overhead|max-autotune]
        [--batches 1,8] [--repeats N] [--json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_encode import add_model_arguments, report

from epd.server.encode.vision import Prepared, VisionEncoder

MODES = ("auto", "default", "reduce-overhead", "max-autotune")


def prepared_batch(encoder: VisionEncoder, size: int, seed: int) -> list[Prepared]:
    rng = np.random.default_rng(seed)
    return [
        encoder.prepare(torch.from_numpy(rng.integers(0, 255, (336, 448, 3), dtype=np.uint8)))
        for _ in range(size)
    ]


def ms_per_image(encoder: VisionEncoder, batch: list[Prepared], repeats: int) -> float:
    encoder.run(batch)
    start = time.perf_counter()
    for _ in range(repeats):
        encoder.run(batch)
    return (time.perf_counter() - start) * 1000 / repeats / len(batch)


def measure(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    encoder = VisionEncoder(model_dir, device=args.device, dtype=args.dtype)
    mode = args.mode if args.mode != "auto" else _auto_mode(encoder.device)
    batches = {size: prepared_batch(encoder, size, seed=size) for size in args.batches}
    eager = encoder.model
    rows = []
    for size, batch in batches.items():
        encoder.model = eager
        eager_ms = ms_per_image(encoder, batch, args.repeats)
        reference = [embeddings.float().cpu() for embeddings, _ in encoder.run(batch)]
        torch.compiler.reset()
        encoder.model = torch.compile(eager, mode=mode, dynamic=False)
        start = time.perf_counter()
        compiled_out = encoder.run(batch)
        compile_s = time.perf_counter() - start
        compiled_ms = ms_per_image(encoder, batch, args.repeats)
        difference = max(
            float((got.float().cpu() - want).abs().max() / want.abs().max())
            for (got, _), want in zip(compiled_out, reference, strict=True)
        )
        rows.append(
            {
                "batch": size,
                "eager_ms_per_image": eager_ms,
                "compile_s": compile_s,
                "compiled_ms_per_image": compiled_ms,
                "speedup": eager_ms / compiled_ms,
                "max_relative_difference": difference,
            }
        )
    return {
        "model": model_dir.name,
        "device": str(encoder.device),
        "dtype": str(encoder.dtype).removeprefix("torch."),
        "attention": encoder.attention,
        "mode": mode,
        "rows": rows,
    }


def _auto_mode(device: torch.device) -> str:
    """CUDA graphs where there are any, else inductor's default."""
    return "reduce-overhead" if device.type == "cuda" else "default"


def print_table(figures: dict[str, Any]) -> None:
    print(
        f"model {figures['model']} on {figures['device']} ({figures['dtype']}, "
        f"{figures['attention']} attention), torch.compile mode {figures['mode']}"
    )
    print(
        f"{'batch':>5} {'eager ms/img':>13} {'compile s':>10} {'compiled ms/img':>16} "
        f"{'speedup':>8} {'max rel diff':>13}"
    )
    for row in figures["rows"]:
        print(
            f"{row['batch']:5d} {row['eager_ms_per_image']:13.2f} {row['compile_s']:10.1f} "
            f"{row['compiled_ms_per_image']:16.2f} {row['speedup']:7.2f}x "
            f"{row['max_relative_difference']:13.2e}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser)
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="auto",
        help="torch.compile's mode (default auto: reduce-overhead, i.e. CUDA graphs, on CUDA; "
        "default elsewhere)",
    )
    parser.add_argument(
        "--batches",
        default="1,8",
        help="batch sizes, comma separated, each compiled for its own shape (default 1,8)",
    )
    parser.add_argument(
        "--repeats", type=int, default=10, help="timed calls per measurement (default 10)"
    )
    args = parser.parse_args()
    try:
        args.batches = [int(size) for size in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches must be whole numbers, comma separated, not {args.batches!r}")
    if not args.batches or min(args.batches) < 1 or args.repeats < 1:
        parser.error("--batches and --repeats must be at least 1")
    return report(args, measure, print_table)


if __name__ == "__main__":
    sys.exit(main())
