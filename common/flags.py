"""Flags declared once, on the options dataclass field they fill.

A field's ``metadata=flag(...)`` holds its help, its ``EPD_*`` environment variable and how the
command line spells it; the field owns the default. ``add_dataclass_arguments`` generates the
argparse flags of a dataclass from its fields, and ``from_arguments`` builds the dataclass back
from the parsed namespace (as vLLM generates its CLI from ``EngineArgs``' fields). A field
holding a dataclass of flags of its own (``metadata=flag_group()``) has them in its place. A flag
that fills no field (``--cpus``) is declared with ``add_flag`` from the same ``Flag`` record.

Every help ends with ``(env EPD_X; default D)``, which ``common/config_file.py`` and
``scripts/gen_flag_table.py`` read. The variable is the flag's fallback: read here, while the
parser is built, with the field's type; a malformed value is a ValueError naming the variable.
This module and the ``cli`` modules are the only readers of the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from epd.common.flag_types import (
    EXPECTED,
    Choices,
    EnumWord,
    Explained,
    NoneOr,
    parse_bool,
    shown,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
FLAG_KEY = "epd.flag"
GROUP_KEY = "epd.flag_group"


@dataclass(frozen=True, slots=True)
class Flag:
    """How one field is spelled on the command line.

    ``name``: the flag without its dashes when it is not the field's name. ``unit``: the field
    holds the flag's value times ``unit`` (a flag in MiB for a field in bytes). ``type``: parses
    the flag's and the variable's text, when the field's type cannot (a list in one text).
    ``default_help``: how the help states the default when its value cannot ("default: off");
    ``default_means``: what the default does, after it ("default auto: ..."). ``none_word``: the
    word that sets the field to None ("auto"). ``minimum``: the smallest value the variable may
    hold. ``negatable``: a switch that also has ``--no-NAME``. ``old_env``: a deprecated name of
    the variable, which wins when set (with a warning). ``repeatable``: the flag may be given
    several times, each value one item of the field (no variable). ``aliases``: more spellings
    of the flag, without their dashes (vLLM's ``served-model-name`` for ``model-id``).
    ``also_env``: variables read, in order, when ``env`` is unset (vLLM's ``VLLM_API_KEY``).
    """

    help: str
    env: str | None = None
    name: str | None = None
    unit: int | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    metavar: str | None = None
    default_help: str | None = None
    default_means: str | None = None
    none_word: str | None = None
    minimum: float | None = None
    negatable: bool = False
    old_env: str | None = None
    repeatable: bool = False
    aliases: tuple[str, ...] = ()
    also_env: tuple[str, ...] = ()


def flag(help: str, **spelling: Any) -> dict[str, Flag]:
    """The metadata of a field that a flag fills: ``field(default=..., metadata=flag(...))``;
    ``spelling`` takes ``Flag``'s other fields."""
    return {FLAG_KEY: Flag(help, **spelling)}


def flag_group() -> dict[str, bool]:
    """The metadata of a field holding a dataclass whose own fields declare flags:
    ``add_dataclass_arguments`` adds those flags in this field's place, and ``from_arguments``
    builds the field from them."""
    return {GROUP_KEY: True}


def flag_of(field: dataclasses.Field[Any]) -> Flag | None:
    """The flag that fills ``field``, or None when no flag does."""
    return field.metadata.get(FLAG_KEY)


def dest_of(field: dataclasses.Field[Any]) -> str:
    """The namespace attribute of ``field``'s flag."""
    spec = flag_of(field)
    return (spec.name if spec and spec.name else field.name).replace("-", "_")


def add_dataclass_arguments(
    container: argparse._ActionsContainer,
    cls: type,
    *,
    defaults: Mapping[str, Any] | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """Add a flag for each field of dataclass ``cls`` that has one, in field order (a flag
    group's flags in its place), but the fields in ``skip``. ``defaults``: field name -> a
    default other than the field's (a service's own port). ValueError naming a variable whose
    value is malformed."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.metadata.get(GROUP_KEY) and field.name not in skip:
            add_dataclass_arguments(container, hints[field.name])
        spec = flag_of(field)
        if spec is None or field.name in skip:
            continue
        default = (defaults or {}).get(field.name, field_default(field))
        if spec.unit and default is not None:
            default = default / spec.unit
        add_flag(
            container, dest_of(field), spec, default=default, kind=scalar_type(hints[field.name])
        )


def add_passed_on_arguments(
    container: argparse._ActionsContainer, cls: type, names: Mapping[str, str | None]
) -> None:
    """Flags of dataclass ``cls``'s fields ``names`` for a command that hands them on, when
    given, to the processes it starts (``epd up`` to its workers): they default to None and read
    no variable (the processes read their own). The help states the default of the field, or
    ``names[field]`` when that is not None."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        spec = flag_of(field)
        if spec is None or field.name not in names:
            continue
        note = names[field.name]
        spec = dataclasses.replace(
            spec, env=None, old_env=None, also_env=(), default_help=note or spec.default_help
        )
        kind = scalar_type(hints[field.name])
        add_flag(
            container, dest_of(field), spec, default=field_default(field), kind=kind, unset=True
        )


def from_arguments(cls: type[T], args: argparse.Namespace, **given: Any) -> T:
    """``cls`` built from the flags ``add_dataclass_arguments`` added (in their field's unit;
    a flag group's into its dataclass), and ``given`` for other fields; a field whose flag was
    not added keeps its default."""
    values = dict(given)
    for field in dataclasses.fields(cls):
        if field.metadata.get(GROUP_KEY) and field.name not in values:
            values[field.name] = from_arguments(typing.get_type_hints(cls)[field.name], args)
        spec = flag_of(field)
        if spec is None or field.name in values or dest_of(field) not in vars(args):
            continue
        value = getattr(args, dest_of(field))
        if value == "" and field.default is None:
            value = None  # NOTE: an empty text unsets a field that may be None, as in a variable
        if spec.unit and value is not None:
            value = int(value * spec.unit)
        values[field.name] = tuple(value) if spec.repeatable else value
    return cls(**values)


def add_flag(
    container: argparse._ActionsContainer,
    dest: str,
    spec: Flag,
    *,
    default: Any,
    kind: type,
    unset: bool = False,
) -> argparse.Action:
    """Add ``--DEST`` (dashes for underscores) of type ``kind`` (int, float, str, bool: a
    switch, or an Enum); its default is ``spec.env``'s value when that is set, else
    ``default``, or None when ``unset`` (the help still states ``default``). ValueError naming
    the variable when its value is malformed."""
    option = "--" + (spec.name or dest.replace("_", "-"))
    if isinstance(kind, enum.EnumMeta):
        return add_enum_flag(container, option, dest, spec, default=default, kind=kind)
    spellings = (option, *aliases_of(spec))
    parse = text_parser(spec, kind)
    value = None if unset else fallback(spec, option, default, parse)
    options: dict[str, Any] = {"dest": dest, "default": value, "help": help_text(spec, default)}
    if spec.repeatable:
        options.update(action="append", type=parse, default=list(value or ()))
    elif kind is bool:
        options["action"] = argparse.BooleanOptionalAction if spec.negatable else "store_true"
    elif spec.none_word:
        choices = spec.choices and Choices((spec.none_word, *spec.choices), (None,))
        options.update(type=NoneOr(spec.none_word, parse), choices=choices)
    else:
        options.update(type=parse, choices=spec.choices)
    if kind is not bool:
        options["metavar"] = spec.metavar
    return container.add_argument(*spellings, **options)


def aliases_of(spec: Flag) -> tuple[str, ...]:
    """The other option strings of ``spec``'s flag (``--served-model-name``)."""
    return tuple("--" + alias for alias in spec.aliases)


def fallback(spec: Flag, option: str, default: Any, parse: Callable[[str], Any]) -> Any:
    """The flag's default: its variable's value when that is set, else ``default`` (for a
    field that may be None, the word for None: argparse passes a text default through the
    flag's type)."""
    text, variable = environment_text(spec, option)
    if text:
        return environment_value(variable, spec, text, parse, spec.choices)
    return spec.none_word if default is None and spec.none_word else default


def environment_text(spec: Flag, option: str) -> tuple[str, str]:
    """The text of the flag's variable (empty when unset) and the variable's name: the
    deprecated ``old_env`` when it is set (with a warning), else ``env``, else the first of
    ``also_env`` that is set."""
    if spec.old_env and os.environ.get(spec.old_env):
        print(
            f"${spec.old_env} is deprecated: set {spec.env} (or {option}) instead",
            file=sys.stderr,
        )
        return os.environ[spec.old_env], spec.old_env
    for variable in (spec.env, *spec.also_env):
        if variable and os.environ.get(variable):
            return os.environ[variable], variable
    return "", spec.env or ""


def add_enum_flag(
    container: argparse._ActionsContainer,
    option: str,
    dest: str,
    spec: Flag,
    *,
    default: enum.Enum,
    kind: enum.EnumMeta,
) -> argparse.Action:
    """``add_flag`` for an enum field: its members (or ``spec.choices``) spelled by their label
    or value."""
    members: dict[str, Any] = {shown(member): member for member in (spec.choices or kind)}
    parse = EnumWord(members)
    value = shown(default)
    text, variable = environment_text(spec, option)
    if text:
        value = shown(environment_value(variable, spec, text, parse, None))
    return container.add_argument(
        option,
        *aliases_of(spec),
        dest=dest,
        # NOTE: argparse passes the text default through the type.
        default=value,
        type=parse,
        choices=Choices(tuple(members), tuple(members.values())),
        metavar=spec.metavar,
        help=help_text(spec, default),
    )


def environment_value(
    variable: str,
    spec: Flag,
    text: str,
    parse: Callable[[str], Any],
    choices: tuple[Any, ...] | None,
) -> Any:
    """The value of ``variable`` holding ``text``; ValueError naming it when malformed."""
    if text == spec.none_word:
        return None
    try:
        value = parse(text)
    except (ValueError, argparse.ArgumentTypeError) as e:
        expected = EXPECTED.get(parse)
        reason = f"must be {expected}, got {text!r}" if expected else f"{text!r}: {e}"
        raise ValueError(f"${variable} {reason}") from None
    if choices and value not in choices:
        names = ", ".join(str(getattr(c, "value", c)) for c in choices)
        raise ValueError(f"${variable} must be one of {names}, got {text!r}")
    if spec.minimum is not None and value < spec.minimum:
        raise ValueError(f"${variable} must be at least {spec.minimum:g}, got {value}")
    return value


def text_parser(spec: Flag, kind: type) -> Callable[[str], Any]:
    """What turns the flag's or the variable's text into its value."""
    if spec.type is not None:
        return Explained(spec.type)
    if spec.repeatable:
        return str
    if kind is bool:
        return parse_bool
    if spec.unit:
        return float
    return kind


def help_text(spec: Flag, default: Any) -> str:
    """``spec.help`` followed by ``(env EPD_X; default D)``."""
    parts = []
    if spec.env:
        switch = isinstance(default, bool) and not spec.negatable
        variables = " or ".join((spec.env, *spec.also_env))
        parts.append(f"env {variables}=1" if switch else f"env {variables}")
    if spec.old_env:
        parts.append(f"the old env {spec.old_env}, deprecated, wins when set")
    if default is None and spec.none_word:
        default = spec.none_word
    if spec.default_help is not None:
        parts.append(spec.default_help)
    elif default is not None and shown(default) != "":
        means = f": {spec.default_means}" if spec.default_means else ""
        parts.append(f"default {shown(default)}{means}")
    return f"{spec.help} ({'; '.join(parts)})" if parts else spec.help


def default_of(cls: type, name: str) -> Any:
    """The default of dataclass ``cls``'s field ``name``, for a flag declared apart from it
    (one flag for a field several dataclasses have); ValueError for a name that is not a field."""
    for field in dataclasses.fields(cls):
        if field.name == name:
            return field_default(field)
    raise ValueError(f"{cls.__name__} has no field {name!r}")


def field_default(field: dataclasses.Field[Any]) -> Any:
    """``field``'s default (its factory's value for a field with one); None without one."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def scalar_type(hint: Any) -> type:
    """The type a flag of a field annotated ``hint`` parses: ``int`` for ``int | None``."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    origin = typing.get_origin(hint)
    return typing.cast(type, origin or hint)


def refused(command: str, error: object) -> int:
    """Print ``epd COMMAND: ERROR`` on stderr, as every command reports a flag value (or a
    setting only its service can judge) that it refuses; 2, the exit status of such a refusal."""
    print(f"epd {command}: {error}", file=sys.stderr)
    return 2
