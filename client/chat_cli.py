"""``epd chat``: ask a running deployment about images, streaming the answer."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from epd.client.errors import EpdClientError
from epd.client.sdk import AsyncEpdClient, user


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``epd chat``."""
    parser.add_argument("question", help="the question")
    parser.add_argument("--image", action="append", default=[],
                        help="image path or URL; repeat for several")
    parser.add_argument("--endpoint", default=os.environ.get("EPD_ROUTE", "127.0.0.1:50050"),
                        help="route host:port (env EPD_ROUTE; default 127.0.0.1:50050)")
    parser.add_argument("--model", default="", help="model id (default: the only one)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--auth-token", default=os.environ.get("EPD_AUTH_TOKEN"),
                        help="bearer token (env EPD_AUTH_TOKEN)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Stream the answer to stdout; errors to stderr with their reason."""
    for image in args.image:
        if not image.startswith(("http://", "https://", "data:")) and not Path(image).is_file():
            print(f"epd chat: no such image file: {image}", file=sys.stderr)
            return 2
    return asyncio.run(_chat(args))


async def _chat(args: argparse.Namespace) -> int:
    async with AsyncEpdClient(args.endpoint, auth_token=args.auth_token) as client:
        try:
            async for chunk in client.stream([user(args.question, images=args.image)],
                                             model=args.model, max_tokens=args.max_tokens,
                                             temperature=args.temperature):  # fmt: skip
                print(chunk.text, end="", flush=True)
        except EpdClientError as e:
            print(f"\nepd chat: {e}", file=sys.stderr)
            return 1
    print()
    return 0
