"""VllmOptions -> vLLM's engine arguments (built without starting anything), and the engine
arguments a user names, parsed by vLLM's own engine-args parser (the reasoning parser checked
against vLLM's registry).

vLLM picks its device from its build (its platform); ``check_platform`` refuses options for
another device before an engine is started on the wrong one.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epd.server.engine.device import device_type
from epd.server.engine.vllm_inputs import kv_transfer_config
from epd.server.engine.vllm_options import VllmOptions

# Engine arguments epd's own flags own, since epd reads the same fact outside vLLM.
OWNED = {"model": "--model (epd reads the model's tokenizer and config from it)"}
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
_UNSET = object()


def engine_args(model_dir: Path, model_id: str, options: VllmOptions) -> Any:
    """``AsyncEngineArgs`` for serving ``model_dir`` as ``model_id`` with ``options``.

    Settings left None (maximum model length, KV cache size, sequences, batched tokens) are
    vLLM's to choose for the model and the device. The KV buffer of a KV-transfer engine lives
    on the engine's device. The user's ``options.overrides`` win over every value epd computes.
    """
    from vllm import AsyncEngineArgs

    kv_config = None
    if options.kv_role:
        kv_config = kv_transfer_config(
            options.kv_role,
            lease_s=options.kv_lease_s,
            buffer_device=device_type(options.device),
        )
    epd_values: dict[str, Any] = dict(
        model=str(model_dir),
        served_model_name=model_id or model_dir.name,
        dtype=options.dtype,
        enforce_eager=options.enforce_eager,
        max_model_len=options.max_model_len,
        kv_cache_memory_bytes=options.kv_cache_bytes,
        gpu_memory_utilization=options.gpu_memory_utilization,
        tensor_parallel_size=options.tensor_parallel_size,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        enable_mm_embeds=True,
        limit_mm_per_prompt={
            "image": options.max_images_per_prompt,
            "video": options.max_videos_per_prompt,
        },
        disable_log_stats=False,
        kv_transfer_config=kv_config,
    )
    if options.reasoning_parser:
        epd_values["reasoning_parser"] = options.reasoning_parser
    return AsyncEngineArgs(**{**epd_values, **options.overrides})


def check_platform(device: str, platform_device_type: str) -> None:
    """ValueError unless vLLM's build runs on ``device`` (its platform's ``device_type``)."""
    if device_type(device) != platform_device_type:
        raise ValueError(
            f"this vLLM build runs on {platform_device_type or 'no device it recognises'}, "
            f"not {device} (scripts/install.sh --target cpu|cuda installs the build for a device)"
        )


def check_reasoning_parser(name: str | None) -> str | None:
    """``name`` if vLLM's registry holds such a reasoning parser (None: none asked); ValueError
    naming the flag and the parsers it holds otherwise (this imports vLLM when a name is
    given)."""
    if not name:
        return None
    from vllm.reasoning import ReasoningParserManager

    names = ReasoningParserManager.list_registered()
    if name not in names:
        raise ValueError(
            f"--reasoning-parser {name}: no such parser in vLLM; choose from {', '.join(names)}"
        )
    return name


def parse_engine_args(pairs: Sequence[str], cli_args: Sequence[str]) -> dict[str, Any]:
    """The ``AsyncEngineArgs`` fields a user set, with their typed values.

    ``pairs``: ``NAME=VALUE`` (NAME a field, ``_`` or ``-``; a flag field takes true/false);
    ``cli_args``: arguments in vLLM's CLI spelling (``--max-num-seqs 4``). Both go through
    vLLM's own engine-args parser; later ones win. Only the fields given are returned, not
    vLLM's defaults. ValueError naming an argument vLLM does not know or a value it refuses.
    """
    parser = _engine_parser()
    argv: list[str] = []
    for pair in pairs:
        argv += _as_cli(parser, pair)
    given = argparse.Namespace(**dict.fromkeys(vars(parser.parse_args([])), _UNSET))
    parser.parse_args([*argv, *cli_args], given)
    values = {name: value for name, value in vars(given).items() if value is not _UNSET}
    for name in values.keys() & OWNED.keys():
        raise ValueError(f"engine argument {name}: set it with {OWNED[name]}")
    return values


def _engine_parser() -> argparse.ArgumentParser:
    from vllm import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class Parser(FlexibleArgumentParser):  # type: ignore[misc]
        def error(self, message: str) -> Any:
            raise ValueError(f"vLLM engine arguments: {message}")

    parser: argparse.ArgumentParser = AsyncEngineArgs.add_cli_args(
        Parser(add_help=False, allow_abbrev=False)
    )
    return parser


def _as_cli(parser: argparse.ArgumentParser, pair: str) -> list[str]:
    name, is_pair, value = pair.partition("=")
    if not is_pair or not name:
        raise ValueError(f"--engine-arg {pair!r}: expected NAME=VALUE")
    option = "--" + name.strip().replace("_", "-")
    # NOTE: argparse has no public lookup of an option's action.
    actions = parser._option_string_actions
    action = actions.get(option)
    if action is None:
        near = difflib.get_close_matches(option, actions, n=1)
        hint = f" (did you mean {near[0][2:].replace('-', '_')}?)" if near else ""
        raise ValueError(f"--engine-arg {name}: vLLM has no engine argument {name}{hint}")
    if action.nargs != 0:
        return [f"{option}={value}"]
    flag = value.strip().lower()
    if flag in TRUE:
        return [option]
    if flag in FALSE:
        negative = "--no-" + option[2:]
        # NOTE: a store_true flag has no negative form; false is its default.
        return [negative] if negative in action.option_strings else []
    raise ValueError(f"--engine-arg {name}={value}: expected true or false")
