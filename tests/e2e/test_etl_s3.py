"""The ETL on an S3 API server (a real moto_server): local -> S3 and S3 -> S3 on the generated tree
of good and bad files, the refusals before Spark, and the commit protocol (reruns, a run killed
mid-write, runs that overlap)."""
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from pipelines.io import storage
from pipelines.contract import SPLITS
from pipelines.manifest import Manifest
from pipelines.etl.cli import main as etl_main
from pipelines.etl.commit import RunSuperseded
from pipelines.etl.config import ETLConfig
from pipelines.etl.images import ImageRejected
from pipelines.etl.job import finish, run_etl, run_spark
from pipelines.etl.plan import plan
from pipelines.etl.transform import read_object
from tests.support import s3server
from tests.support.env import REPO, subprocess_env
from tests.support.imagegen import make_tree

pytestmark = pytest.mark.slow
SIZE = 16


@pytest.fixture(scope="module")
def tree(tmp_path_factory, s3_server):
    """The generated tree, locally and uploaded to ``s3://<bucket>/tree``: ``(local root, S3 URI,
    bucket, expected)``."""
    root = str(tmp_path_factory.mktemp("s3tree") / "tree")
    expected = make_tree(root, classes=3, per_class=8)
    bucket = s3_server.bucket("etl")
    storage.resolve(f"s3://{bucket}/tree").upload(root)
    return root, f"s3://{bucket}/tree", bucket, expected


def keys(server, bucket, prefix):
    """Every key under ``prefix`` but folder placeholders, through boto3 (not through the code
    under test). A placeholder (an empty ``folder/`` key) is what pyarrow's S3 filesystem writes
    whenever it deletes keys of a folder (the run's ``_tasks/``): no data, and no reader reads it."""
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []) if not o["Key"].endswith("/"))


def run_ids(server, bucket):
    """The run ids under ``etl/runs/`` (pyarrow leaves an empty ``runs/`` marker object when it
    deletes the last run below it: no run)."""
    return {k.split("/")[2] for k in keys(server, bucket, "etl/runs/") if not k.endswith("/")}


def read_split(out: str, split: str):
    """The rows of ``split`` from the files the manifest at ``out`` names, read with pyarrow's S3."""
    root = storage.resolve(out)
    parts = Manifest.read(root).part_locations(root, split)
    return pq.read_table([p.location.path for p in parts], filesystem=root.filesystem).to_pylist() if parts else []


def check_output(out: str, tree_root: str, input_uri: str, expected: dict, manifest: dict) -> None:
    """The reconciliation of the local test, against counts made apart from the job."""
    files = manifest["files"]
    found = sum(len(names) for _, _, names in os.walk(tree_root))
    assert files["found"] == found == files["written"] + files["rejected"] + files["skipped"]
    assert (files["written"], files["rejected"], files["skipped"]) == \
        (expected["good"], len(expected["rejected"]), len(expected["skipped"]))
    rows = [row for split in SPLITS for row in read_split(out, split)]
    assert len(rows) == expected["good"] == sum(manifest["splits"][split]["rows"] for split in SPLITS)
    prefix = input_uri.rstrip("/") + "/"
    for row in rows:
        folder = row["path"][len(prefix):].split("/")[0]
        assert row["path"].startswith(prefix) and len(row["image"]) == SIZE * SIZE * 3
        assert row["label"] == int(folder[:3]) - 1
    root = storage.resolve(out)
    ledger = [json.loads(line) for line in
              Manifest.read(root).rejected_location(root).read_bytes().decode("utf-8").splitlines()]
    by_path = {e["path"][len(prefix):]: e for e in ledger}
    for status, wanted in (("rejected", expected["rejected"]), ("skipped", expected["skipped"])):
        for path, reason in wanted.items():
            entry = by_path[os.path.relpath(path, tree_root)]
            assert entry["status"] == status and reason in entry["reason"], entry
    assert len(ledger) == len(expected["rejected"]) + len(expected["skipped"])


def config(input_uri: str, out: str, **kwargs) -> ETLConfig:
    return ETLConfig(input=input_uri, output=out, image_size=SIZE, test_fraction=0.3, min_row_groups=1, **kwargs)


