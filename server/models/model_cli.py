"""``--model`` and ``--revision``, shared by every command that loads a model."""

from __future__ import annotations

import argparse

from epd.server.models.model_dir import DEFAULT_REVISION, resolve_model

MODEL_HELP = (
    "model directory, or a Hugging Face hub id (ORG/NAME) taken from the hub cache (HF_HUB_CACHE "
    "or HF_HOME), downloaded there only when the cache lacks it and HF_HUB_OFFLINE is unset"
)


def add_model_arguments(parser: argparse.ArgumentParser, *, required: bool, what: str) -> None:
    """``--model`` (``what``: what the command loads of it, or its default) and ``--revision``."""
    parser.add_argument(
        "--model",
        required=required,
        metavar="DIR|ORG/NAME",
        help=f"{MODEL_HELP} ({what})",
    )
    parser.add_argument(
        "--revision",
        default=None,
        help=f"branch, tag or commit of a hub id's --model (default {DEFAULT_REVISION})",
    )


def resolve_model_arguments(args: argparse.Namespace) -> None:
    """Replace ``args.model`` by the model's directory, and an empty ``args.model_id`` by its
    default name (the hub id, or the directory's name); ValueError as ``resolve_model``'s."""
    model = resolve_model(args.model, args.revision)
    args.model = model.path
    args.model_id = args.model_id or model.model_id
