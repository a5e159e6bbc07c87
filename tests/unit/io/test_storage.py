"""pipelines.io.storage against the local disk and a real S3 API server (moto_server)."""
import os
import pickle

import pytest

from pipelines.io import storage
from pipelines.io.options import parse_options
from pipelines.io.storage import StorageError
from tests.support import s3server


def test_parse_options():
    assert parse_options(["endpoint_override=http://h:9000/?a=b", "region=eu-west-1"]) == {
        "endpoint_override": "http://h:9000/?a=b", "region": "eu-west-1"}
    for bad in (["region"], ["=x"], ["a=1", "a=2"]):
        with pytest.raises(StorageError):
            parse_options(bad)


@pytest.mark.parametrize("uri, scheme", [("/a/b", "file"), ("rel/x", "file"), ("file:///a/b", "file"),
                                         ("s3://bucket/k", "s3"), ("GS://b/k", "gs"), ("abfs://c/p", "abfs")])
def test_scheme_of(uri, scheme):
    assert storage.scheme_of(uri) == scheme
    assert storage.is_local(uri) == (scheme == "file")


def test_local_paths_resolve_to_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage.resolve("a/b").path == str(tmp_path / "a" / "b")
    assert storage.resolve(f"file://{tmp_path}/c/").uri == str(tmp_path / "c")
    assert storage.resolve("~/x").path == os.path.expanduser("~/x")
    with pytest.raises(StorageError, match="not used for local files"):
        storage.resolve(str(tmp_path), {"region": "x"})


def test_unknown_scheme_and_missing_backend_are_refused():
    with pytest.raises(StorageError, match="unknown scheme 'nosuch'"):
        storage.resolve("nosuch://b/k")
    with pytest.raises(StorageError, match="not installed"):
        storage.resolve("abfs://container/path")  # adlfs is not installed here


def _exercise(root: storage.Location) -> None:
    """The same operations on any backend, with values checked by hand."""
    root.join("a", "x.json").write_json({"é": 1})
    root.join("a", "_hidden.json").write_bytes(b"{}")
    root.join("a", "b", "y.bin").write_bytes(b"\x00" * 5)
    assert root.join("a", "x.json").read_json() == {"é": 1}
    assert root.join("a").is_dir() and root.join("a", "x.json").is_file() and not root.join("nope").exists()
    assert [f.name for f in root.join("a").files(".json")] == ["x.json"]
    assert [(i.base_name, i.size) for i in root.list() if i.size is not None and i.base_name == "y.bin"] == [("y.bin", 5)]
    assert root.join("a", "b", "y.bin").relative_to(root) == "a/b/y.bin"
    with pytest.raises(FileNotFoundError):
        root.join("missing.json").read_bytes()
    clone = pickle.loads(pickle.dumps(root))
    assert clone == root and clone.join("a", "x.json").read_json() == {"é": 1}
    root.join("a", "b").delete()
    assert not root.join("a", "b").exists() and root.join("a", "x.json").exists()
    root.join("missing").delete()  # nothing to delete is not an error


def test_local_backend(tmp_path):
    _exercise(storage.resolve(str(tmp_path / "root")))


def test_s3_backend_through_the_standard_environment(s3_bucket, tmp_path):
    root = storage.resolve(f"s3://{s3_bucket}/prefix/")
    assert root.uri == f"s3://{s3_bucket}/prefix" and root.scheme == "s3"
    storage.check_reachable(root, "--output")
    _exercise(root)
    local = tmp_path / "tree"
    (local / "d").mkdir(parents=True)
    (local / "d" / "f.txt").write_text("hello")
    root.join("up").upload(str(local))
    assert root.join("up", "d", "f.txt").read_bytes() == b"hello"
    root.join("up").download(str(tmp_path / "back"))
    assert (tmp_path / "back" / "d" / "f.txt").read_text() == "hello"


def test_storage_options_reach_the_backend(s3_server, s3_bucket):
    options = parse_options([f"endpoint_override={s3_server.endpoint}", "region=us-east-1",
                                     f"access_key={s3server.ACCESS_KEY}", f"secret_key={s3server.SECRET_KEY}"])
    root = storage.resolve(f"s3://{s3_bucket}/x", options)
    root.join("f").write_bytes(b"1")
    assert s3_server.client().get_object(Bucket=s3_bucket, Key="x/f")["Body"].read() == b"1"
    with pytest.raises(StorageError, match="cannot open the s3 filesystem"):
        storage.resolve(f"s3://{s3_bucket}/x", {"no_such_argument": "1"})


def test_missing_bucket_is_refused(s3_server):
    with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist on s3 at http://127.0.0.1"):
        storage.check_reachable(storage.resolve("s3://no-such-bucket/x"), "--output")


def test_wrong_credentials_are_refused(tmp_path):
    with s3server.authenticated_server(str(tmp_path / "moto.log")) as (server, key, secret, bucket):
        good = storage.resolve(f"s3://{bucket}/x", {"endpoint_override": server.endpoint, "access_key": key,
                                                    "secret_key": secret, "region": s3server.REGION})
        storage.check_reachable(good, "--data")
        bad = storage.resolve(f"s3://{bucket}/x", {"endpoint_override": server.endpoint, "access_key": key,
                                                   "secret_key": "wrong", "region": s3server.REGION})
        with pytest.raises(StorageError, match=f"--data s3://{bucket}/x: the store refused access"):
            storage.check_reachable(bad, "--data")


