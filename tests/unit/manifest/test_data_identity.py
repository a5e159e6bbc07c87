"""Results tied to their inputs: the data identity, the feature cache's key and stale sets, and the
readers' leases an ETL commit keeps older runs for. Real Parquet files and real folders (and the
suite's S3 server for the lease on a URI)."""
import logging
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.io import leases, storage
from pipelines.manifest import Manifest, SplitInfo, data_identity
from pipelines.etl import commit
from pipelines.training.data import features as feat

RUN_A, RUN_B, RUN_C = "20260101T000000000000Z-aaaaaa", "20260102T000000000000Z-bbbbbb", "20260103T000000000000Z-cccccc"


def write_run(root, run_id, rows=(3, 2), seed=0):
    """An ETL-like output: ``runs/<run id>/<split>/part-0.parquet`` of ``rows`` rows per split
    (train, test) of 4-byte images whose bytes follow ``seed``, and its manifest. Returns it."""
    out = storage.resolve(str(root))
    splits = {}
    for split, n in zip(("train", "test"), rows):
        table = pa.table({"image": [bytes([seed, i, i, i]) for i in range(n)], "label": pa.array(range(n), pa.int32())})
        part = out.join("runs", run_id, split, "part-0.parquet")
        part.parent.makedirs()
        pq.write_table(table, part.path, compression="snappy")
        splits[split] = SplitInfo(rows=n, row_groups=1, files=1, parts=[f"runs/{run_id}/{split}/part-0.parquet"])
    manifest = Manifest(image_size=1, num_classes=3, class_names=["a", "b", "c"], rows_per_row_group=4,
                        splits=splits, extra={"run_id": run_id})
    manifest.write(out)
    return Manifest.read(out)


def test_the_data_identity_follows_the_run_id_and_the_footers(tmp_path):
    first = data_identity(str(tmp_path / "a"), write_run(tmp_path / "a", RUN_A))
    assert first.run_id == RUN_A and len(first.sha256) == 64
    # the same data read again, and a copy of the same run elsewhere: one identity
    assert data_identity(str(tmp_path / "a"), Manifest.read(str(tmp_path / "a"))) == first
    assert data_identity(str(tmp_path / "copy"), write_run(tmp_path / "copy", RUN_A)) == first
    # a rerun with the same counts and the same bytes is another run: another identity
    assert data_identity(str(tmp_path / "b"), write_run(tmp_path / "b", RUN_B)).sha256 != first.sha256
    # the same run id over other bytes (files replaced in place), or one more row in a footer
    assert data_identity(str(tmp_path / "c"), write_run(tmp_path / "c", RUN_A, seed=7)).sha256 != first.sha256
    assert data_identity(str(tmp_path / "d"), write_run(tmp_path / "d", RUN_A, rows=(4, 2))).sha256 != first.sha256


def test_the_feature_key_changes_with_the_data_and_the_model(tmp_path):
    a = data_identity(str(tmp_path / "a"), write_run(tmp_path / "a", RUN_A))
    b = data_identity(str(tmp_path / "b"), write_run(tmp_path / "b", RUN_B))
    fewer = data_identity(str(tmp_path / "c"), write_run(tmp_path / "c", RUN_A, rows=(3, 1)))
    model = feat.model_key("none", 71, 42, "tiny", "float32", "uint8-71")
    other_model = feat.model_key("none", 71, 43, "tiny", "float32", "uint8-71")
    key = feat.feature_key(model, a)
    assert feat.feature_key(model, a) == key and len(key) == 16  # nothing changed: the same set
    assert len({key, feat.feature_key(model, b), feat.feature_key(model, fewer), feat.feature_key(other_model, a),
                model}) == 5


def make_set(data_root, model, identity, rows):
    key = feat.feature_key(model, identity)
    directory = feat.feature_dir(str(data_root), key)
    feat.write_shard(directory, "train", 0, np.zeros((1, 2), np.float32), np.zeros(1, np.int32))
    feat.mark_complete(directory, rows, key, model, identity)
    return key, directory


