"""Typed configuration: one dataclass per stage, filled from the command line.

Each field becomes a ``--flag`` with ``metadata['help']`` (also ``flag``, ``choices``, ``const``: the value of the flag given alone, and for ``key_values``
fields ``file_flag``, ``file_help``, ``gather``). Option groups (``option_group``) list their flags under a
title, while flags and keywords stay flat. A config refuses a bad value where it is made, naming the option."""
from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import os
import sys
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union

from pipelines.runtime.checks import base_type, check_type, type_hints
from pipelines.runtime.environment import VERBOSE_ENV
from pipelines.runtime.errors import Refused, exit_status, is_refusal
from pipelines.runtime.logs import setup_logging
from pipelines.runtime.quiet import quiet_by_default
from pipelines.runtime.redact import redact_text

T = TypeVar("T")


def field(default: Any = dataclasses.MISSING, help: str = "", **kwargs: Any) -> Any:  # noqa: A002
    """A dataclass field with a help text for the command line (``required`` when no default)."""
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


def option_group(title: str) -> Any:
    """A config field that is a group of options (the field's type: a dataclass), listed under ``title`` in ``--help``."""
    return dataclasses.field(metadata={"group": title})


def option_fields(cls: Type[Any]) -> Iterator[Tuple[Optional[dataclasses.Field], dataclasses.Field, Any]]:
    """Every option of the config class ``cls`` in order, as ``(group, field, resolved type)``; ``group`` is None
    for a field of ``cls`` itself."""
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        if "group" not in f.metadata:
            yield None, f, hints[f.name]
            continue
        inner = type_hints(hints[f.name])
        for g in dataclasses.fields(hints[f.name]):
            yield f, g, inner[g.name]


def init_options(config: Any, options: Dict[str, Any]) -> None:
    """Set the fields of the frozen ``config`` from the flat keywords ``options``, then run ``__post_init__``.

    A group is made of its fields' options over the group given whole, if any (so ``dataclasses.replace`` works).

    Raises:
        TypeError: an unknown or missing option, or a group given whole that is not of its class.
        pipelines.runtime.errors.Refused: a value of the wrong type, or what a group's checks refuse."""
    cls: type = type(config)
    options, hints = dict(options), type_hints(cls)
    kinds = _option_types(cls)
    for name, value in options.items():
        if name in kinds:
            check_type(name, value, kinds[name])
    for f in dataclasses.fields(cls):
        if "group" in f.metadata:
            value = _make_group(f.name, hints[f.name], options)
        elif f.name in options:
            value = options.pop(f.name)
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}() missing required argument: {f.name!r}")
        object.__setattr__(config, f.name, value)
    if options:
        raise TypeError(f"{cls.__name__}() got unexpected keyword arguments: {', '.join(sorted(options))}")
    if hasattr(config, "__post_init__"):
        config.__post_init__()


_NOT_GIVEN = object()  # a group not given whole (None is a wrong value, not an absent one)


def _make_group(name: str, group: Type[Any], options: Dict[str, Any]) -> Any:
    """The group ``name`` of class ``group``: its options taken out of ``options``, over the group given whole.

    Raises:
        TypeError: the group given whole is not a ``group``."""
    mine = {g.name: options.pop(g.name) for g in dataclasses.fields(group) if g.name in options}
    given = options.pop(name, _NOT_GIVEN)
    if given is _NOT_GIVEN:
        return group(**mine)
    # else it would fail later, far from here (an AttributeError), or in replace() without the name
    if not isinstance(given, group):
        raise TypeError(f"{name}= must be a {group.__name__}, got {type(given).__name__}")
    return dataclasses.replace(given, **mine) if mine else given


@functools.lru_cache(maxsize=None)
def _option_types(cls: type) -> Dict[str, Any]:
    """Each option of the config class ``cls`` (its groups' too, flat) and its annotation."""
    return {f.name: tp for _, f, tp in option_fields(cls)}


