"""``epd generate``: answer one chat turn with images in-process with the reference engine.

A quick way to see the model work end to end without starting any service; the disaggregated
pipeline (``epd up``) must give the same greedy tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from epd.common.flags import refused
from epd.server.models.model_cli import add_model_arguments
from epd.server.models.model_dir import resolve_model

DEFAULT_MODEL_DIR = Path(".epd/models/tiny")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags of ``epd generate``."""
    parser.add_argument(
        "question",
        nargs="?",
        default="Describe this picture.",
        help="the user's question (default: 'Describe this picture.')",
    )
    add_model_arguments(
        parser,
        required=False,
        what=f"default: the tiny model in {DEFAULT_MODEL_DIR}, built there if absent",
    )
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        type=Path,
        help="image file to ask about; repeat for several (default: a generated test picture)",
    )
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens to generate")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...)")


def demo_image() -> Image.Image:
    """A deterministic 96x64 colour gradient, so the demo needs no file."""
    pixels = bytes(
        (x * 255 // 95) if c == 0 else (y * 255 // 63) if c == 1 else 128
        for y in range(64)
        for x in range(96)
        for c in range(3)
    )
    return Image.frombytes("RGB", (96, 64), pixels)


def load_images(paths: list[Path]) -> list[Image.Image]:
    """Open and decode ``paths`` as RGB; raises ValueError naming the bad file."""
    images = []
    for path in paths:
        try:
            with Image.open(path) as image:
                images.append(image.convert("RGB"))
        except (OSError, UnidentifiedImageError) as e:
            raise ValueError(f"cannot read image {path}: {e}") from e
    return images


def run(args: argparse.Namespace) -> int:
    """Build the tiny model if needed, generate, print the answer and token ids."""
    if args.max_tokens <= 0:
        return refused("generate", "--max-tokens must be positive")
    try:
        images = load_images(args.image) or [demo_image()]
    except ValueError as e:
        return refused("generate", e)
    if args.model is None and not (DEFAULT_MODEL_DIR / "config.json").exists():
        from epd.server.models.tiny.build import build_tiny_model

        print(f"building the tiny model in {DEFAULT_MODEL_DIR} ...", file=sys.stderr)
        build_tiny_model(DEFAULT_MODEL_DIR)
    try:
        model_dir = resolve_model(args.model or str(DEFAULT_MODEL_DIR), args.revision).path
    except ValueError as e:
        return refused("generate", e)
    from epd.server.engine.reference import ReferenceEngine

    start = time.monotonic()
    engine = ReferenceEngine(model_dir, device=args.device)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": args.question}]
    result = engine.generate(
        [{"role": "user", "content": content}], images, max_tokens=args.max_tokens
    )
    print(
        f"question: {args.question}  ({len(images)} image(s), {result.num_prompt_tokens} "
        f"prompt tokens)"
    )
    print(f"answer:   {result.text!r}")
    print(
        f"tokens:   {result.token_ids}  finish={result.finish_reason}  "
        f"in {time.monotonic() - start:.1f}s"
    )
    print("(the tiny model has random weights: the words are meaningless, the tokens exact)")
    return 0