def test_a_set_of_other_data_is_not_reused_and_is_named_and_pruned_when_its_run_is_gone(tmp_path, caplog):
    rows = {"train": 3, "test": 2}
    model = feat.model_key("none", 71, 42, "tiny", "float32", "uint8-71")
    old = data_identity(str(tmp_path), write_run(tmp_path, RUN_A))
    old_key, old_dir = make_set(tmp_path, model, old, rows)
    assert feat.is_complete(old_dir, rows, old_key)
    new = data_identity(str(tmp_path), write_run(tmp_path, RUN_B))  # the same counts, another ETL run
    new_key = feat.feature_key(model, new)
    assert not feat.is_complete(feat.feature_dir(str(tmp_path), new_key), rows, new_key)
    assert not feat.is_complete(old_dir, rows, new_key)  # a set copied under another key is not reused
    # a set of another model, and one keyed before the data was (its marker's key is the model key)
    make_set(tmp_path, feat.model_key("none", 71, 1, "tiny", "float32", "uint8-71"), old, rows)
    legacy = feat.feature_dir(str(tmp_path), model)
    legacy.join(feat.COMPLETE).write_json({"key": model, "rows": rows})
    stale = feat.stale_sets(str(tmp_path), model, new_key)
    assert [folder.uri for folder, _ in stale] == [old_dir.uri, legacy.uri]  # newest run first
    with caplog.at_level(logging.INFO, "pipelines"):
        feat.say_why(str(tmp_path), model, new_key, new, "DIR")
    assert f"feature cache: the data changed since {old_dir.uri} was computed (ETL run {RUN_A} -> {RUN_B}): " \
           "recomputing into DIR" in caplog.text
    # run A's folder still exists (a training may read it under its lease): only the legacy set goes
    assert feat.prune(str(tmp_path), stale) == [legacy.uri] and old_dir.exists()
    storage.resolve(str(tmp_path)).join("runs", RUN_A).delete()
    assert feat.prune(str(tmp_path), feat.stale_sets(str(tmp_path), model, new_key)) == [old_dir.uri]
    assert not old_dir.exists()
    assert len(os.listdir(tmp_path / "features")) == 1  # the other model's set is not this model's to delete


def three_runs(root):
    out = storage.resolve(str(root))
    for run in (RUN_A, RUN_B, RUN_C):
        out.join("runs", run, "train", "part-0.parquet").write_bytes(b"x")
    return out


def test_a_commit_keeps_an_older_run_a_live_lease_holds_and_deletes_it_once_none_is(tmp_path, caplog):
    out = three_runs(tmp_path / "out")
    now = time.time()
    leases.write_lease(leases.lease_location(out, RUN_A, "train-1"), "train-1", RUN_A, now=now - 30)
    crashed = leases.lease_location(out, RUN_B, "train-2")
    leases.write_lease(crashed, "train-2", RUN_B)
    os.utime(crashed.path, (now - leases.TTL_S - 1,) * 2)  # a crashed training's: expired
    with caplog.at_level(logging.INFO, "pipelines"):
        assert commit.clean_up(out, RUN_C) == [f"runs/{RUN_B}"]
    assert f"kept run {RUN_A}: still read by training run train-1" in caplog.text
    assert sorted(os.listdir(tmp_path / "out" / "runs")) == [RUN_A, RUN_C]
    # refreshed: still kept; released: the next commit deletes it
    leases.write_lease(leases.lease_location(out, RUN_A, "train-1"), "train-1", RUN_A)
    assert commit.clean_up(out, RUN_C) == []
    leases.lease_location(out, RUN_A, "train-1").delete()
    assert commit.clean_up(out, RUN_C) == [f"runs/{RUN_A}"]
    assert os.listdir(tmp_path / "out" / "runs") == [RUN_C]


def test_a_lease_is_judged_by_its_file_time_on_the_stores_clock(tmp_path):
    """The store's time of each lease file against the store's time now; what the file says (a
    refresh time, or nothing readable) does not enter."""
    run = three_runs(tmp_path / "out").join("runs", RUN_A)
    assert leases.leases_on(run) == []
    now = time.time()
    for reader, age in (("fresh", 10), ("nearly", leases.TTL_S - 30), ("old", leases.TTL_S + 30),
                        ("far-ahead", -leases.TTL_S - 60)):
        location = run.join("readers", reader + ".json")
        leases.write_lease(location, reader, RUN_A, now=now - leases.TTL_S * 3)  # what it says: ignored
        os.utime(location.path, (now - age, now - age))
    run.join("readers", "damaged.json").write_bytes(b"{not json")  # written now: live
    found = {lease.reader: lease.live for lease in leases.leases_on(run)}
    assert found == {"fresh": True, "nearly": True, "old": False, "far-ahead": False, "damaged": True}
    assert sorted(os.listdir(tmp_path / "out" / "runs" / RUN_A / "readers")) == sorted(f"{r}.json" for r in found)
    with pytest.raises(ValueError, match="not a plain file name"):
        leases.lease_location(run, "../x", "r")


SKEW_S = 15 * 60


def skewed(monkeypatch, seconds):
    """This process's clock, as every host-clock read here sees it, ``seconds`` off the truth
    (the store's clock, the kernel's file times, stays true)."""
    true_time = time.time
    monkeypatch.setattr(time, "time", lambda: true_time() + seconds)


@pytest.mark.parametrize("holder_s, judge_s", [(SKEW_S, 0), (-SKEW_S, 0), (0, SKEW_S), (0, -SKEW_S),
                                               (SKEW_S, -SKEW_S), (-SKEW_S, SKEW_S), (3 * 3600, 0)])