@pytest.mark.parametrize("uri, why", [
    ("s3://bucket", "the root of bucket 'bucket'"), ("s3://bucket/", "the root of bucket 'bucket'"),
    ("s3://bucket//", "the root of bucket 'bucket'"), ("gs://b", "the root of bucket 'b'"),
    ("gcs://b/", "the root of bucket 'b'"), ("memory://container", "the root of bucket 'container'"),
    ("hdfs://namenode:8020/", "the file system's root"), ("/", "the file system's root"),
    ("file:///", "the file system's root"), ("/proc", "a mount point"), ("~", "a home folder"),
    ("~/", "a home folder"), ("{tmp}/users", "a folder above a home folder"), ("{tmp}", "above a home folder")])
def test_a_root_is_refused_as_an_output(uri, why, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "users" / "me"))
    uri = uri.format(tmp=tmp_path)
    assert why in storage.root_refusal(uri)
    with pytest.raises(StorageError, match=f"--output {uri} is .*give a folder of its own below it"):
        storage.check_not_root(uri, "--output")


@pytest.mark.parametrize("uri", ["s3://bucket/etl", "s3://bucket/a/b/", "gs://b/k", "hdfs://nn:8020/data/etl",
                                 "/tmp/pipelines/etl", "file:///tmp/pipelines/etl", "~/pipelines-work/etl",
                                 "{tmp}/users/me/etl", "{tmp}/users/you"])
def test_a_folder_below_a_root_is_an_output(uri, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "users" / "me"))
    assert storage.root_refusal(uri.format(tmp=tmp_path)) is None


@pytest.mark.parametrize("uri, parsed", [
    ("s3://bkt/my photos/a.jpg", ("s3", "bkt/my photos/a.jpg")),
    ("s3://bkt/my%20photos/a.jpg", ("s3", "bkt/my%20photos/a.jpg")),  # literal: not decoded
    ("s3://bkt/q?x=1#y/a b+c.jpg/", ("s3", "bkt/q?x=1#y/a b+c.jpg")),  # '?' and '#' are part of the key
    ("S3://bkt/k", ("s3", "bkt/k")), ("gcs://b/k", ("gs", "b/k")),
    ("file:///tmp/my%20photos", ("file", "/tmp/my%20photos")), ("/tmp/a b/", ("file", "/tmp/a b"))])
def test_one_parse_of_a_uri(uri, parsed):
    assert storage.split_uri(uri) == parsed


@pytest.mark.parametrize("with_options", [False, True], ids=["environment", "storage-options"])
def test_a_key_means_one_thing_with_or_without_options(s3_server, s3_bucket, with_options):
    """``my photos`` and ``my%20photos`` are two keys, each named literally, whether the store
    comes from the environment or from --storage-option (pyarrow's URI parser refused the first
    and decoded the second without options)."""
    options = {"endpoint_override": s3_server.endpoint, "region": s3server.REGION} if with_options else None
    client = s3_server.client()
    for key in ("my photos/a.jpg", "my%20photos/a.jpg", "q?x=1#y/a b+c&d'e~f:g.jpg", "ü/漢字.jpg"):
        location = storage.resolve(f"s3://{s3_bucket}/{key}", options)
        assert location.path == f"{s3_bucket}/{key}" and location.uri == f"s3://{s3_bucket}/{key}"
        location.write_bytes(key.encode())
        assert client.get_object(Bucket=s3_bucket, Key=key)["Body"].read() == key.encode()
    listed = sorted(o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket)["Contents"])
    assert listed == sorted(["my photos/a.jpg", "my%20photos/a.jpg", "q?x=1#y/a b+c&d'e~f:g.jpg", "ü/漢字.jpg"])
    assert storage.resolve(f"s3://{s3_bucket}/my photos", options).join("a.jpg").read_bytes() == b"my photos/a.jpg"


@pytest.mark.parametrize("output", ["s3://bucket", "s3://bucket/", "gs://bucket", "/", "file:///", "~"])
def test_every_job_refuses_a_root_output_with_exit_2_before_it_starts(output, tmp_path, capsys):
    """The ETL, training and batch inference parse --output with the same check (exit 2, one line),
    before any store is contacted or Spark or a rank starts."""
    from pipelines.runtime.config import parse_config
    from pipelines.etl.config import ETLConfig
    from pipelines.predict.config import PredictConfig
    from pipelines.training.config import TrainConfig

    for config, args in ((ETLConfig, ["--input", str(tmp_path)]), (TrainConfig, ["--data", str(tmp_path)]),
                         (PredictConfig, ["--model", "m", "--input", str(tmp_path)])):
        if config is PredictConfig and "://" in output:
            continue  # batch inference writes local folders only
        with pytest.raises(SystemExit) as exit_info:
            parse_config(config, [*args, "--output", output])
        error = capsys.readouterr().err
        assert exit_info.value.code == 2 and error.count("\n") == 1, (config, error)
        assert "--output" in error and "give a folder of its own below it" in error, (config, error)
