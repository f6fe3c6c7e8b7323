"""JPEG decoding by the media path (Pillow) against torchvision's decoders, on CPU and (with
``--device cuda``) on the GPU with nvjpeg, same pictures, one run.

What it decides: whether ``epd encode`` should decode JPEGs on the GPU. Two facts do: the time
per image, and whether the pixels equal Pillow's. The mm_hash that names an image across the
deployment (route, encoders, the prefill's cache) is a hash of its decoded pixels, so a decoder
that differs from Pillow's by one level in one pixel names the same JPEG differently: an encoder
that decoded with it would refuse the route's mm_hash (MM_HASH_MISMATCH), and its embeddings
would not be the CPU encoders'. For each picture (a smooth gradient with noise, 4:2:0 and 4:4:4
chroma, 336x448 and 1080x1920, JPEG quality 90): milliseconds per image of each decoder, the
largest difference from Pillow's pixels and the share of values that differ. A decoder that
cannot run here (torchvision without its image extension, no CUDA) is reported as unavailable.

    .venv/bin/python scripts/bench_jpeg_decode.py [--device cuda] [--repeats N] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

from epd.server.media.decode import decode_image
from epd.server.media.policy import MediaPolicy

SIZES = ((336, 448), (1080, 1920))
SUBSAMPLINGS = {"4:2:0": 2, "4:4:4": 0}


def picture(height: int, width: int, subsampling: int) -> bytes:
    """A smooth gradient with noise (compresses like a photograph, unlike pure noise) as JPEG."""
    rng = np.random.default_rng(height)
    y, x = np.mgrid[0:height, 0:width]
    smooth = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    pixels = np.clip(smooth + rng.normal(0, 12, smooth.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90, subsampling=subsampling)
    return buffer.getvalue()


def decoders(device: str) -> dict[str, Callable[[bytes], np.ndarray] | str]:
    """Each decoder as bytes -> uint8 [height, width, 3] on the host, or why it cannot run."""
    policy = MediaPolicy()
    found: dict[str, Callable[[bytes], np.ndarray] | str] = {
        "pillow": lambda data: np.asarray(decode_image(data, policy))
    }
    try:
        from torchvision.io import decode_jpeg

        decode_jpeg(torch.frombuffer(bytearray(picture(8, 8, 2)), dtype=torch.uint8))
    except Exception as e:  # NOTE: torchvision absent, or built without its image extension
        found["torchvision_cpu"] = found["nvjpeg"] = f"unavailable: {type(e).__name__}"
        return found

    def on(where: str) -> Callable[[bytes], np.ndarray]:
        def decode(data: bytes) -> np.ndarray:
            encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            decoded: torch.Tensor = decode_jpeg(encoded, device=where)
            return decoded.permute(1, 2, 0).cpu().numpy()

        return decode

    found["torchvision_cpu"] = on("cpu")
    if not device.startswith("cuda") or not torch.cuda.is_available():
        found["nvjpeg"] = "unavailable: no CUDA device asked for or present"
    else:
        found["nvjpeg"] = on(device)
    return found


def ms_per_image(decode: Callable[[bytes], np.ndarray], data: bytes, repeats: int) -> float:
    decode(data)
    start = time.perf_counter()
    for _ in range(repeats):
        decode(data)
    return (time.perf_counter() - start) * 1000 / repeats


def measure(args: argparse.Namespace) -> dict[str, Any]:
    found = decoders(args.device)
    rows = []
    for height, width in SIZES:
        for chroma, subsampling in SUBSAMPLINGS.items():
            data = picture(height, width, subsampling)
            reference = np.asarray(decode_image(data, MediaPolicy()))
            row: dict[str, Any] = {"size": f"{height}x{width}", "chroma": chroma}
            for name, decode in found.items():
                if isinstance(decode, str):
                    row[name] = {"error": decode}
                    continue
                pixels = decode(data)
                difference = np.abs(pixels.astype(np.int16) - reference.astype(np.int16))
                row[name] = {
                    "ms": ms_per_image(decode, data, args.repeats),
                    "max_difference": int(difference.max()),
                    "differing_share": float((difference > 0).mean()),
                }
            rows.append(row)
    return {"device": args.device, "decoders": list(found), "rows": rows}


def print_table(figures: dict[str, Any]) -> None:
    names = figures["decoders"]
    print(f"{'picture':18}" + "".join(f"{name:>30}" for name in names))
    for row in figures["rows"]:
        cells = []
        for name in names:
            cell = row[name]
            cells.append(
                cell["error"][:29]
                if "error" in cell
                else f"{cell['ms']:.2f} ms, max {cell['max_difference']}, "
                f"{cell['differing_share']:.1%}"
            )
        print(f"{row['size'] + ' ' + row['chroma']:18}" + "".join(f"{c:>30}" for c in cells))
    print("each cell: ms per image, largest difference from Pillow, share of values that differ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--repeats", type=int, default=20, help="decodes timed per picture")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    figures = measure(args)
    if args.json:
        print(json.dumps(figures))
    else:
        print_table(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
