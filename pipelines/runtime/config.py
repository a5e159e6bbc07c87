"""Typed configuration: one dataclass per stage, filled from the command line.

Each field of a stage's dataclass becomes a ``--flag`` (underscores become dashes); its
``metadata['help']`` is the help text. Notebooks and tests build the same dataclass directly.
A field's metadata may also give its ``flag`` and ``choices``, and a repeatable ``KEY=VALUE``
field (``key_values``) a ``file_flag`` with its ``file_help`` and the ``gather(pairs, path)`` that
makes the dict (:func:`pipelines.io.options.storage_options_field`, every stage's).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from typing import Any, Callable, Mapping, Sequence, Tuple, Type, TypeVar, Union

from pipelines.runtime.environment import VERBOSE_ENV
from pipelines.runtime.errors import Refused, exit_status, is_refusal
from pipelines.runtime.logs import setup_logging
from pipelines.runtime.quiet import quiet_by_default
from pipelines.runtime.redact import redact_text

T = TypeVar("T")


def field(default: Any = dataclasses.MISSING, help: str = "", **kwargs: Any) -> Any:  # noqa: A002
    """A dataclass field with a help text for the command line (``required`` when no default)."""
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


def verbose_field(shows: str) -> Any:
    """The ``verbose`` field every stage has (``--verbose`` / ``--no-verbose``): None when not given,
    settled where the config is made by :func:`settle_verbose`."""
    return field(None, help=f"show {shows} and known harmless warnings (default: quiet, unless {VERBOSE_ENV}=1)")


def settle_verbose(verbose: Any, settings: Any) -> bool:
    """A config's ``verbose``: as given, else the environment's (``settings``:
    :func:`pipelines.runtime.environment.read_settings`)."""
    return settings.verbose if verbose is None else bool(verbose)


def _base_type(tp: Any) -> Any:
    """``Optional[int]`` -> ``int``; plain types unchanged."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp


def build_parser(cls: Type[Any], description: str = "") -> argparse.ArgumentParser:
    """An ``argparse`` parser with one option per field of the dataclass ``cls``."""
    parser = argparse.ArgumentParser(description=description or (cls.__doc__ or "").split("\n")[0])
    add_arguments(parser, cls)
    return parser


def add_arguments(parser: argparse.ArgumentParser, cls: Type[Any], defaults: Mapping[str, Any] | None = None,
                  notes: Mapping[str, str] | None = None) -> None:
    """Add to ``parser`` one option per field of the dataclass ``cls``, as :func:`build_parser` does.

    With ``defaults``, only the fields it names, in its order, each with that default instead of
    the field's (another program's defaults for the same settings: a benchmark's). ``notes`` add
    text to a field's help.

    Raises:
        KeyError: a name in ``defaults`` that is not a field of ``cls``.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    chosen = [(fields[name], default) for name, default in defaults.items()] if defaults is not None else \
        [(f, f.default) for f in fields.values()]
    for f, default in chosen:
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        tp = _base_type(hints[f.name])
        if f.metadata.get("key_values"):  # repeatable KEY=VALUE, made a dict by parse_config
            parser.add_argument(flag, dest=f.name, action="append", metavar="KEY=VALUE",
                                help=f.metadata.get("help", ""))
            if f.metadata.get("file_flag"):
                parser.add_argument(f.metadata["file_flag"], dest=f.name + _FILE, metavar="PATH",
                                    help=f.metadata.get("file_help", ""))
            continue
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
        parser.add_argument(flag, **kwargs)


def parse_config(cls: Type[T], argv: Sequence[str] | None = None, description: str = "") -> T:
    """Parse ``argv`` (default ``sys.argv[1:]``) into an instance of the dataclass ``cls``.

    Raises:
        SystemExit: on unknown or malformed options (argparse's usual exit code 2), or when the
            dataclass's ``__post_init__`` refuses a value (:class:`pipelines.runtime.errors.Refused`: one
            line, ``PROG: error: REASON``, exit 2). Any other exception propagates (a failure).
    """
    return parse_configs((cls,), argv, description)[0]


def parse_configs(classes: Sequence[Type[Any]], argv: Sequence[str] | None = None,
                  description: str = "") -> Tuple[Any, ...]:
    """Parse ``argv`` into one instance of each dataclass in ``classes`` (their fields are one
    command line: a stage's config and its launch settings), as :func:`parse_config` does.

    Raises:
        SystemExit: as :func:`parse_config`.
    """
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
    """Say once per process, on stderr, when the command line ``argv`` holds a secret
    (:func:`pipelines.runtime.redact.redact_text` would mask part of it: ``--storage-option secret_key=V``,
    ``--tracking-uri http://user:pw@host``): every local user can read it (``ps``). Said by the
    launching process and rank 0 only (``HOROVOD_RANK``), never with the secret."""
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
    """The parsed ``values`` of ``cls``'s fields; repeatable ``KEY=VALUE`` ones made a dict by
    their field's ``gather`` (the pairs and their file flag's path: e.g.
    :func:`pipelines.io.options.gather_given`, which adds the environment's).

    Raises:
        Refused: what ``gather`` refuses (:class:`pipelines.io.storage.StorageError`: a
            ``KEY=VALUE`` option without ``=``, an options file that others may read, malformed JSON).
    """
    own = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
    for f in dataclasses.fields(cls):
        if f.metadata.get("key_values") and f.name in own:
            own[f.name] = f.metadata["gather"](own[f.name] or [], values.get(f.name + _FILE))
    return own


def to_dict(config: Any) -> dict[str, Any]:
    """The dataclass as a JSON-ready dict (for manifests and reports)."""
    return dataclasses.asdict(config)


def run_command(cls: Type[T], argv: Sequence[str] | None, stage: str, run: Callable[[T], Any],
                summarize: Callable[[Any], str],
                exit_codes: Mapping[Union[Type[BaseException], Tuple[Type[BaseException], ...]], int]) -> int:
    """The body of a stage's ``main``: options into ``cls`` (:func:`parse_config`), the process's
    noise set by the config's ``verbose`` (:func:`pipelines.runtime.quiet.quiet_by_default`, before
    TensorFlow or Spark load), logging set up for ``stage``, ``run(config)``, then
    ``summarize(result)`` printed.

    Returns:
        0; 2 when ``run`` refused its input (:class:`pipelines.runtime.errors.Refused`), after one log line
        with the message; when it raised a failure of a type in ``exit_codes`` (checked in order:
        a known failure, whose message says it all), that code after one log line; 1 for any other
        exception, after its whole traceback, redacted (:func:`pipelines.runtime.errors.exit_status`).
    """
    config = parse_config(cls, argv)
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
