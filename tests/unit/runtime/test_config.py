"""pipelines.runtime.config: a dataclass's fields as command-line options, all of them or a chosen few."""
import argparse

import pytest

from pipelines.runtime.config import add_arguments, build_parser
from pipelines.training.config import TrainConfig


def test_chosen_fields_with_other_defaults_keep_the_fields_help_and_type():
    parser = argparse.ArgumentParser()
    add_arguments(parser, TrainConfig, {"threads": 1, "bind_cores": True, "batch_size": 32},
                  notes={"threads": "; here >= 1"})
    assert [a.dest for a in parser._actions[1:]] == ["threads", "bind_cores", "batch_size"]
    args = parser.parse_args([])
    assert (args.threads, args.bind_cores, args.batch_size) == (1, True, 32)
    args = parser.parse_args(["--threads", "3", "--no-bind-cores"])
    assert (args.threads, args.bind_cores) == (3, False)
    helps = {a.dest: a.help for a in parser._actions}
    full = {a.dest: a.help for a in build_parser(TrainConfig)._actions}
    assert helps["threads"] == full["threads"].replace(" (default: %(default)s)", "") + "; here >= 1 (default: %(default)s)"
    assert "(default: 32)" in parser.format_help().replace("\n", " ").replace("  ", " ")


def test_unknown_field_is_refused():
    with pytest.raises(KeyError):
        add_arguments(argparse.ArgumentParser(), TrainConfig, {"threadz": 1})


class _Known(RuntimeError):
    """A stage's known failure (as the ETL's NothingWritten): exit 1, its message says it all."""


def _raises(kind: str):
    """The exception ``run`` raises for ``--fail KIND``; an internal one chained to a cause, both
    quoting a secret, as a traceback of a real failure may."""
    from pipelines.runtime.errors import MissingInput, NotAFolder, Refused
    from pipelines.io.storage import StorageError
    from pipelines.training.data import DataError

    refusals = {"refused": Refused, "data": DataError, "storage": StorageError, "missing": MissingInput,
                "folder": NotAFolder}
    if kind in refusals:
        return refusals[kind]("why")
    if kind == "known":
        return _Known("why")
    internal = {"value": ValueError, "key": KeyError, "runtime": RuntimeError, "oserror": FileNotFoundError}[kind]
    try:
        raise OSError("cause with password=hunter2")
    except OSError as cause:
        try:
            raise internal("why: secret_key=S3CR3T")
        except Exception as exc:  # noqa: BLE001 - returned with its traceback and chained cause
            return exc


@pytest.mark.parametrize("fail, code, one_line", [
    ("refused", 2, True), ("data", 2, True), ("storage", 2, True), ("missing", 2, True), ("folder", 2, True),
    ("known", 1, True),
    ("value", 1, False), ("key", 1, False), ("runtime", 1, False), ("oserror", 1, False)])
def test_run_command_exit_2_for_a_refusal_alone_1_with_the_redacted_traceback_else(fail, code, one_line, capsys):
    """Only a Refused (any subclass) is bad input: one line, exit 2; a known failure type in
    ``exit_codes``, its code and one line; every other exception (a ValueError, a KeyError, a
    plain FileNotFoundError from inside the work) exit 1 and its whole traceback, chained cause
    included, with the secrets masked."""
    from dataclasses import dataclass

    from pipelines.runtime.config import field, run_command

    @dataclass
    class Options:  # a stage's config: every one has `verbose` (run_command sets the noise from it)
        fail: str = field("", help="raise this")
        verbose: bool = field(False, help="verbose")

    def run(options):
        if options.fail:
            raise _raises(options.fail)
        return 7

    codes = {_Known: 1}
    assert run_command(Options, [], "test", run, lambda r: f"result {r}", codes) == 0
    assert capsys.readouterr().out == "result 7\n"
    assert run_command(Options, ["--fail", fail], "test", run, str, codes) == code
    err = capsys.readouterr().err
    if one_line:
        assert err.endswith("ERROR why\n") and err.count("\n") == 1 and "Traceback" not in err, err
    else:
        assert "ERROR failed:\nTraceback (most recent call last):" in err, err
        assert "OSError: cause with password=***" in err and "direct cause" not in err  # the context, chained
        assert "secret_key=***" in err and "hunter2" not in err and "S3CR3T" not in err, err
        assert f"{type(_raises(fail)).__name__}: " in err.splitlines()[-1], err