def test_skewed_clocks_on_either_side_keep_a_live_lease_and_reclaim_an_expired_one(tmp_path, monkeypatch,
                                                                                  holder_s, judge_s):
    """A training (the holder) and an ETL rerun (the judge) on hosts whose clocks are off by
    15 minutes or more either way: the lease refreshed just now keeps its run, one whose last
    refresh the store stamped 11 minutes ago no longer does."""
    out = three_runs(tmp_path / "out")
    with monkeypatch.context() as host:
        skewed(host, holder_s)
        leases.write_lease(leases.lease_location(out, RUN_A, "train-1"), "train-1", RUN_A)
        leases.write_lease(leases.lease_location(out, RUN_B, "crashed"), "crashed", RUN_B)
    crashed = leases.lease_location(out, RUN_B, "crashed").path
    os.utime(crashed, (time.time() - leases.TTL_S - 60,) * 2)  # the store's stamp of its last refresh
    with monkeypatch.context() as host:
        skewed(host, judge_s)
        assert commit.clean_up(out, RUN_C) == [f"runs/{RUN_B}"]
    assert sorted(os.listdir(tmp_path / "out" / "runs")) == [RUN_A, RUN_C]


def test_a_commit_on_a_clock_15_minutes_ahead_keeps_a_training_reading(tmp_path, monkeypatch):
    """The reported case, through a held lease: training refreshing its lease, the ETL's host 15
    minutes ahead; the run is kept while held and deleted once the lease is released."""
    write_run(tmp_path, RUN_A)
    out = storage.resolve(str(tmp_path))
    with leases.hold(out, RUN_A, "train-1", refresh_s=0.05):
        with monkeypatch.context() as host:
            skewed(host, SKEW_S)
            assert commit.clean_up(out, RUN_C) == []
            ages = [lease.age_s for lease in leases.leases_on(out.join("runs", RUN_A))]
            assert len(ages) == 1 and -5 < ages[0] < 5  # not 900 s: the store's clock on both ends
    assert commit.clean_up(out, RUN_C) == [f"runs/{RUN_A}"]


def test_a_held_lease_is_refreshed_and_removed_and_refused_when_the_manifest_moved_on(tmp_path):
    write_run(tmp_path, RUN_A)
    out = storage.resolve(str(tmp_path))
    lease = leases.hold(out, RUN_A, "train-1", refresh_s=0.05)
    location = leases.lease_location(out, RUN_A, "train-1")
    first = location.read_json()["refreshed"]
    assert first > time.time() - 60 and location.read_json()["reader"] == "train-1"
    deadline = time.time() + 10
    while location.read_json()["refreshed"] == first and time.time() < deadline:
        time.sleep(0.05)
    assert location.read_json()["refreshed"] > first
    lease.stop()
    assert not location.exists()
    write_run(tmp_path, RUN_B)  # committed between the reader's manifest read and its lease
    with pytest.raises(leases.InputReplaced, match=f"ETL run {RUN_A} -> {RUN_B}"):
        leases.hold(out, RUN_A, "train-2")
    assert not leases.lease_location(out, RUN_A, "train-2").exists()


def test_a_lease_on_an_s3_output_keeps_its_run(s3_server, s3_bucket, caplog, monkeypatch):
    """On S3 both times are the server's (LastModified of the lease and of the probe): clocks of
    the holder and the judge 15 minutes off either way change nothing; a lease left unrefreshed
    longer than its life (here 2 s) is reclaimed."""
    from tests.support import s3server
    options = {"endpoint_override": s3_server.endpoint, "region": s3server.REGION,
               "access_key": s3server.ACCESS_KEY, "secret_key": s3server.SECRET_KEY}
    out = storage.resolve(f"s3://{s3_bucket}/etl", options)
    for run in (RUN_A, RUN_B):
        out.join("runs", run, "train", "part-0.parquet").write_bytes(b"x")
    with monkeypatch.context() as host:
        skewed(host, SKEW_S)
        lease = leases.ReaderLease(leases.lease_location(out, RUN_A, "train-1"), "train-1", RUN_A).start()
    for judge_s in (SKEW_S, -SKEW_S, 0):
        with monkeypatch.context() as host:
            skewed(host, judge_s)
            assert commit.clean_up(out, RUN_B) == []
            (found,) = leases.leases_on(out.join("runs", RUN_A))
            assert found.live and -3 < found.age_s < 3
    lease._stop.set()  # the holder dies: no refresh, no release
    time.sleep(3.2)  # S3 stamps whole seconds
    (found,) = leases.leases_on(out.join("runs", RUN_A), ttl_s=2)
    assert not found.live and found.age_s >= 2
    assert not [i for i in out.join("runs", RUN_A, "readers").list() if i.base_name.startswith(".clock")]
    lease.stop()
    assert commit.clean_up(out, RUN_B) == [f"runs/{RUN_A}"]
    assert [i.base_name for i in out.join("runs").list(recursive=False)] == [RUN_B]
