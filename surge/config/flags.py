"""Command-line flags generated from config dataclasses, so that a new option is one field.

A field becomes a flag when its metadata says so: `field(default=..., metadata=flag("help"))`.
The flag's name is the field's (`max_num_seqs` -> `--max-num-seqs`) unless `name=` says
otherwise; its type comes from the annotation (`int | None` parses an int) unless `parse=`
gives a function; a `bool` field is a switch (`negate=True`: a `--no-...` switch that sets it
False). A field holding a config dataclass is walked for its own flags, which go in the
argument group its `group(title, prefix=...)` metadata names (else the parent's), so `--help`
reads one group per nested config. `config_from_args` builds the config back from the parsed
namespace, and `overrides_from_args` gives only the flags a user passed, for configs that
also come from a file (the gateway's).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from surge.config.settings import env_value

FLAG = "surge.flag"
GROUP = "surge.group"
_FIELD: Any = object()  # "the field's own default" (a flag's default may legitimately be None)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Flag:
    help: str | None = None
    name: str | None = None  # the flag without "--" and the group's prefix; None: the field's
    parse: Callable[[str], Any] | None = None  # argparse `type`: one value (one item if many)
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    default: Any = _FIELD  # the flag's default when not the field's; a callable is called
    env: str | None = None  # an environment variable that gives the default
    repeat: bool = False  # repeatable (`action="append"`); the field gets a tuple/frozenset
    nargs: str | None = None  # "+": several values after one flag
    negate: bool = False  # a switch that sets a True-by-default bool field to False
    to_field: Callable[[Any], Any] | None = None  # the parsed value -> the field's value
    group: str | None = None  # an argument group of its own (else the config's)


@dataclass(frozen=True, slots=True)
class Group:
    title: str | None = None
    prefix: str = ""  # put before the nested config's flag names, e.g. "embedding-"


def flag(help: str | None = None, **options: Any) -> dict[str, Flag]:
    """Field metadata that makes the field a flag (see Flag for the options)."""
    return {FLAG: Flag(help, **options)}


def group(title: str | None = None, *, prefix: str = "") -> dict[str, Group]:
    """Field metadata for a nested config: its flags' argument group and name prefix."""
    return {GROUP: Group(title, prefix)}


def each(parse: Callable[[str], T]) -> Callable[[list[str]], tuple[T, ...]]:
    """to_field for a repeatable flag whose every value is parsed when the config is built."""

    def parse_all(values: list[str]) -> tuple[T, ...]:
        return tuple(parse(v) for v in values)

    return parse_all


@dataclass(frozen=True, slots=True)
class Leaf:
    """One flag: where its value goes in the config, and how argparse reads it."""

    path: tuple[str, ...]
    field: dataclasses.Field[Any]
    hint: Any
    flag: Flag
    option: str
    title: str

    @property
    def dest(self) -> str:
        return self.option[2:].replace("-", "_")

    @property
    def is_switch(self) -> bool:
        return self.flag.negate or self.hint is bool

    @property
    def is_many(self) -> bool:
        return self.flag.repeat or self.flag.nargs is not None


