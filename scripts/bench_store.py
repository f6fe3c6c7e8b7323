"""Embedding store benchmark: one image's embeddings written to and read from Mooncake Store
(through a real master and segment holder on this machine, as ``epd up`` starts them; TCP on
loopback) against encoding the image again.

For each size: ``put`` is what an encoder's publisher does (pack the value with its digest, one
Mooncake put into the holder's segment); ``get`` is what a lookup does in its reader thread
(get_size, get, check the digest, unpack), by a second client, as another encoder would; both
clients lend no memory, as ``epd up``'s encoders. ``encode`` is the vision tower of the model
(``--model``, default the tiny one; ``epd model tiny --preset small`` builds a larger one) on
one image of ``--image-size`` pixels, prepared beforehand, and its embeddings' size is the
first row. Medians over ``--repeats``.

    .venv/bin/python scripts/bench_store.py [--model DIR] [--repeats N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from epd.launch.launcher import Deployment
from epd.launch.store_service import MasterAddress, start_store
from epd.server.encode.cache import CachedEmbedding
from epd.server.encode.vision import VisionEncoder
from epd.server.store.base import Lookup, Publish
from epd.server.store.client import Client, new_client
from epd.server.store.mooncake import read, write

# (label, rows, hidden, dtype): a Qwen2-VL-2B image of 448x448 is 256 rows of 1536
SIZES = [
    ("256x1536 bf16", 256, 1536, torch.bfloat16),
    ("256x1536 f32", 256, 1536, torch.float32),
    ("1024x3584 bf16", 1024, 3584, torch.bfloat16),
]
BUFFER_BYTES = 64 << 20
HOLDER_SEGMENT_MB = 256


def median_ms(run: Callable[[], Any], repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def joined(address: MasterAddress) -> Client:
    client = new_client()
    status = client.setup(
        "127.0.0.1", address.metadata_server, 0, BUFFER_BYTES, "tcp", "", address.master
    )
    if status != 0:
        raise SystemExit(f"bench_store: Mooncake setup failed ({status})")
    return client


def store_rows(
    writer: Client, reader: Client, entry: CachedEmbedding, label: str, repeats: int
) -> dict[str, Any]:
    mm_hash = os.urandom(16).hex()

    def put() -> None:
        assert write(writer, mm_hash, entry, BUFFER_BYTES) == Publish.STORED

    def get() -> None:
        assert read(reader, mm_hash, BUFFER_BYTES)[0] == Lookup.HIT

    put_ms = median_ms(put, repeats)
    return {
        "size": label,
        "bytes": entry.embeddings.nbytes,
        "put_ms": put_ms,
        "get_ms": median_ms(get, repeats),
    }


def encode_row(
    model: Path, image_size: int, repeats: int
) -> tuple[dict[str, Any], CachedEmbedding]:
    encoder = VisionEncoder(model, device="cpu")
    pixels = torch.randint(0, 255, (image_size, image_size, 3), dtype=torch.uint8)
    prepared = encoder.prepare(pixels)
    embeddings, grid = encoder.run([prepared])[0]
    encode_ms = median_ms(lambda: encoder.run([prepared]), repeats)
    entry = CachedEmbedding(embeddings, grid)
    label = f"{model.name} {image_size}px: {tuple(embeddings.shape)} {embeddings.dtype}"
    return {"size": label, "bytes": entry.embeddings.nbytes, "encode_ms": encode_ms}, entry


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    encoded, entry = encode_row(args.model, args.image_size, args.repeats)
    with tempfile.TemporaryDirectory() as run_dir:
        deployment = Deployment(Path(run_dir), dict(os.environ))
        store = start_store(deployment, HOLDER_SEGMENT_MB)
        try:
            await store.ready_args()
            address = store.master.address
            writer, reader = joined(address), joined(address)
            rows = [{**encoded, **store_rows(writer, reader, entry, "", args.repeats)}]
            for label, num_rows, hidden, dtype in SIZES:
                tensor = torch.randn(num_rows, hidden).to(dtype)
                rows.append(
                    store_rows(
                        writer, reader, CachedEmbedding(tensor, (1, 1, 1)), label, args.repeats
                    )
                )
            writer.close()
            reader.close()
        finally:
            deployment.stop(grace_s=10)
    rows[0]["size"] = encoded["size"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path(".epd/models/tiny"))
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    rows = asyncio.run(measure(args))
    if args.json:
        print(json.dumps({"rows": rows, "repeats": args.repeats}))
        return
    print(f"{'embeddings':<44} {'bytes':>10} {'put ms':>8} {'get ms':>8} {'encode ms':>10}")
    for row in rows:
        encode = f"{row['encode_ms']:.2f}" if "encode_ms" in row else "-"
        print(
            f"{row['size']:<44} {row['bytes']:>10} {row['put_ms']:>8.2f} {row['get_ms']:>8.2f} "
            f"{encode:>10}"
        )


if __name__ == "__main__":
    main()
