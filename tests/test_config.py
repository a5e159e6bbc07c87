"""pipelines.config: a dataclass's fields as command-line options, all of them or a chosen few."""
import argparse

import pytest

from pipelines.config import add_arguments, build_parser
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


def test_run_command_prints_the_summary_or_maps_the_error_to_its_exit_code(capsys):
    from dataclasses import dataclass

    from pipelines.config import field, run_command

    @dataclass
    class Options:  # a stage's config: every one has `verbose` (run_command sets the noise from it)
        fail: str = field("", help="raise this")
        verbose: bool = field(False, help="verbose")

    def run(options):
        if options.fail:
            raise {"value": ValueError, "missing": FileNotFoundError, "runtime": RuntimeError}[options.fail]("why")
        return 7

    codes = {(FileNotFoundError, ValueError): 2, RuntimeError: 1}
    assert run_command(Options, [], "test", run, lambda r: f"result {r}", codes) == 0
    assert capsys.readouterr().out == "result 7\n"
    for fail, code in (("value", 2), ("missing", 2), ("runtime", 1)):
        assert run_command(Options, ["--fail", fail], "test", run, str, codes) == code
        err = capsys.readouterr().err
        assert err.endswith("ERROR why\n") and err.count("\n") == 1


def test_storage_options_are_a_repeatable_key_value_flag():
    import dataclasses

    from pipelines.config import parse_config, storage_options_field

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
    from pipelines.config import parse_config

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
        assert make().cache_dir == str(tmp_path / where)


def test_launch_settings_are_their_own_config_on_the_same_command_line(tmp_path):
    """``--spark-np`` and the other launch settings fill a LaunchConfig, the rank's settings a
    TrainConfig; the notebooks and tests build the same LaunchConfig directly."""
    import dataclasses

    from pipelines.config import parse_configs
    from pipelines.launch.config import LaunchConfig

    argv = ["--data", str(tmp_path), "--output", str(tmp_path / "o"), "--spark-np", "-3", "--max-failures", "2",
            "--slots-timeout", "5", "--batch-size", "4"]
    train, launch = parse_configs((TrainConfig, LaunchConfig), argv)
    assert launch == LaunchConfig(np=-3, slots_timeout=5.0, max_failures=2) and launch.world_size == 3
    assert train.batch_size == 4
    launch_fields = {f.name for f in dataclasses.fields(LaunchConfig)}
    assert launch_fields == {"np", "slots_timeout", "network_interface", "max_failures"}
    assert not launch_fields & {f.name for f in dataclasses.fields(TrainConfig)}
    runner = launch.runner(log_dir="logs")
    assert (runner.np, runner.max_failures, runner.slots_timeout_s, runner.log_dir) == (-3, 2, 5.0, "logs")


@pytest.mark.parametrize("args, message", [
    ({"np": 0, "network_interface": "eth0"}, "--network-interface applies to --spark-np runs"),
    ({"np": 0, "max_failures": 1}, "--max-failures applies to --spark-np runs"),
    ({"np": 2, "max_failures": -1}, "--max-failures must be >= 0"),
    ({"np": 2, "slots_timeout": 0}, "--slots-timeout must be positive"),
    ({"np": 1.5}, "--spark-np must be an integer"),
])
def test_launch_settings_refused(args, message):
    from pipelines.launch.config import LaunchConfig

    with pytest.raises(ValueError, match=message):
        LaunchConfig(**args)
