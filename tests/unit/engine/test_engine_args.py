"""vLLM engine arguments given by name (``--engine-arg``) or after ``--``: parsed by vLLM's own
parser, applied over epd's values, refused where they cannot apply. No engine is started."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from epd.launch import up_cli
from epd.launch.launcher import Deployment
from epd.launch.topology import Topology
from epd.launch.up_engine import engine_settings
from epd.server.decode import cli as decode_cli
from epd.server.engine.engine_cli import engine_options, transformers_options
from epd.server.prefill import cli as prefill_cli

pytest.importorskip("vllm")

from epd.server.engine.vllm_args import engine_args, parse_engine_args  # noqa: E402


def parse(*flags: str, command: str = "prefill") -> argparse.Namespace:
    """``flags`` as ``epd COMMAND`` parses them (subcommand parser, so ``--`` is its own)."""
    parser = argparse.ArgumentParser(prog="epd")
    sub = parser.add_subparsers(dest="command").add_parser(command)
    (prefill_cli if command == "prefill" else decode_cli).add_arguments(sub)
    return parser.parse_args([command, "--model", "/m", *flags])


def test_named_fields_parse_to_their_typed_values() -> None:
    values = parse_engine_args(
        ["max_num_seqs=3", "enable-prefix-caching=true", "enforce_eager=false"],
        ["--kv-cache-dtype", "fp8", "--limit-mm-per-prompt", '{"image": 2}'],
    )
    assert values == {
        "max_num_seqs": 3,
        "enable_prefix_caching": True,
        "enforce_eager": False,
        "kv_cache_dtype": "fp8",
        "limit_mm_per_prompt": {"image": 2},
    }


def test_only_the_fields_given_are_returned_and_the_later_wins() -> None:
    assert parse_engine_args([], []) == {}
    assert parse_engine_args(["max_num_seqs=3"], ["--max-num-seqs", "4"]) == {"max_num_seqs": 4}


@pytest.mark.parametrize(
    ("pairs", "cli_args", "message"),
    [
        (["max_num_seq=3"], [], "max_num_seq.*did you mean max_num_seqs"),
        ([], ["--max-num-seq", "3"], "unrecognized arguments: --max-num-seq"),
        (["max_num_seqs=many"], [], "--max-num-seqs: invalid int value: 'many'"),
        (["enforce_eager=maybe"], [], "enforce_eager=maybe: expected true or false"),
        (["kv_cache_dtype=int3"], [], "--kv-cache-dtype: invalid choice: 'int3'"),
        (["max_num_seqs"], [], "expected NAME=VALUE"),
        (["model=/other"], [], "model: set it with --model"),
        ([], ["stray"], "unrecognized arguments: stray"),
    ],
)
def test_a_bad_name_or_value_is_refused_by_name(
    pairs: list[str], cli_args: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_engine_args(pairs, cli_args)


def test_the_users_engine_args_win_over_epds_values(tmp_path: Path) -> None:
    args = parse(
        "--max-num-seqs",
        "8",
        "--engine-arg",
        "max_num_seqs=3",
        "--engine-arg",
        "quantization=fp8",
        "--",
        "--no-enforce-eager",
        "--kv-transfer-config",
        '{"kv_connector": "ExampleConnector", "kv_role": "kv_both"}',
    )
    built = engine_args(tmp_path, "tiny", engine_options(args, "kv_producer", "cpu"))
    assert (built.max_num_seqs, built.quantization, built.enforce_eager) == (3, "fp8", False)
    assert built.kv_transfer_config.kv_connector == "ExampleConnector"
    assert (built.dtype, built.kv_cache_memory_bytes) == ("float32", 256 << 20)
    assert engine_options(parse(), None, "cpu").overrides == {}


def test_vllm_gets_the_image_and_video_limits_per_prompt_explicitly(tmp_path: Path) -> None:
    from epd.server.engine.vllm_options import VllmOptions
    from epd.server.media.policy import DEFAULT_MAX_VIDEOS

    assert engine_args(tmp_path, "tiny", VllmOptions()).limit_mm_per_prompt == {
        "image": 8,
        "video": DEFAULT_MAX_VIDEOS,
    }
    options = VllmOptions(max_images_per_prompt=2, max_videos_per_prompt=1)
    assert engine_args(tmp_path, "tiny", options).limit_mm_per_prompt == {"image": 2, "video": 1}


def test_the_transformers_engine_refuses_engine_args() -> None:
    for flags in (["--engine-arg", "max_num_seqs=3"], ["--", "--max-num-seqs", "3"]):
        with pytest.raises(ValueError, match="transformers engine takes none"):
            transformers_options(parse("--engine", "transformers", *flags), "cpu")


@pytest.mark.parametrize("command", ["prefill", "decode"])
def test_a_misspelled_engine_arg_exits_2_before_any_engine_starts(
    command: str, tiny_model_dir: Path, monkeypatch, capsys
) -> None:
    from epd.server.engine.vllm_engine import VllmEngine

    async def no_start(*args: object, **kwargs: object) -> None:
        raise AssertionError("an engine was started")

    monkeypatch.setattr(VllmEngine, "start", no_start)
    cli = prefill_cli if command == "prefill" else decode_cli
    args = parse("--device", "cpu", "--engine-arg", "max_num_seq=3", command=command)
    args.model = tiny_model_dir
    assert cli.run(args) == 2
    assert "--engine-arg max_num_seq: vLLM has no engine argument" in capsys.readouterr().err
    args = parse("--device", "cpu", "--", "--enable-prefix-cache", command=command)
    args.model = tiny_model_dir
    assert cli.run(args) == 2
    assert "unrecognized arguments: --enable-prefix-cache" in capsys.readouterr().err


def test_prefill_with_transformers_and_engine_args_exits_2(tiny_model_dir: Path, capsys) -> None:
    args = parse("--engine", "transformers", "--device", "cpu", "--engine-arg", "max_num_seqs=3")
    args.model = tiny_model_dir
    assert prefill_cli.run(args) == 2
    assert "transformers engine takes none" in capsys.readouterr().err


def parse_up(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="epd")
    sub = parser.add_subparsers(dest="command").add_parser("up")
    up_cli.add_arguments(sub)
    return parser.parse_args(["up", *flags])


def test_epd_up_passes_engine_args_to_every_vllm_engine(tmp_path: Path, monkeypatch) -> None:
    args = parse_up("--engine-arg", "max_num_seqs=3", "--", "--enable-prefix-caching")
    _, flags = engine_settings(args, "cpu", 2)
    assert flags[-2:] == ("--engine-arg", "max_num_seqs=3")
    topology = Topology("epd", vllm_args=tuple(args.vllm_args))
    deployment = Deployment(tmp_path, {}, base_port=41000)
    monkeypatch.setattr(deployment, "_spawn", lambda command, log, mode, env: None)
    child = deployment.start("decode", 3, "decode", *flags, tail=topology.engine_tail())
    assert child.command[-2:] == ["--", "--enable-prefix-caching"]
    assert "--port" in child.command[: child.command.index("--")]
    assert Topology("epd").engine_tail() == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--engine-arg", "max_num_seq=3"), "vLLM has no engine argument max_num_seq"),
        (("--engine", "transformers", "--topology", "e-pd", "--", "--max-num-seqs", "3"), "none"),
    ],
)
def test_epd_up_refuses_bad_engine_args_before_starting_anything(
    flags: tuple[str, ...], message: str, tmp_path: Path, capsys
) -> None:
    args = parse_up("--run-dir", str(tmp_path), "--device", "cpu", *flags)
    assert up_cli.run(args) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
