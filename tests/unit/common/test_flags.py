"""Flags generated from the options dataclass fields they fill: help, default, variable and type
declared once on the field, the variable parsed with the field's type."""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass, field

import pytest

from epd.common.config_file import config_arguments
from epd.common.flags import (
    Flag,
    add_dataclass_arguments,
    add_flag,
    add_passed_on_arguments,
    flag,
    flag_group,
    from_arguments,
    refused,
)

MiB = 1 << 20


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split(","))


@dataclass(frozen=True, slots=True)
class Options:
    size_bytes: int = field(
        default=2 * MiB,
        metadata=flag("largest size, in MiB", env="EPD_T_SIZE_MB", name="size-mb", unit=MiB),
    )
    count: int = field(default=3, metadata=flag("how many", env="EPD_T_COUNT", minimum=1))
    ratio: float = field(default=0.5, metadata=flag("a share", env="EPD_T_RATIO"))
    port: int | None = field(
        default=None, metadata=flag("a port", env="EPD_T_PORT", default_help="default: off")
    )
    mode: str = field(default="a", metadata=flag("a mode", env="EPD_T_MODE", choices=("a", "b")))
    names: tuple[str, ...] = field(
        default=("x", "y"), metadata=flag("names", env="EPD_T_NAMES", type=words)
    )
    verbose: bool = field(default=False, metadata=flag("talk more", env="EPD_T_VERBOSE"))
    eager: bool | None = field(
        default=None, metadata=flag("run eagerly", env="EPD_T_EAGER", negatable=True)
    )
    internal: int = 7


VARIABLES = ("SIZE_MB", "COUNT", "RATIO", "PORT", "MODE", "NAMES", "VERBOSE", "EAGER", "EXTRA")


@pytest.fixture(autouse=True)
def no_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(f"EPD_T_{name}", raising=False)


def parser_of(**defaults: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser.add_argument_group("t"), Options, defaults=defaults)
    return parser


def parse(*argv: str) -> Options:
    return from_arguments(Options, parser_of().parse_args(list(argv)))


def helps() -> dict[str, str]:
    return {action.dest: action.help or "" for action in parser_of()._actions}


def test_no_flag_builds_the_dataclass_defaults() -> None:
    assert parse() == Options()


def test_flags_fill_their_fields_in_the_fields_unit() -> None:
    built = parse("--size-mb", "1.5", "--count", "4", "--port", "0", "--mode", "b")
    assert built.size_bytes == 3 * MiB // 2 and built.count == 4 and built.port == 0
    assert parse("--names", "p,q", "--verbose", "--no-eager").names == ("p", "q")
    assert parse("--verbose", "--no-eager").verbose and parse("--no-eager").eager is False


def test_a_field_without_a_flag_gets_none() -> None:
    assert "internal" not in {action.dest for action in parser_of()._actions}
    assert from_arguments(Options, parser_of().parse_args([]), internal=9).internal == 9


def test_the_help_names_the_variable_and_the_default() -> None:
    found = helps()
    assert found["size_mb"] == "largest size, in MiB (env EPD_T_SIZE_MB; default 2)"
    assert found["port"] == "a port (env EPD_T_PORT; default: off)"
    assert found["names"] == "names (env EPD_T_NAMES; default x,y)"
    assert found["verbose"] == "talk more (env EPD_T_VERBOSE=1; default off)"
    assert found["eager"] == "run eagerly (env EPD_T_EAGER)"


def test_variables_are_fallbacks_parsed_with_the_fields_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in [("SIZE_MB", "4"), ("COUNT", "5"), ("RATIO", "0.25"), ("PORT", "8")]:
        monkeypatch.setenv(f"EPD_T_{name}", value)
    monkeypatch.setenv("EPD_T_NAMES", "p")
    monkeypatch.setenv("EPD_T_VERBOSE", "true")
    monkeypatch.setenv("EPD_T_EAGER", "0")
    assert parse() == Options(4 * MiB, 5, 0.25, 8, "a", ("p",), True, False)
    assert parse("--count", "6").count == 6