def settle(config: Any, **values: Any) -> None:
    """Set fields of the frozen ``config`` from its own ``__post_init__``."""
    for name, value in values.items():
        object.__setattr__(config, name, value)


def verbose_field(shows: str) -> Any:
    """The ``verbose`` field of every stage (``--verbose`` / ``--no-verbose``): None until ``settle_verbose``."""
    return field(None, help=f"show {shows} and known harmless warnings (default: quiet, unless {VERBOSE_ENV}=1)")


def settle_verbose(verbose: Any, settings: Any) -> bool:
    """A config's ``verbose``: as given, else ``settings.verbose`` (``read_settings``)."""
    return settings.verbose if verbose is None else bool(verbose)



def build_parser(cls: Type[Any], description: str = "") -> argparse.ArgumentParser:
    """An ``argparse`` parser with one option per field of the dataclass ``cls``."""
    parser = argparse.ArgumentParser(description=description or (cls.__doc__ or "").split("\n")[0])
    add_arguments(parser, cls)
    return parser


def add_arguments(parser: argparse.ArgumentParser, cls: Type[Any], defaults: Mapping[str, Any] | None = None,
                  notes: Mapping[str, str] | None = None) -> None:
    """Add to ``parser`` one option per field of ``cls``, a group's fields under the group's title.

    ``defaults``: only the fields it names, in its order, with these defaults. ``notes``: text added to a help.

    Raises:
        KeyError: a name in ``defaults`` that is no field of ``cls`` or its groups."""
    options = {f.name: (group, f, tp) for group, f, tp in option_fields(cls)}
    if defaults is not None:
        for name, default in defaults.items():
            _, f, tp = options[name]
            _add_option(parser, f, tp, default, notes)
        return
    sections: Dict[str, Any] = {}
    for group, f, tp in options.values():
        if group is None:
            _add_option(parser, f, tp, f.default, notes)
            continue
        if group.name not in sections:
            sections[group.name] = parser.add_argument_group(group.metadata["group"])
        _add_option(sections[group.name], f, tp, f.default, notes)


def _add_option(parser: Any, f: dataclasses.Field, tp: Any, default: Any, notes: Mapping[str, str] | None) -> None:
    """Add the option of field ``f`` (annotated ``tp``) to ``parser`` or one of its groups."""
    flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
    tp = base_type(tp)
    if f.metadata.get("key_values"):  # repeatable KEY=VALUE, made a dict by parse_config
        parser.add_argument(flag, dest=f.name, action="append", metavar="KEY=VALUE", help=f.metadata.get("help", ""))
        if f.metadata.get("file_flag"):
            parser.add_argument(f.metadata["file_flag"], dest=f.name + _FILE, metavar="PATH",
                                help=f.metadata.get("file_help", ""))
        return
    required = default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    kwargs: dict[str, Any] = {"dest": f.name, "help": f.metadata.get("help", "") + (notes or {}).get(f.name, "")}
    if tp is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
        kwargs["default"] = default
    else:
        kwargs["type"] = tp
        if required:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
            if "default" not in kwargs["help"]:
                kwargs["help"] += " (default: %(default)s)"
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if "const" in f.metadata:  # the flag alone means this value
            kwargs.update(nargs="?", const=f.metadata["const"])
    parser.add_argument(flag, **kwargs)


def parse_config(cls: Type[T], argv: Sequence[str] | None = None, description: str = "") -> T:
    """Parse ``argv`` (default ``sys.argv[1:]``) into an instance of the dataclass ``cls``.

    Raises:
        SystemExit: exit 2 on unknown or malformed options, or when ``__post_init__`` raises ``Refused`` (one
            line, ``PROG: error: REASON``). Any other exception propagates."""
    return parse_configs((cls,), argv, description)[0]


