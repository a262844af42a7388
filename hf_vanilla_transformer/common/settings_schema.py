"""Settings declared once, as dataclass fields: each field's type, default, help text and check live in the
field itself (its `metadata`, as in fairseq's `gen_parser_from_dataclass`), and the command-line flags, the
checks a Python caller gets and the "None: as the preset says" copies of a recipe are generated from them.

    @dataclass
    class Settings:
        steps: int = setting(100, "optimizer updates", check=positive_int)

    add_arguments(parser, Settings)  # --steps, type positive_int, default 100, help "optimizer updates"
    check_settings(Settings(steps=0))  # ValueError: "--steps: '0' is not a positive integer (1 or more)"
"""

import argparse
import dataclasses
import typing
from collections.abc import Callable, Iterable
from typing import Any

# The metadata keys of a setting's field. CHECK: text -> value, refusing values no run could use (an argparse
# type, such as cli.positive_int).
HELP = "help"  # what the flag's --help says
CHECK = "check"
GROUP = "group"  # the --help section of the flag
FLAG = "flag"  # the flag's name, where it is not the field's name with dashes
ARGPARSE = "argparse"  # further add_argument keywords: choices, metavar, nargs, action, default


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    check: Callable[[str], Any] | None = None,
    group: str | None = None,
    flag: str | None = None,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    flag_default: Any = dataclasses.MISSING,
    **argparse_options: Any,
) -> Any:
    """A dataclass field that declares one setting: its default, help text, check, --help section and flag;
    `flag_default` is the flag's default where it is not the field's (the words of a dict the command line
    reads), and `argparse_options` further keywords of the flag's `add_argument`."""
    if flag_default is not dataclasses.MISSING:
        argparse_options["default"] = flag_default
    metadata = {HELP: help, CHECK: check, GROUP: group, FLAG: flag, ARGPARSE: argparse_options}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def flag_name(field: dataclasses.Field) -> str:
    """The command-line flag of a setting: its declared one, else `--` and the field's name with dashes."""
    return field.metadata.get(FLAG) or "--" + field.name.replace("_", "-")


def settings_fields(schema: Any) -> list[dataclasses.Field]:
    """The fields of `schema` (a dataclass or an instance) that declare a setting with a flag."""
    return [field for field in dataclasses.fields(schema) if HELP in field.metadata]


def _is_optional(field: dataclasses.Field) -> bool:
    return type(None) in typing.get_args(field.type)


def _is_bool(field: dataclasses.Field) -> bool:
    return field.type is bool or (_is_optional(field) and bool in typing.get_args(field.type))


def _field_default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def argument_options(field: dataclasses.Field) -> dict[str, Any]:
    """The keywords of `add_argument` for a setting: a switch for a bool that is off unless given, --X and
    --no-X for a bool that may be left to a preset (None), else a value read by the setting's check."""
    options: dict[str, Any] = {"help": field.metadata[HELP], "dest": field.name}
    if _is_bool(field):
        options["action"] = argparse.BooleanOptionalAction if _is_optional(field) else "store_true"
    else:
        options["default"] = _field_default(field)
        if field.metadata.get(CHECK) is not None:
            options["type"] = field.metadata[CHECK]
    return options | field.metadata.get(ARGPARSE, {})


def add_arguments(
    parser: argparse.ArgumentParser, schema: type, groups: Iterable[str] = (), skip: Iterable[str] = ()
) -> None:
    """One flag for every setting of `schema` (a dataclass) but those named in `skip`, in the --help section
    its field names: `groups` gives the order of the sections, which are made as the fields name them."""
    sections: dict[str | None, Any] = {None: parser}
    sections |= {title: parser.add_argument_group(title) for title in groups}
    for field in settings_fields(schema):
        title = field.metadata.get(GROUP)
        if title not in sections:
            sections[title] = parser.add_argument_group(title)
    # The usage line lists the flags section by section, as --help does.
    order = list(sections)
    for field in sorted(settings_fields(schema), key=lambda field: order.index(field.metadata.get(GROUP))):
        if field.name not in skip:
            sections[field.metadata.get(GROUP)].add_argument(flag_name(field), **argument_options(field))


def schema_values(schema: type, args: argparse.Namespace) -> dict[str, Any]:
    """The values that parsed `args` hold for the settings of `schema`, by field name."""
    return {
        field.name: getattr(args, field.name)
        for field in settings_fields(schema)
        if hasattr(args, field.name)
    }


def check_settings(settings: Any) -> None:
    """ValueError naming the flag of the first setting whose value its check refuses (None passes where the
    field may be None), with the same words as the command line's error for that value."""
    for field in settings_fields(settings):
        value, check = getattr(settings, field.name), field.metadata.get(CHECK)
        choices = field.metadata.get(ARGPARSE, {}).get("choices")
        if value is None and _is_optional(field):
            continue
        if choices is not None and value not in choices:
            raise ValueError(
                f"{flag_name(field)}: invalid choice {value!r} (choose from {', '.join(choices)})"
            )
        if check is None or isinstance(value, (list, dict)):
            continue
        try:
            check(str(value))
        except (argparse.ArgumentTypeError, ValueError) as error:
            raise ValueError(f"{flag_name(field)}: {error}") from None


def optional_copy(schema: type, name: str, exclude: Iterable[str] = ()) -> type:
    """A keyword-only dataclass with every setting of `schema` but `exclude`, each of type `T | None` and
    default None (the value `schema`'s instance holds), the same help and check: the settings a caller may
    change in a recipe (a preset), declared once, in the recipe."""
    fields = []
    for field in settings_fields(schema):
        if field.name not in exclude:
            optional = field.type if _is_optional(field) else field.type | None
            fields.append((field.name, optional, dataclasses.field(default=None, metadata=field.metadata)))
    copy = dataclasses.make_dataclass(name, fields, kw_only=True)
    copy.__module__ = schema.__module__
    return copy
