"""Secrets off command lines (issue 36 item 4): storage options from the environment
(``PIPELINES_STORAGE_OPTIONS``) or an owner-only file (``--storage-options-file``), a warning when
a command line carries one anyway (real ranks' command lines and output, Spark's UI redaction:
tests/ranks/test_secrets.py)."""
import json

import pytest

from pipelines.runtime.config import parse_configs
from pipelines.io.storage import StorageError
from pipelines.io.options import gather_options, read_options_file
from pipelines.training.config import TrainConfig
from tests.support.planted import ENV_SECRET, SECRET, URIS, options_file


def test_options_come_from_the_environment_the_file_and_the_flags_the_later_winning(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINES_STORAGE_OPTIONS", json.dumps({"access_key": "AKID", "secret_key": ENV_SECRET,
                                                                "region": "us-east-1"}))
    path = options_file(tmp_path, {"secret_key": SECRET, "region": "eu-west-1", "allow_bucket_creation": True,
                                   "connect_timeout": 2.5})
    (config,) = parse_configs((TrainConfig,), URIS + ["--storage-options-file", path,
                                                      "--storage-option", "region=eu-central-1"])
    assert config.storage_options == {"access_key": "AKID", "secret_key": SECRET, "region": "eu-central-1",
                                      "allow_bucket_creation": "true", "connect_timeout": "2.5"}
    assert gather_options([], None, "") == {}


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o666])
def test_an_options_file_others_may_read_or_write_is_refused_naming_the_fix(tmp_path, mode):
    path = options_file(tmp_path, {"secret_key": SECRET}, mode)
    with pytest.raises(StorageError, match=f"mode {mode:04o}.*chmod 600") as refused:
        read_options_file(path)
    assert SECRET not in str(refused.value)


def test_an_owner_only_file_is_read_and_a_link_or_a_folder_is_not(tmp_path):
    path = options_file(tmp_path, {"secret_key": SECRET}, 0o400)
    assert read_options_file(path) == {"secret_key": SECRET}
    (tmp_path / "link.json").symlink_to(path)
    for bad in (tmp_path / "link.json", tmp_path, tmp_path / "missing.json"):
        with pytest.raises(StorageError, match="--storage-options-file"):
            read_options_file(str(bad))


@pytest.mark.parametrize("text, why", [("[1, 2]", "JSON object"), ("{not json", "not JSON"),
                                       ('{"secret_key": ["S3CR3T-IN-A-LIST"]}', "must be a string"),
                                       ('{"secret_key": null}', "must be a string")])
def test_malformed_options_are_refused_without_their_values(tmp_path, text, why):
    path = tmp_path / "storage.json"
    path.write_text(text)
    path.chmod(0o600)
    for call in (lambda: read_options_file(str(path)), lambda: gather_options([], None, text)):
        with pytest.raises(StorageError, match=why) as refused:
            call()
        assert "S3CR3T" not in str(refused.value)


def test_a_secret_on_the_command_line_is_warned_of_once_and_never_shown(capsys, monkeypatch):
    from pipelines.runtime import config as config_module

    monkeypatch.setattr(config_module, "_warned", False)
    monkeypatch.delenv("HOROVOD_RANK", raising=False)
    parse_configs((TrainConfig,), URIS + ["--storage-option", "region=eu-west-1"])
    assert capsys.readouterr().err == ""  # nothing secret: nothing said
    parse_configs((TrainConfig,), URIS + ["--storage-option", f"secret_key={SECRET}",
                                          "--tracking-uri", f"http://alice:{SECRET}@127.0.0.1:5000"])
    err = capsys.readouterr().err
    assert "--storage-option, --tracking-uri put a secret on the command line" in err and "ps" in err
    assert SECRET not in err and "alice" not in err
    parse_configs((TrainConfig,), URIS + ["--storage-option", f"secret_key={SECRET}"])
    assert capsys.readouterr().err == ""  # once a process
