"""What a vLLM user types: vLLM's names of epd's flags and variables, ``epd --version``, and
the flag meant by a misspelt one."""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from epd import __version__
from epd.cli import main
from epd.common.flag_suggest import unrecognized_message
from epd.common.flags import add_dataclass_arguments, flag, from_arguments

ROOT = Path(__file__).resolve().parents[3]
TOKEN_VARIABLES = ("EPD_AUTH_TOKEN", "VLLM_API_KEY")


@pytest.fixture(autouse=True)
def no_token_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*TOKEN_VARIABLES, "EPD_CONFIG", "EPD_T_NAME"):
        monkeypatch.delenv(name, raising=False)


@dataclass(frozen=True, slots=True)
class Named:
    name: str = field(
        default="n",
        metadata=flag("a name", env="EPD_T_NAME", aliases=("label", "tag"), also_env=("T_NAME",)),
    )


def parsed(*flags: str) -> Named:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Named)
    return from_arguments(Named, parser.parse_args(list(flags)))


def test_every_alias_fills_the_field_and_the_help_shows_them() -> None:
    assert parsed().name == "n"
    assert parsed("--name", "a").name == "a"
    assert parsed("--label", "b").name == "b"
    assert parsed("--tag=c").name == "c"
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Named)
    text = " ".join(parser.format_help().split())
    assert "--name NAME, --label NAME, --tag NAME" in text
    assert "env EPD_T_NAME or T_NAME" in text


def test_the_other_variable_is_read_after_the_own_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T_NAME", "other")
    assert parsed().name == "other"
    monkeypatch.setenv("EPD_T_NAME", "own")
    assert parsed().name == "own"
    assert parsed("--label", "flag").name == "flag"


def command_parser(command: str) -> argparse.ArgumentParser:
    from epd.cli import COMMANDS

    parser = argparse.ArgumentParser(prog=f"epd {command}")
    __import__(COMMANDS[command][0], fromlist=["add_arguments"]).add_arguments(parser)
    return parser


@pytest.mark.parametrize("command", ["encode", "prefill", "decode", "route", "up"])
def test_served_model_name_is_model_id(command: str) -> None:
    parser = command_parser(command)
    model = [] if command == "up" else ["--model", "m"]
    args = parser.parse_args([*model, "--served-model-name", "qwen"])
    assert args.model_id == "qwen"
    assert "--served-model-name" in parser.format_help()


@pytest.mark.parametrize("command", ["scheduler", "encode", "prefill", "decode", "route", "up"])
def test_api_key_is_auth_token_and_vllm_api_key_its_variable(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = [] if command in ("up", "scheduler") else ["--model", "m"]
    args = command_parser(command).parse_args([*model, "--api-key", "k1"])
    assert args.auth_token == "k1"
    monkeypatch.setenv("VLLM_API_KEY", "k2")
    assert command_parser(command).parse_args(model).auth_token == "k2"
    monkeypatch.setenv("EPD_AUTH_TOKEN", "k3")
    assert command_parser(command).parse_args(model).auth_token == "k3"


def test_chat_takes_api_key() -> None:
    args = command_parser("chat").parse_args(["question", "--api-key", "k"])
    assert args.auth_token == "k"


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert __version__ == project["version"]
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"epd {project['version']}"


def test_a_misspelt_flag_names_the_one_meant(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["route", "--model", "m", "--modle-id", "x"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: epd route" in err
    assert "unrecognized arguments: --modle-id x (did you mean --model-id?)" in err


def test_a_misspelt_flag_of_a_subcommand_names_its_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["model", "tiny", "--out", "/nowhere", "--famly=qwen2_vl"])
    assert exit_info.value.code == 2
    assert "(did you mean --family?)" in capsys.readouterr().err


def test_a_misspelt_command_names_the_one_meant(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["rout", "--model", "m"])
    assert exit_info.value.code == 2
    assert "unknown command 'rout' (did you mean route?)" in capsys.readouterr().err


def test_suggestions_only_for_close_flags() -> None:
    options = ["--model-id", "--port", "--host"]
    assert unrecognized_message(["--zzz"], options) == "unrecognized arguments: --zzz"
    assert unrecognized_message(["--prot=3", "x"], options) == (
        "unrecognized arguments: --prot=3 x (did you mean --port?)"
    )
    assert unrecognized_message(["--prot", "--hots"], options) == (
        "unrecognized arguments: --prot --hots (--prot: did you mean --port?; --hots: did you "
        "mean --host?)"
    )
