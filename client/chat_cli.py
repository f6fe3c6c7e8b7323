"""``epd chat``: ask a running deployment about images, streaming the answer."""

from __future__ import annotations

import argparse
import asyncio
import sys

from epd.client.errors import EpdClientError
from epd.client.messages import POLICIES, local_path, user
from epd.client.sdk import AsyncEpdClient
from epd.common.flags import Flag, add_flag, refused
from epd.common.ports import ROUTE_PORT

# NOTE: the client's options are the SDK's arguments, no dataclass of ours.
ENDPOINT = Flag("route host:port", env="EPD_ROUTE")
AUTH_TOKEN = Flag("bearer token", env="EPD_AUTH_TOKEN", aliases=("api-key",))
TLS_CA_FILE = Flag("PEM CA of the route's certificate; turns TLS on", env="EPD_TLS_CA")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``epd chat``."""
    parser.add_argument("question", help="the question")
    parser.add_argument(
        "--image", action="append", default=[], help="image path or URL; repeat for several"
    )
    parser.add_argument(
        "--video",
        action="append",
        default=[],
        help="video path or URL (mp4, mov, webm, matroska); repeat for several",
    )
    add_flag(parser, "endpoint", ENDPOINT, default=f"127.0.0.1:{ROUTE_PORT}", kind=str)
    parser.add_argument("--model", default="", help="model id (default: the only one)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default random)")
    parser.add_argument(
        "--policy",
        choices=[name for name in POLICIES if name],
        default="",
        help="this request's encoder assignment policy (default: the deployment's, its "
        "scheduler's --default-policy)",
    )
    parser.add_argument("--timeout-s", type=float, default=300.0, help="deadline (default 300)")
    add_flag(parser, "auth_token", AUTH_TOKEN, default=None, kind=str)
    add_flag(parser, "tls_ca_file", TLS_CA_FILE, default=None, kind=str)
    parser.add_argument(
        "--show-usage",
        action="store_true",
        help="print finish reason and token counts after the answer",
    )


def run(args: argparse.Namespace) -> int:
    """Stream the answer to stdout; errors to stderr with their reason."""
    for kind, sources in (("image", args.image), ("video", args.video)):
        for source in sources:
            try:
                path = local_path(source)
            except ValueError as e:
                return refused("chat", e)
            if path is not None and not path.is_file():
                return refused("chat", f"no such {kind} file: {source}")
    return asyncio.run(_chat(args))


async def _chat(args: argparse.Namespace) -> int:
    last = None
    async with AsyncEpdClient(
        args.endpoint,
        auth_token=args.auth_token,
        tls_ca_file=args.tls_ca_file,
        timeout_s=args.timeout_s,
    ) as client:
        try:
            async for chunk in client.stream(
                [user(args.question, images=args.image, videos=args.video)],
                model=args.model,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                seed=args.seed,
                encoder_policy=args.policy,
            ):
                print(chunk.text, end="", flush=True)
                last = chunk
        except EpdClientError as e:
            print(f"\nepd chat: {e}", file=sys.stderr)
            return 1
    print()
    if args.show_usage and last is not None:
        print(f"[finish={last.finish_reason} usage={last.usage}]", file=sys.stderr)
    return 0