SECRETS = {"access_key": "AKIDSECRETID", "secret_key": "S3CR3T-KEY", "session_token": "T0K3N"}  # any is taken


def test_local_to_s3_tracked_to_the_default_store_of_a_fresh_home_writing_no_secret(tree, s3_server, spark, tmp_path,
                                                                                    monkeypatch, capfd):
    """``etl.py --output s3://...`` on a machine whose ~/pipelines-work does not exist: its default
    store (~/pipelines-work/mlflow/mlruns.db) is made, owner-only. The credentials given as
    ``--storage-option`` appear in no object of the output, no file of the store (database,
    artifacts) and no line the job printed; the option keys are kept."""
    root, _, _, expected = tree
    bucket = s3_server.bucket("out")
    out = f"s3://{bucket}/etl"
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PIPELINES_WORKDIR", raising=False)
    given = {**SECRETS, "endpoint_override": s3_server.endpoint}  # with options, pyarrow takes no AWS_ENDPOINT_URL
    options = [arg for key, value in given.items() for arg in ("--storage-option", f"{key}={value}")]
    assert etl_main(["--input", root, "--output", out, "--image-size", str(SIZE), "--test-fraction", "0.3",
                     "--min-row-groups", "1", "--tracking", *options]) == 0
    printed = "".join(capfd.readouterr())
    manifest = storage.resolve(out).join("manifest.json").read_json()
    check_output(out, root, root, expected, manifest)
    run = manifest["run_id"]
    parts = [p for s in SPLITS for p in manifest["splits"][s]["parts"]]
    assert keys(s3_server, bucket, "etl/") == sorted(
        ["etl/manifest.json", "etl/mlflow_run.json", f"etl/runs/{run}/rejected.jsonl"] + [f"etl/{p}" for p in parts])
    store = home / "pipelines-work" / "mlflow"
    assert (store / "mlruns.db").is_file() and oct(os.stat(store).st_mode & 0o777) == "0o700"
    record = storage.resolve(out).join("mlflow_run.json").read_json()
    from pipelines.tracking import open_store
    client = open_store(record["tracking_uri"])
    logged = client.get_run(record["run_id"])
    assert record["tracking_uri"] == f"sqlite:///{store}/mlruns.db" and logged.data.tags["run_id"] == run
    assert logged.data.metrics["files.written"] == expected["good"]
    assert sorted(a.path for a in client.list_artifacts(record["run_id"])) == ["manifest.json", "rejected.jsonl"]
    assert logged.data.params["storage_options"] == str(sorted(given))  # the keys, never a value
    objects = [s3_server.client().get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys(s3_server, bucket, "")]
    for secret in SECRETS.values():
        assert not any(secret.encode() in body for body in objects), secret
        assert secret not in printed, secret
        for folder, _, names in os.walk(home):
            for name in names:
                with open(os.path.join(folder, name), "rb") as f:
                    assert secret.encode() not in f.read(), (secret, name)


@pytest.mark.current
def test_s3_to_s3_rerun_replaces_and_a_killed_run_leaves_the_output_whole(tree, s3_server, spark):
    """Run 1 commits; run 2 (a separate process) is killed with SIGKILL while its tasks write:
    run 1's manifest and every file it names are intact; run 3 commits and deletes both."""
    root, input_uri, _, expected = tree
    bucket = s3_server.bucket("out")
    out = f"s3://{bucket}/etl"
    first = run_etl(config(input_uri, out), spark)
    check_output(out, root, input_uri, expected, first)
    committed = s3_server.client().get_object(Bucket=bucket, Key="etl/manifest.json")["Body"].read()

    cmd = [sys.executable, os.path.join(REPO, "jobs", "etl.py"), "--input", input_uri, "--output", out,
           "--image-size", "64", "--test-fraction", "0.3", "--min-row-groups", "1", "--master", "local[1]",
           "--num-partitions", "12"]
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline, written = time.monotonic() + 240, []
        while not written and time.monotonic() < deadline and proc.poll() is None:
            written = [k for k in keys(s3_server, bucket, "etl/runs/")
                       if k.endswith(".parquet") and f"/{first['run_id']}/" not in k]
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and the Python workers
    finally:
        proc.wait(30)
    assert written, f"the second run wrote no part file before it ended: {proc.stderr.read()[-2000:]!r}"
    killed = written[0].split("/")[2]
    assert s3_server.client().get_object(Bucket=bucket, Key="etl/manifest.json")["Body"].read() == committed
    check_output(out, root, input_uri, expected, first)  # every file it names, readable and whole
    assert any(f"/{killed}/" in k for k in keys(s3_server, bucket, "etl/runs/"))

    third = run_etl(config(input_uri, out), spark)
    assert first["run_id"] < killed < third["run_id"]
    check_output(out, root, input_uri, expected, third)
    assert run_ids(s3_server, bucket) == {third["run_id"]}