def leaves(
    cls: type, title: str, *, prefix: str = "", path: tuple[str, ...] = ()
) -> Iterator[Leaf]:
    """Every flag of `cls` and of the configs nested in it, in field order."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if (fl := f.metadata.get(FLAG)) is not None:
            option = "--" + prefix + (fl.name or f.name.replace("_", "-"))
            yield Leaf((*path, f.name), f, hint, fl, option, fl.group or title)
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            g = f.metadata.get(GROUP) or Group()
            yield from leaves(
                hint, g.title or title, prefix=prefix + g.prefix, path=(*path, f.name)
            )


def add_config_args(
    parser: argparse.ArgumentParser, cls: type, title: str, *, unset: bool = False
) -> None:
    """Add `cls`'s flags to `parser`, in argument groups by title (`title` for the top level).
    unset: every default is None ("not given"), for `overrides_from_args`."""
    groups = {g.title: g for g in parser._action_groups if g.title}
    for leaf in leaves(cls, title):
        g = groups.get(leaf.title) or groups.setdefault(
            leaf.title, parser.add_argument_group(leaf.title)
        )
        kwargs = _argparse_kwargs(leaf)
        if unset:
            kwargs["default"] = None
        g.add_argument(leaf.option, dest=leaf.dest, **kwargs)


def _argparse_kwargs(leaf: Leaf) -> dict[str, Any]:
    fl = leaf.flag
    if leaf.is_switch:
        if not fl.negate and _field_default(leaf.field) is not False:
            raise TypeError(
                f"{leaf.option}: a switch for a field that defaults to True needs negate=True"
            )
        return {"action": "store_true", "help": fl.help}
    kwargs: dict[str, Any] = {"help": fl.help, "default": _cli_default(leaf)}
    if fl.metavar is not None:
        kwargs["metavar"] = fl.metavar
    if fl.choices is not None:
        kwargs["choices"] = fl.choices
    if fl.repeat:
        kwargs["action"] = "append"
    if fl.nargs is not None:
        kwargs["nargs"] = fl.nargs
    if fl.parse is not None:
        kwargs["type"] = fl.parse
    elif not leaf.is_many:
        kind = _scalar(leaf.hint)  # None: the text itself, for to_field to read
        if kind is None and fl.to_field is None:
            raise TypeError(f"{leaf.option}: give parse= or to_field= for a {leaf.hint} field")
        if kind in (int, float):
            kwargs["type"] = kind
    return kwargs


def _cli_default(leaf: Leaf) -> Any:
    fl = leaf.flag
    if fl.default is not _FIELD:
        value = fl.default() if callable(fl.default) else fl.default
    elif leaf.is_many:
        value = []
    else:
        value = _field_default(leaf.field)
    if fl.env is not None and not leaf.is_many:
        value = env if (env := env_value(fl.env)) is not None else value
    return value


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _scalar(hint: Any) -> type | None:
    """int for `int` or `int | None`; None for anything that needs a parse function."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else None
    return hint if hint in (int, float, str) else None


def leaf_value(leaf: Leaf, args: argparse.Namespace) -> Any:
    """The field's value from what argparse parsed."""
    value = getattr(args, leaf.dest)
    fl = leaf.flag
    if fl.negate:
        value = not value
    if leaf.is_many and not value and fl.env and (env := env_value(fl.env)):
        value = [env]
    if fl.to_field is not None:
        return fl.to_field(value)
    if leaf.is_many:
        container = get_origin(leaf.hint) or tuple
        return container(value or ())
    return value


def config_from_args(
    cls: type[T], args: argparse.Namespace, title: str, overrides: Mapping[str, Any] = {}
) -> T:
    """`cls` built from every flag's value, then `overrides` ("a.b": value) on top."""
    tree: dict[str, Any] = {}
    for leaf in leaves(cls, title):
        _put(tree, leaf.path, leaf_value(leaf, args))
    for dotted, value in overrides.items():
        _put(tree, tuple(dotted.split(".")), value)
    return _construct(cls, tree)


def overrides_from_args(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """Only the flags given (parsed with unset=True), as a mapping nested like `cls`."""
    tree: dict[str, Any] = {}
    for leaf in leaves(cls, ""):
        if getattr(args, leaf.dest) is not None:
            _put(tree, leaf.path, leaf_value(leaf, args))
    return tree


def _put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _construct(cls: type, tree: Mapping[str, Any]) -> Any:
    hints = get_type_hints(cls)
    kwargs = {}
    for name, value in tree.items():
        hint = hints[name]
        nested = isinstance(hint, type) and dataclasses.is_dataclass(hint)
        kwargs[name] = _construct(hint, value) if nested and isinstance(value, dict) else value
    return cls(**kwargs)
