"""--config FILE: a YAML file of flag values for any epd command, under the command line and the
EPD_* variables; unknown keys and bad values are usage errors naming them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

import epd.scheduler.cli as scheduler_cli
import epd.server.encode.cli as encode_cli
from epd.cli import main
from epd.common.config_file import config_arguments, load_config


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser()
    parsed.add_argument("--max-batch-size", type=int, default=0, help="(env EPD_MAX_BATCH_SIZE)")
    parsed.add_argument("--allow-local-files", action="store_true")
    parsed.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=True)
    parsed.add_argument("--engine-arg", action="append", default=[])
    parsed.add_argument("--cpus", nargs="+")
    return parsed


def arguments(document: dict[str, Any], environ: dict[str, str] | None = None) -> list[str]:
    return config_arguments(
        document,
        "encode",
        parser(),
        commands=("encode", "prefill", "model"),
        environ=environ or {},
        is_flag_elsewhere=lambda key: key == "kv-cache-mb",
    )


def test_values_become_arguments_for_each_kind_of_flag() -> None:
    document = {
        "max_batch_size": 4,
        "allow-local-files": True,
        "metrics": False,
        "engine-arg": ["a=1", "b=2"],
        "cpus": [0, 1],
    }
    assert arguments(document) == [
        "--max-batch-size=4",
        "--allow-local-files",
        "--no-metrics",
        "--engine-arg=a=1",
        "--engine-arg=b=2",
        "--cpus",
        "0",
        "1",
    ]


def test_the_commands_section_follows_the_shared_keys_and_other_sections_are_skipped() -> None:
    document = {"max-batch-size": 4, "encode": {"max-batch-size": 2}, "prefill": {"x": 1}}
    assert arguments(document) == ["--max-batch-size=4", "--max-batch-size=2"]


def test_a_set_variable_wins_over_the_file() -> None:
    assert arguments({"max-batch-size": 4}, {"EPD_MAX_BATCH_SIZE": "8"}) == []


def test_another_commands_flag_is_left_to_it_and_a_typo_is_refused() -> None:
    assert arguments({"kv-cache-mb": 64}) == []
    with pytest.raises(ValueError, match="max-bach-size: no epd command has a flag"):
        arguments({"max-bach-size": 4})
    with pytest.raises(ValueError, match="encode.kv-cache-mb: epd encode has no flag"):
        arguments({"encode": {"kv-cache-mb": 64}})


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"allow-local-files": "yes"}, "a switch takes true or false"),
        ({"max-batch-size": [1, 2]}, "takes one value, not a list"),
        ({"max-batch-size": {"a": 1}}, "not a mapping"),
    ],
)
def test_a_value_of_the_wrong_shape_is_refused(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        arguments(document)


@pytest.mark.parametrize(
    ("text", "message"),
    [("- a\n- b\n", "expected a mapping"), ("a: [\n", "not valid YAML")],
)
def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "epd.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_config(path)
    with pytest.raises(ValueError, match="No such file"):
        load_config(tmp_path / "absent.yaml")


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[argparse.Namespace]:
    """The arguments ``epd scheduler`` and ``epd encode`` would run with (nothing starts)."""
    seen: list[argparse.Namespace] = []
    for module in (scheduler_cli, encode_cli):
        monkeypatch.setattr(module, "run", lambda args: seen.append(args) or 0)
    monkeypatch.delenv("EPD_CONFIG", raising=False)
    monkeypatch.delenv("EPD_SCHEDULER_TTL_S", raising=False)
    monkeypatch.delenv("EPD_PORT", raising=False)
    return seen


def test_the_command_line_then_the_variable_then_the_file(
    ran: list[argparse.Namespace], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "epd.yaml"
    config.write_text("port: 7001\nttl-s: 11\nscheduler:\n  port: 7002\n")
    assert main(["scheduler", "--config", str(config)]) == 0
    assert (ran[-1].port, ran[-1].ttl_s) == (7002, 11)
    assert main(["scheduler", "--config", str(config), "--port", "7003"]) == 0
    assert ran[-1].port == 7003
    monkeypatch.setenv("EPD_SCHEDULER_TTL_S", "12")
    monkeypatch.setenv("EPD_CONFIG", str(config))
    assert main(["scheduler"]) == 0
    assert (ran[-1].port, ran[-1].ttl_s) == (7002, 12)


def test_a_required_flag_may_come_from_the_file(
    ran: list[argparse.Namespace], tmp_path: Path
) -> None:
    config = tmp_path / "epd.yaml"
    config.write_text(f"model: {tmp_path}\nencode:\n  max-batch-size: 3\n")
    assert main(["encode", "--config", str(config)]) == 0
    assert (ran[-1].model, ran[-1].max_batch_size) == (str(tmp_path), 3)


def test_a_bad_file_is_a_usage_error_naming_the_file_and_key(
    ran: list[argparse.Namespace], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "epd.yaml"
    config.write_text("scheduler:\n  max-batch-size: 3\n")
    assert main(["scheduler", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert f"--config {config}: scheduler.max-batch-size: epd scheduler has no flag" in error
    config.write_text("prot: 1\n")
    assert main(["scheduler", "--config", str(config)]) == 2
    assert "prot: no epd command has a flag --prot" in capsys.readouterr().err
    assert ran == []