def test_an_empty_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPD_T_PORT", "")
    assert parse().port is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("COUNT", "many", r"\$EPD_T_COUNT must be an integer, got 'many'"),
        ("COUNT", "0", r"\$EPD_T_COUNT must be at least 1, got 0"),
        ("RATIO", "half", r"\$EPD_T_RATIO must be a number"),
        ("MODE", "c", r"\$EPD_T_MODE must be one of a, b, got 'c'"),
        ("VERBOSE", "maybe", r"\$EPD_T_VERBOSE must be a boolean"),
    ],
)
def test_a_malformed_variable_is_named(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(f"EPD_T_{name}", value)
    with pytest.raises(ValueError, match=message):
        parser_of()


def test_a_default_other_than_the_fields_is_shown() -> None:
    action = next(a for a in parser_of(count=9)._actions if a.dest == "count")
    assert action.default == 9 and action.help == "how many (env EPD_T_COUNT; default 9)"


def test_a_flag_without_a_field(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    spec = Flag("extra", env="EPD_T_EXTRA", default_help="default: none")
    add_flag(parser, "extra_thing", spec, default=None, kind=str)
    assert parser.parse_args(["--extra-thing", "v"]).extra_thing == "v"
    monkeypatch.setenv("EPD_T_EXTRA", "w")
    parser = argparse.ArgumentParser()
    add_flag(parser, "extra_thing", spec, default=None, kind=str)
    assert parser.parse_args([]).extra_thing == "w"


def test_a_config_file_sets_generated_flags_and_the_variable_wins() -> None:
    parser = parser_of()
    document = {"size-mb": 3, "verbose": True, "eager": False, "count": 2}
    arguments = config_arguments(
        document,
        "t",
        parser,
        commands=["t"],
        environ={"EPD_T_COUNT": "5"},
        is_flag_elsewhere=lambda key: False,
    )
    built = from_arguments(Options, parser.parse_args(arguments))
    assert built.size_bytes == 3 * MiB and built.verbose and built.eager is False
    assert built.count == 3  # NOTE: the variable wins over the file (and is read by the parser)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True, slots=True)
class More:
    color: Color = field(default=Color.RED, metadata=flag("a color", env="EPD_T_COLOR"))
    kind: str | None = field(
        default=None,
        metadata=flag("a kind", env="EPD_T_KIND", choices=("x", "y"), none_word="auto"),
    )
    where: str = field(
        default="here", metadata=flag("a place", env="EPD_T_WHERE", old_env="EPD_T_OLD")
    )
    items: tuple[str, ...] = field(default=(), metadata=flag("an item", repeatable=True))
    label: str | None = field(default=None, metadata=flag("a label"))


def parse_more(*argv: str) -> More:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, More)
    return from_arguments(More, parser.parse_args(list(argv)))


@pytest.fixture
def more_variables(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("COLOR", "KIND", "WHERE", "OLD"):
        monkeypatch.delenv(f"EPD_T_{name}", raising=False)
    return monkeypatch


def test_enums_words_and_repeatable_flags(more_variables: pytest.MonkeyPatch) -> None:
    assert parse_more() == More()
    built = parse_more("--color", "blue", "--kind", "y", "--items", "a", "--items", "b")
    assert (built.color, built.kind, built.items) == (Color.BLUE, "y", ("a", "b"))
    assert parse_more("--kind", "auto").kind is None and parse_more("--label", "").label is None
    more_variables.setenv("EPD_T_COLOR", "blue")
    more_variables.setenv("EPD_T_KIND", "x")
    assert (parse_more().color, parse_more().kind) == (Color.BLUE, "x")
    with pytest.raises(SystemExit):
        parse_more("--kind", "z")


def test_an_old_variable_wins_with_a_warning(
    more_variables: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    more_variables.setenv("EPD_T_WHERE", "there")
    assert parse_more().where == "there"
    more_variables.setenv("EPD_T_OLD", "elsewhere")
    assert parse_more().where == "elsewhere"
    assert "$EPD_T_OLD is deprecated: set EPD_T_WHERE (or --where)" in capsys.readouterr().err


def test_passed_on_flags_default_to_none_and_read_no_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPD_T_COUNT", "5")
    parser = argparse.ArgumentParser()
    add_passed_on_arguments(parser, Options, {"count": None, "port": "default: theirs"})
    assert vars(parser.parse_args([])) == {"count": None, "port": None}
    found = {action.dest: action.help for action in parser._actions}
    assert found["count"] == "how many (default 3)" and found["port"] == "a port (default: theirs)"


@dataclass(frozen=True, slots=True)
class Grouping:
    before: int = field(default=1, metadata=flag("first"))
    inner: Options = field(default_factory=Options, metadata=flag_group())
    after: int = field(default=2, metadata=flag("last"))


def test_a_flag_group_has_its_flags_in_its_place_and_builds_its_dataclass() -> None:
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Grouping)
    dests = [action.dest for action in parser._actions if action.dest != "help"]
    assert dests == ["before", *(dest for dest in helps() if dest != "help"), "after"]
    built = from_arguments(Grouping, parser.parse_args(["--count", "4", "--after", "5"]))
    assert built == Grouping(inner=Options(count=4), after=5)
    given = from_arguments(Grouping, parser.parse_args([]), inner=Options(ratio=1.0))
    assert given.inner == Options(ratio=1.0)


def test_a_refusal_names_the_command_on_stderr_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert refused("encode", ValueError("--threads must be 0 (the default) or more")) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "",
        "epd encode: --threads must be 0 (the default) or more\n",
    )