def test_a_value_a_config_refuses_exits_2_and_an_internal_error_propagates():
    """parse_config turns a Refused from ``__post_init__`` into argparse's exit 2; a plain
    ValueError there is a bug in the config itself, not the user's input: it propagates (exit 1)."""
    import dataclasses

    from pipelines.runtime.config import parse_config
    from pipelines.runtime.errors import Refused

    @dataclasses.dataclass
    class Stage:
        n: int = 1

        def __post_init__(self):
            if self.n == 0:
                raise Refused("--n must not be 0")
            if self.n < 0:
                {}["no such key"]  # noqa: B018 - an internal bug
            if self.n > 9:
                raise ValueError("an internal check")

    assert parse_config(Stage, ["--n", "3"]).n == 3
    with pytest.raises(SystemExit) as exit_:
        parse_config(Stage, ["--n", "0"])
    assert exit_.value.code == 2
    with pytest.raises(KeyError):
        parse_config(Stage, ["--n", "-1"])
    with pytest.raises(ValueError, match="an internal check"):
        parse_config(Stage, ["--n", "10"])


def test_storage_options_are_a_repeatable_key_value_flag():
    import dataclasses

    from pipelines.runtime.config import parse_config
    from pipelines.io.options import storage_options_field

    @dataclasses.dataclass
    class Stage:
        output: str = "x"
        storage_options: dict = storage_options_field()

    assert parse_config(Stage, []).storage_options == {}
    assert parse_config(Stage, ["--storage-option", "region=eu-west-1", "--storage-option", "a=b=c"]
                        ).storage_options == {"region": "eu-west-1", "a": "b=c"}
    with pytest.raises(SystemExit) as exc:
        parse_config(Stage, ["--storage-option", "novalue"])
    assert exc.value.code == 2