def parse_configs(classes: Sequence[Type[Any]], argv: Sequence[str] | None = None,
                  description: str = "") -> Tuple[Any, ...]:
    """Parse ``argv`` into one instance of each class in ``classes`` (one command line), as ``parse_config``.

    Raises:
        SystemExit: as ``parse_config``."""
    parser = argparse.ArgumentParser(description=description or (classes[0].__doc__ or "").split("\n")[0])
    for cls in classes:
        add_arguments(parser, cls)
    values = vars(parser.parse_args(argv))
    warn_visible_secrets(parser.prog, sys.argv[1:] if argv is None else argv)
    try:
        return tuple(cls(**_field_values(cls, values)) for cls in classes)
    except Refused as exc:
        # one line, like every other refusal: the value was well-formed, so the usage text would
        # only bury the reason (argparse's own errors, an unknown option, still show it)
        parser.exit(2, f"{parser.prog}: error: {redact_text(str(exc))}\n")


_warned = False


def warn_visible_secrets(prog: str, argv: Sequence[str]) -> None:
    """Warn once per process (launcher or rank 0) on stderr when ``argv`` holds a secret: ``ps`` shows it to all."""
    global _warned
    if _warned or os.environ.get("HOROVOD_RANK", "0") != "0":
        return
    flags = set()
    for i, item in enumerate(argv):
        before = argv[i - 1] if i else ""
        pair = f"{before} {item}" if before.startswith("-") and not item.startswith("-") else item
        if redact_text(pair) != pair:  # a secret in the item, or the value of a secret flag (--token V)
            flags.add(item.split("=", 1)[0] if item.startswith("-") else before or "an argument")
    if flags:
        _warned = True
        sys.stderr.write(f"{prog}: warning: {', '.join(sorted(flags))} put a secret on the command line, which "
                         "every local user can read (ps, /proc): give storage credentials in --storage-options-file "
                         "(chmod 600) or the environment, MLflow's in MLFLOW_TRACKING_USERNAME and "
                         "MLFLOW_TRACKING_PASSWORD (docs/cluster.md, Secrets)\n")


_FILE = "__file"  # the dest suffix of a key_values field's file flag


def _field_values(cls: Type[Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The parsed ``values`` of ``cls``'s fields (its groups' too, flat), ``key_values`` ones gathered into dicts.

    Raises:
        Refused: what ``gather`` refuses (a pair without ``=``, an options file others may read, bad JSON)."""
    fields = [f for _, f, _ in option_fields(cls)]
    own = {f.name: values[f.name] for f in fields if f.name in values}
    for f in fields:
        if f.metadata.get("key_values") and f.name in own:
            own[f.name] = f.metadata["gather"](own[f.name] or [], values.get(f.name + _FILE))
    return own


def to_dict(config: Any) -> dict[str, Any]:
    """The config as a flat JSON-ready dict of its fields (a group's fields in its place), named as the flags."""
    flat: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if "group" in f.metadata:
            flat.update(to_dict(value))
        else:
            flat[f.name] = copy.deepcopy(value)
    return flat


def run_command(cls: Type[T], argv: Sequence[str] | None, stage: str, run: Callable[[T], Any],
                summarize: Callable[[Any], str],
                exit_codes: Mapping[Union[Type[BaseException], Tuple[Type[BaseException], ...]], int]) -> int:
    """The body of a stage's ``main``: parse, set quiet/verbose before TensorFlow or Spark load, log, run, print.

    Returns:
        0; 2 when ``run`` refused; the code of the first matching type in ``exit_codes`` (one log line); else 1
        after the redacted traceback."""
    config: Any = parse_config(cls, argv)
    quiet_by_default(config.verbose)
    log = setup_logging(stage)
    try:
        result = run(config)
    except Exception as exc:  # noqa: BLE001 - every exception ends the command with its exit code
        known = next((code for kinds, code in exit_codes.items() if isinstance(exc, kinds)), None)
        if known is None or is_refusal(exc):
            return exit_status(exc, log)
        log.error("%s", redact_text(str(exc)))
        return known
    print(summarize(result))
    return 0
