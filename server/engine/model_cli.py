"""``epd model``: build the local models tests and the embedded default run on."""

from __future__ import annotations

import argparse
import sys
import time

from epd.common.flags import refused
from epd.server.models.registry import FAMILIES
from epd.server.models.tiny.build import PRESETS, build_tiny_model, preset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``epd model tiny`` and its flags to ``parser``."""
    actions = parser.add_subparsers(dest="model_action", metavar="ACTION", required=True)
    tiny = actions.add_parser(
        "tiny",
        help="build a tiny random-weight checkpoint (real architecture, local tokenizer)",
        description="Build a random-weight checkpoint of a supported family deterministically, "
        "laid out as the hub's: same flags, same bytes.",
    )
    names = [family.name for family in FAMILIES]
    tiny.add_argument(
        "--family",
        choices=names,
        default=names[0],
        help=f"architecture family (default {names[0]}): "
        + ", ".join(f"{family.name} = {family.title}" for family in FAMILIES),
    )
    tiny.add_argument("--out", required=True, help="output directory (replaced if it exists)")
    tiny.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="tiny",
        help="'tiny' (default, ~2.5 MB, for tests) or 'small' (encoding costs "
        "real time, for benchmarks)",
    )
    tiny.add_argument("--hidden-size", type=int, help="language model width (head dim stays 64)")
    tiny.add_argument("--num-layers", type=int, help="language model depth")
    tiny.add_argument("--vision-depth", type=int, help="vision tower depth")
    tiny.add_argument("--vision-embed-dim", type=int, help="vision tower width")
    tiny.add_argument("--max-pixels", type=int, help="processor pixel budget per image")
    tiny.add_argument("--seed", type=int, help="random seed (default 0)")


def run(args: argparse.Namespace) -> int:
    """Build the model; print one progress line per step to stderr."""
    hidden = args.hidden_size
    try:
        config = preset(
            args.preset,
            hidden_size=hidden,
            num_heads=hidden // 64 if hidden else None,
            num_layers=args.num_layers,
            vision_depth=args.vision_depth,
            vision_embed_dim=args.vision_embed_dim,
            max_pixels=args.max_pixels,
            seed=args.seed,
            family=args.family,
        )
    except ValueError as e:
        return refused("model tiny", e)
    start = time.monotonic()

    def progress(message: str) -> None:
        print(f"[{time.monotonic() - start:5.1f}s] {message}", file=sys.stderr, flush=True)

    build_tiny_model(args.out, config, progress)
    return 0