@pytest.mark.parametrize("argv", [["--batch-size", "0"], ["--cache-dir", "s3://b/c"], ["--shuffle-buffer", "0"]])
def test_a_refused_value_is_one_line_and_exit_2(argv, capsys, tmp_path):
    """A well-formed option whose value the config refuses: the reason alone, no usage text."""
    from pipelines.runtime.config import parse_config

    with pytest.raises(SystemExit) as exit_:
        parse_config(TrainConfig, ["--data", str(tmp_path), "--output", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and ": error: --" in err, err


@pytest.mark.parametrize("where, refused", [
    ("afile", "is a file"), ("afile/sub/cache", "lies under the file"), ("folder", None),
    ("folder/new/cache", None), ("new", None)])
def test_cache_dir_must_be_able_to_become_a_folder(tmp_path, where, refused):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder").mkdir()
    make = lambda: TrainConfig(data=str(tmp_path), output=str(tmp_path / "out"), cache_dir=str(tmp_path / where))
    if refused:
        with pytest.raises(ValueError, match=f"--cache-dir {tmp_path / where} {refused}"):
            make()
    else:
        assert make().loader.cache_dir == str(tmp_path / where)


def test_launch_settings_are_their_own_config_on_the_same_command_line(tmp_path):
    """``--spark-np`` and the other launch settings fill a LaunchConfig, the rank's settings a
    TrainConfig; the notebooks and tests build the same LaunchConfig directly."""
    import dataclasses

    from pipelines.runtime.config import option_fields, parse_configs
    from pipelines.launch.config import LaunchConfig

    argv = ["--data", str(tmp_path), "--output", str(tmp_path / "o"), "--spark-np", "-3", "--max-failures", "2",
            "--slots-timeout", "5", "--batch-size", "4"]
    train, launch = parse_configs((TrainConfig, LaunchConfig), argv)
    assert launch == LaunchConfig(np=-3, slots_timeout=5.0, max_failures=2) and launch.world_size == 3
    assert train.fit.batch_size == 4
    launch_fields = {f.name for f in dataclasses.fields(LaunchConfig)}
    assert launch_fields == {"np", "slots_timeout", "network_interface", "max_failures", "min_np", "max_np",
                             "rendezvous_timeout", "stall_timeout"}
    assert not launch_fields & {f.name for _, f, _ in option_fields(TrainConfig)}
    runner = launch.runner(log_dir="logs")
    assert (runner.np, runner.max_failures, runner.slots_timeout_s, runner.log_dir) == (-3, 2, 5.0, "logs")


@pytest.mark.parametrize("args, message", [
    ({"np": 0, "network_interface": "eth0"}, "--network-interface applies to --spark-np runs"),
    ({"np": 0, "max_failures": 1}, "--max-failures applies to --spark-np runs"),
    ({"np": 2, "max_failures": -1}, "--max-failures must be >= 0"),
    ({"np": 2, "slots_timeout": 0}, "--slots-timeout must be a positive number of seconds"),
    ({"np": 1.5}, "--spark-np must be an integer"),
])
def test_launch_settings_refused(args, message):
    from pipelines.launch.config import LaunchConfig

    with pytest.raises(ValueError, match=message):
        LaunchConfig(**args)


# --- bad input from Python and the command line: numbers that are no amount, values of another type --

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("bounds", [dict(above=0), dict(at_least=0), dict(above=0, below=1), dict(at_least=0, below=1),
                                    dict(above=0, at_most=1024), dict(below=5), dict()])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_check_number_refuses_nan_and_infinities_whatever_the_bounds(bounds, value):
    """Every comparison with NaN is False: a check that asks whether a value is outside its range
    (``value < bound``) lets NaN through; check_number asks whether it is inside."""
    from pipelines.runtime.checks import check_number
    from pipelines.runtime.errors import Refused

    with pytest.raises(Refused, match=rf"^--some-rate must be .*, got {value}$"):
        check_number("some_rate", value, **bounds)
    check_number("some_rate", 0.5, **bounds)  # inside every one of them


@pytest.mark.parametrize("bounds, value, message", [
    (dict(above=0), 0.0, "--base-lr must be positive and finite, got 0.0"),
    (dict(above=0), -INF, "--base-lr must be positive and finite, got -inf"),
    (dict(at_least=0), -1.0, "--base-lr must be a finite number >= 0, got -1.0"),
    (dict(above=1), 1, "--base-lr must be a finite number > 1, got 1"),
    (dict(at_most=2.5), 3, "--base-lr must be a finite number <= 2.5, got 3"),
    (dict(at_least=0, below=1), 1.0, "--base-lr must be a number in [0, 1), got 1.0"),
    (dict(above=0, at_most=1024), NAN, "--base-lr must be a number in (0, 1024], got nan"),
    (dict(), INF, "--base-lr must be a finite number, got inf"),
    (dict(above=0), "0.1", "--base-lr must be positive and finite, got 0.1"),
    (dict(above=0), True, "--base-lr must be positive and finite, got True"),
])
def test_check_number_names_the_flag_and_the_range(bounds, value, message):
    from pipelines.runtime.checks import check_number
    from pipelines.runtime.errors import Refused

    with pytest.raises(Refused) as info:
        check_number("base_lr", value, **bounds)
    assert str(info.value) == message
    with pytest.raises(Refused, match=r"^--base-lr must be .*: why it matters$"):
        check_number("--base-lr", value, why="why it matters", **bounds)


@pytest.mark.parametrize("value, tp, message", [
    ("8", int, "n must be an int, got '8' (str)"), (None, int, "n must be an int, got None (NoneType)"),
    (2.5, int, "n must be an int, got 2.5 (float)"), (True, int, "n must be an int, got True (bool)"),
    (NAN, int, "n must be an int, got nan (float)"),
    ("0.1", float, "n must be a number (int or float), got '0.1' (str)"),
    (False, float, "n must be a number (int or float), got False (bool)"),
    ("no", bool, "n must be a bool (True or False), got 'no' (str)"),
    (1, bool, "n must be a bool (True or False), got 1 (int)"),
    (5, str, "n must be a str, got 5 (int)"),
    (2.5, "Optional[int]", "n must be an int or None, got 2.5 (float)"),
    ("yes", "Optional[bool]", "n must be a bool (True or False) or None, got 'yes' (str)"),
    ("x" * 100, int, "n must be an int, got '" + "x" * 56 + "... (str)"),
])
def test_check_type_refuses_a_value_of_another_type_naming_the_option(value, tp, message):
    from typing import Optional

    from pipelines.runtime.checks import check_type
    from pipelines.runtime.errors import Refused

    with pytest.raises(Refused) as info:
        check_type("n", value, {"Optional[int]": Optional[int], "Optional[bool]": Optional[bool]}.get(tp, tp))
    assert str(info.value) == message


@pytest.mark.parametrize("value, tp", [(8, int), (8, float), (0.5, float), (True, bool), ("", str),
                                       (None, "Optional[int]"), (3, "Optional[int]"), (None, "Optional[bool]"),
                                       ({"a": "b"}, "Dict[str, str]"), ("anything", "Dict[str, str]")])
def test_check_type_takes_its_types_and_leaves_others_to_the_field(value, tp):
    from typing import Dict, Optional

    from pipelines.runtime.checks import check_type

    check_type("n", value, {"Optional[int]": Optional[int], "Optional[bool]": Optional[bool],
                            "Dict[str, str]": Dict[str, str]}.get(tp, tp))


def _stage_configs(tmp_path):
    """Each stage's config class and the keywords that make a valid one."""
    from pipelines.etl.config import ETLConfig
    from pipelines.predict.config import PredictConfig

    return [(TrainConfig, dict(data=str(tmp_path), output=str(tmp_path / "out"), tracking=False)),
            (ETLConfig, dict(input=str(tmp_path), output=str(tmp_path / "out"), tracking=False)),
            (PredictConfig, dict(model="m", input=str(tmp_path), output=str(tmp_path / "out")))]


def test_every_float_option_of_every_stage_refuses_nan_and_infinities_naming_its_flag(tmp_path):
    """Fractions, sizes in MiB, rates, epochs, intervals: none is NaN or infinite (a stage's new float
    option is held to it too)."""
    from typing import Optional

    from pipelines.runtime.config import option_fields
    from pipelines.runtime.errors import Refused

    checked = []
    for cls, valid in _stage_configs(tmp_path):
        cls(**valid)
        for _, f, tp in option_fields(cls):
            if tp not in (float, Optional[float]):
                continue
            for value in (NAN, INF, -INF):
                with pytest.raises(Refused, match=rf"--{f.name.replace('_', '-')} .*got {value}"):
                    cls(**valid, **{f.name: value})
            checked.append(f.name)
    assert {"base_lr", "warmup_epochs", "min_delta", "checkpoint_every_minutes", "dropout", "fine_tune_lr",
            "test_fraction", "validation_fraction", "row_group_mb", "max_file_mb"} <= set(checked)


WRONG = {int: "8", float: "0.5", bool: "no", str: 5}  # a value of another type for each kind of option


def test_every_option_of_every_stage_refuses_a_value_of_another_type_naming_it(tmp_path):
    """From Python (a notebook), ``batch_size='8'`` or ``resume='no'`` is refused where it is given,
    naming the option, not later by a comparison or a truth test."""
    from typing import Optional

    from pipelines.runtime.config import option_fields
    from pipelines.runtime.errors import Refused

    checked = 0
    for cls, valid in _stage_configs(tmp_path):
        for _, f, tp in option_fields(cls):
            kind = next((k for k in WRONG if tp in (k, Optional[k])), None)
            if kind is None:
                continue  # a dict of storage options: its own checks
            wrong = WRONG[kind]
            with pytest.raises(Refused, match=rf"^{f.name} must be .*, got {wrong!r} \({type(wrong).__name__}\)$"):
                cls(**{**valid, f.name: WRONG[kind]})
            checked += 1
    assert checked > 60
