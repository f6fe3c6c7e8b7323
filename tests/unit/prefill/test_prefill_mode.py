"""A prefill worker's mode is its role: ``epd prefill --mode`` keeps its spellings, and a role no
PrefillService serves is refused when the configuration is built."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from epd.common.roles import PREFILL_MODES, Role
from epd.server.prefill.app import PrefillConfig
from epd.server.prefill.cli import add_arguments


def mode_flag() -> argparse.Action:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    (action,) = [a for a in parser._actions if "--mode" in a.option_strings]
    return action


def test_the_mode_flag_keeps_its_spellings_and_default() -> None:
    flag = mode_flag()
    assert list(flag.choices) == ["prefill", "prefill_decode", "encode_prefill"]
    assert flag.default == "prefill_decode" == PrefillConfig(Path("/m")).mode.label
    assert [flag.type(role.label) for role in PREFILL_MODES] == list(PREFILL_MODES)


@pytest.mark.parametrize("word", ["PREFILL", "pd", "", "decode"])
def test_another_spelling_of_the_mode_is_refused(word: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected one of prefill, prefill_decode"):
        mode_flag().type(word)


@pytest.mark.parametrize("role", [Role.ENCODE, Role.DECODE])
def test_a_role_no_prefill_worker_serves_is_refused(role: Role) -> None:
    with pytest.raises(ValueError, match=f"cannot serve the {role.label} role"):
        PrefillConfig(Path("/m"), role)
