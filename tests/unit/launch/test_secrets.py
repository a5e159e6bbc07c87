"""Secrets off command lines (issue 36 item 4): storage options from the environment
(``PIPELINES_STORAGE_OPTIONS``) or an owner-only file (``--storage-options-file``), a warning when
a command line carries one anyway (real ranks' command lines and output, Spark's UI redaction:
tests/ranks/test_secrets.py)."""
import json
import os

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


def test_an_owner_only_file_is_read_and_a_folder_or_a_missing_file_is_not(tmp_path):
    path = options_file(tmp_path, {"secret_key": SECRET}, 0o400)
    assert read_options_file(path) == {"secret_key": SECRET}
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo, 0o600)
    for bad, why in ((tmp_path, "not a regular file"), (fifo, "not a regular file"),
                     (tmp_path / "missing.json", "No such file")):
        with pytest.raises(StorageError, match=f"--storage-options-file {bad}.*{why}"):
            read_options_file(str(bad))


def kubernetes_secret(mount, mode):
    """A Secret's volume as Kubernetes writes it: ``KEY -> ..data/KEY``, ``..data -> ..TIMESTAMP``,
    the file in ``..TIMESTAMP`` with the Secret's ``defaultMode``."""
    stamped = mount / "..2026_12_06_07_00_00.123"
    stamped.mkdir(parents=True)
    final = stamped / "storage.json"
    final.write_text(json.dumps({"secret_key": SECRET}))
    final.chmod(mode)
    (mount / "..data").symlink_to(stamped.name)
    (mount / "storage.json").symlink_to("..data/storage.json")
    return mount / "storage.json", final


@pytest.mark.parametrize("mode", [0o400, 0o600])
def test_a_private_file_behind_links_is_read(tmp_path, mode):
    link, _ = kubernetes_secret(tmp_path / "secret", mode)
    assert read_options_file(str(link)) == {"secret_key": SECRET}
    (tmp_path / "twice.json").symlink_to(link)  # a link to the Secret's link: three hops
    assert read_options_file(str(tmp_path / "twice.json")) == {"secret_key": SECRET}


@pytest.mark.parametrize("mode", [0o644, 0o440, 0o604])
def test_a_file_others_may_read_behind_links_is_refused_naming_it_and_its_mode(tmp_path, mode):
    link, final = kubernetes_secret(tmp_path / "secret", mode)
    with pytest.raises(StorageError, match=f"{link} \\(-> {final}\\): others may read it "
                                           f"\\(mode {mode:04o}\\)") as refused:
        read_options_file(str(link))
    assert SECRET not in str(refused.value)


@pytest.mark.parametrize("mode", [0o400, 0o600])
def test_a_link_to_another_users_file_is_refused_naming_it(tmp_path, mode):
    link, final = kubernetes_secret(tmp_path / "secret", mode)
    other = os.getuid() + 4242
    if os.getuid() == 0:
        os.chown(final, other, -1)
        with pytest.raises(StorageError, match=f"-> {final}\\): another user's file \\(uid {other}, "
                                               f"mode {mode:04o}\\)"):
            read_options_file(str(link))
    else:  # only root may give a file away: the other user's file is one that exists already
        os.remove(final)
        final.symlink_to("/etc/passwd")
        with pytest.raises(StorageError, match="another user's file \\(uid 0"):
            read_options_file(str(link))


def test_a_dangling_link_or_a_loop_is_refused_naming_it(tmp_path):
    link, final = kubernetes_secret(tmp_path / "secret", 0o400)
    os.remove(final)
    with pytest.raises(StorageError, match=f"--storage-options-file {link} .*: a dangling link"):
        read_options_file(str(link))
    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    with pytest.raises(StorageError, match="--storage-options-file .*a.json.*symbolic links"):
        read_options_file(str(tmp_path / "a.json"))


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