def test_overlapping_runs_never_delete_a_newer_run(tree, s3_server, spark):
    """A (older) and B (newer) overlap both ways: an older run's commit keeps the newer run's files;
    a run that finds a newer committed run at its end gives way, and the newer output stands."""
    root, _, _, expected = tree
    bucket = s3_server.bucket("out")
    out = f"s3://{bucket}/etl"
    cfg = config(root, out)
    older, newer = plan(cfg), plan(cfg)
    assert older.run_id < newer.run_id
    newer_outcomes = run_spark(spark, cfg, newer)  # B's tasks have written; B has not committed
    a = finish(cfg, older, run_spark(spark, cfg, older), spark.version, 1.0)  # A commits
    runs = run_ids(s3_server, bucket)
    assert runs == {older.run_id, newer.run_id}  # A kept B's files
    check_output(out, root, root, expected, a)
    b = finish(cfg, newer, newer_outcomes, spark.version, 1.0)  # B commits, A is deleted
    assert run_ids(s3_server, bucket) == {newer.run_id}
    check_output(out, root, root, expected, b)

    late, later = plan(cfg), plan(cfg)
    late_outcomes = run_spark(spark, cfg, late)  # still "writing" when the later run commits
    c = finish(cfg, later, run_spark(spark, cfg, later), spark.version, 1.0)
    with pytest.raises(RunSuperseded, match=f"the newer run {later.run_id} committed"):
        finish(cfg, late, late_outcomes, spark.version, 1.0)
    assert Manifest.read(out).extra["run_id"] == later.run_id
    check_output(out, root, root, expected, c)
    assert run_ids(s3_server, bucket) == {later.run_id}


def test_refusals_before_spark(tree, s3_server, tmp_path, capsys):
    root, input_uri, bucket, _ = tree
    out = s3_server.bucket("out")
    s3_server.client().put_object(Bucket=out, Key="foreign/precious.txt", Body=b"keep me")
    cases = [
        (["--input", root, "--output", "s3://no-such-bucket/etl"], "bucket 'no-such-bucket' does not exist"),
        (["--input", "s3://no-such-bucket/tree", "--output", str(tmp_path / "o")], "--input s3://no-such-bucket"),
        (["--input", f"s3://{bucket}/nothing-here", "--output", str(tmp_path / "o")], "input folder does not exist"),
        (["--input", root, "--output", f"s3://{out}/foreign"],
         f"output s3://{out}/foreign holds precious.txt but no manifest.json"),
        (["--input", input_uri, "--output", f"{input_uri}/out"], "is the input or inside it"),
    ]
    for args, message in cases:
        assert etl_main(args) == 2, args
        assert message in capsys.readouterr().err, args
    assert keys(s3_server, out, "") == ["foreign/precious.txt"]
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as info:
        etl_main(["--input", root, "--output", "nosuch://b/etl"])
    assert info.value.code == 2 and "unknown scheme 'nosuch'" in capsys.readouterr().err


def test_wrong_credentials_are_refused_with_exit_code_2(tree, tmp_path, capsys):
    root = tree[0]
    with s3server.authenticated_server(str(tmp_path / "moto.log")) as (server, key, _, bucket):
        args = ["--input", root, "--output", f"s3://{bucket}/etl", "--storage-option", f"endpoint_override="
                f"{server.endpoint}", "--storage-option", f"access_key={key}", "--storage-option", "secret_key=wrong"]
        assert etl_main(args) == 2
        assert f"--output s3://{bucket}/etl: the store refused access" in capsys.readouterr().err


def test_the_default_tracking_store_of_a_remote_output_is_local(monkeypatch, tmp_path):
    monkeypatch.setenv("PIPELINES_WORKDIR", str(tmp_path))
    assert ETLConfig(input="/tmp/in", output="s3://bucket/etl", tracking=True).tracking_uri == \
        f"sqlite:///{tmp_path}/mlflow/mlruns.db"


def test_reading_an_object_keeps_the_size_bound(s3_server, s3_bucket):
    source = storage.resolve(f"s3://{s3_bucket}/tree")
    source.join("a", "x.jpg").write_bytes(b"x" * 100)
    assert read_object(source, f"{source.uri}/a/x.jpg", 100) == b"x" * 100
    with pytest.raises(ImageRejected, match="grew past 99 bytes"):
        read_object(source, f"{source.uri}/a/x.jpg", 99)
    with pytest.raises(ImageRejected, match="vanished after listing"):
        read_object(source, f"{source.uri}/a/gone.jpg", 100)


ODD_NAMES = ["x y.jpg", "a+b%c=d&e#f?g:h'i~j.jpg", "漢字 é.jpg", "my%20photo.jpg", "plain.jpg"]


def test_odd_object_keys_are_written_and_a_key_no_filesystem_opens_is_one_rejection(s3_server, spark):
    """Keys with spaces, + % = & # ? : ' ~, non-ASCII and %20 in class folders and file names are
    read and written under their own names; 'class//file.jpg' (pyarrow: "Empty path component")
    is that file's rejection with its reason, never the job's failure; so are a key with a '..'
    segment (never read) and a byte-identical copy of another object (a label conflict here)."""
    import numpy as np
    from tests.support.imagegen import encode, random_photo

    bucket, rng = s3_server.bucket("odd"), np.random.default_rng(0)
    client = s3_server.client()
    classes = ["001.my photos", "002.ü+%20&#?"]
    written = [f"{c}/{name}" for c in classes for name in ODD_NAMES]
    for i, rel in enumerate(written + [f"{classes[0]}//double.jpg", f"{classes[0]}/../escape.jpg"]):
        client.put_object(Bucket=bucket, Key=f"tree/{rel}", Body=encode(random_photo(rng, 20, 16, i % 2)))
    first = client.get_object(Bucket=bucket, Key=f"tree/{written[0]}")["Body"].read()
    client.put_object(Bucket=bucket, Key=f"tree/{classes[1]}/same bytes.jpg", Body=first)
    out = f"s3://{bucket}/etl"
    manifest = run_etl(config(f"s3://{bucket}/tree", out), spark)
    files = manifest["files"]
    assert (files["found"], files["written"], files["rejected"], files["skipped"]) == (13, 10, 3, 0), files
    rows = [r for split in ("train", "validation", "test") for r in read_split(out, split)]
    assert sorted(r["path"] for r in rows) == sorted(f"s3://{bucket}/tree/{rel}" for rel in written)
    assert {r["label_name"] for r in rows} == {"my photos", "ü+%20&#?"}
    root = storage.resolve(out)
    ledger = [json.loads(line) for line in
              Manifest.read(root).rejected_location(root).read_bytes().decode("utf-8").splitlines()]
    reasons = {e["path"][len(f"s3://{bucket}/tree/"):]: (e["status"], e["reason"]) for e in ledger}
    assert set(reasons) == {f"{classes[0]}//double.jpg", f"{classes[0]}/../escape.jpg", f"{classes[1]}/same bytes.jpg"}
    assert "empty or '.' path segment" in reasons[f"{classes[0]}//double.jpg"][1]
    assert reasons[f"{classes[0]}/../escape.jpg"] == ("rejected", "key has a '..' path segment, which names a file "
                                                                   "outside the input: unread, rename it")
    assert reasons[f"{classes[1]}/same bytes.jpg"] == (
        "rejected", f"label conflict: same bytes as {written[0]} in class my photos")
