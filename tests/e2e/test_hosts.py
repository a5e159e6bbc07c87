"""Spark and Horovod across separate hosts: network namespaces on this machine
(scripts/testhosts.sh), a Spark master, five 1-core workers and the S3 server each on a host of its
own, the driver on the bridge. Every test that uses the hosts lives in this file (one xdist worker
builds them once).

* HorovodRunner(np=4), one driver run (tests/support/hosts_driver.py): with the default interface, then
  with each host's unroutable interface named.
* The pipeline through ``spark-submit``: the ETL of a tree uploaded to the S3 server, from and to
  the bucket; training ``--spark-np 4`` on that output, from and to the bucket, in which one
  worker host is lost after checkpoint 2 and the job relaunched on the four left, then one of them
  is cut off (link down) past the ranks' Gloo timeout after checkpoint 4 and the job relaunched
  again (``--max-failures 2``); ``--spark-np 3 --min-np 2`` on three hosts, one lost for good,
  finishing on the two left; and the same loss failing the job at once (``--max-failures 0``). A
  test that takes a host away gives it back (its Spark worker restarted, its link up) whatever happens, so any test runs
  alone (``-k``) or in any order."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.contract import SPLITS
from tests.support import s3server
from tests.support.env import REPO, subprocess_env
from tests.support.hosts_driver import PAUSE_S, VECTOR
from tests.support.imagegen import make_tree
from tests.support.outputs import assert_exact_test_count

pytestmark = pytest.mark.slow
DRIVER = os.path.join(REPO, "tests", "support", "hosts_driver.py")


@pytest.fixture(scope="module")
def driver_run(hosts_cluster, test_hosts, tmp_path_factory):
    """Run the driver; yields ``(lines, log_dir, bucket)``, ``lines`` as ``(arrival s, text)``
    in the order they reached this process."""
    cluster, s3, _ = hosts_cluster
    bucket, log_dir = s3.bucket("hosts"), str(tmp_path_factory.mktemp("rank-logs"))
    env = subprocess_env(SPARK_LOCAL_IP=test_hosts.driver, PYTHONUNBUFFERED="1",
                         **s3server.standard_environment(s3.endpoint), **cluster.client_env)
    proc = subprocess.Popen([sys.executable, DRIVER, cluster.url, bucket, log_dir], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line.rstrip("\n"))
                                                         for line in proc.stdout))
    reader.start()
    try:
        proc.wait(timeout=240)
    finally:
        proc.kill()
        reader.join(10)
    assert proc.returncode == 0, "\n".join(text for _, text in lines[-60:])
    yield lines, log_dir, bucket


def _line(lines, start):
    return next((t, text) for t, text in lines if text.startswith(start))


def test_four_ranks_on_four_hosts_bound_to_their_own_addresses(driver_run, hosts_cluster, test_hosts):
    lines, _, _ = driver_run
    _, _, workers = hosts_cluster
    everyone = json.loads(_line(lines, "RESULT ")[1][len("RESULT "):])
    assert [r["rank"] for r in everyone] == [0, 1, 2, 3]
    by_inode = test_hosts.by_netns_inode()
    hosts = [by_inode[r["netns"]] for r in everyone]
    assert len({h.name for h in hosts}) == 4 and {h.name for h in hosts} <= {w.name for w in workers}  # one each
    addresses = {h.address for h in hosts}
    rendezvous = everyone[0]["address"]
    for rank, host in zip(everyone, hosts):
        assert rank["address"] == host.address and rank["hostname"] == host.netns
        assert rank["tmpdir"] == os.path.join(host.folder, "tmp")
        assert rank["total"] == [x * (1 + 2 + 3 + 4) for x in VECTOR]  # [10, 20, 30]
        assert rank["plan"]["HOROVOD_GLOO_IFACE"] == "eth0"  # eth1 is listed first, and unroutable
        # ADDR:PORT/TOKEN, the job's token in the path (pipelines.launch.rendezvous.gloo_address)
        address, port, token = re.fullmatch(r"([^:]+):(\d+)/(.+)", rank["plan"]["HOROVOD_GLOO_RENDEZVOUS_ADDR"]).groups()
        assert address == rendezvous and port == str(rank["plan"]["HOROVOD_GLOO_RENDEZVOUS_PORT"]) and len(token) >= 32
        assert rank["plan"]["HOROVOD_HOSTNAME"] == host.address
        assert all(v != test_hosts.driver for v in rank["plan"].values())
        # Gloo's ring: connections from this host's address to the other ranks' hosts only
        assert {remote for _, remote in rank["peers"]} == addresses - {host.address}


def test_ranks_write_to_the_s3_server_on_its_own_host(driver_run, hosts_cluster):
    _, _, bucket = driver_run
    _, s3, _ = hosts_cluster
    client = s3.client()
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == [f"ranks/rank-{r}.json" for r in range(4)]
    written = [json.loads(client.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in keys]
    assert [w["rank"] for w in written] == [0, 1, 2, 3] and len({w["netns"] for w in written}) == 4


def test_rank_lines_reach_the_driver_live_prefixed_and_are_kept(driver_run):
    lines, log_dir, _ = driver_run
    everyone = json.loads(_line(lines, "RESULT ")[1][len("RESULT "):])
    end, _ = _line(lines, "RESULT ")
    for rank in everyone:
        shown = f"[rank {rank['rank']} on {rank['address']}] "
        arrived, _ = _line(lines, f"{shown}tick: rank {rank['rank']} of 4 started")
        assert arrived <= end - (PAUSE_S - 1.0)  # seen while the rank still ran, not after the job
        _line(lines, f"{shown}done: rank {rank['rank']}")
        with open(os.path.join(log_dir, f"rank-{rank['rank']}.log")) as f:
            kept = f.read().splitlines()
        assert f"tick: rank {rank['rank']} of 4 started" in kept and f"done: rank {rank['rank']}" in kept


def test_a_named_interface_is_honoured_even_when_unroutable(driver_run, hosts_cluster):
    """network_interface="eth1": every rank binds Gloo to its host's unroutable eth1 (the one a
    first-listed choice would take), as named, never replaced: no peer can reach it, and the job
    fails (Gloo aborts the ranks after its connection timeout, 3 s here) naming the ranks."""
    lines, _, _ = driver_run
    _, _, workers = hosts_cluster
    _, failed = _line(lines, "FAILED ")
    assert failed.startswith("FAILED rank ") and "(then also: rank" in failed, failed
    tried = {text.split("[rank ")[1].split("]")[0]: text for _, text in lines
             if text.startswith("[rank ") and ("Connect timeout [" in text or "No route to host" in text)}
    unroutable = {w.unroutable for w in workers}
    assert tried, "\n".join(text for _, text in lines[-40:])
    for text in tried.values():  # Gloo connected to the peers' eth1 addresses, and only those
        assert text.split("connect [" if "connect [" in text else "Connect timeout [")[1].split("]")[0] in unroutable


# -- the pipeline across the hosts: ETL and training on the S3 server, a worker host lost -----------

SIZE = 32
FAULT = "PIPELINES_FAULT_INJECT"
TRAIN = ("--weights", "none", "--backbone", "tiny", "--batch-size", "2", "--no-tensorboard", "--no-pictures",
         "--patience", "10", "--spark-np", "4")
KILL_TO_EXIT_S = 60  # from a worker host's death to spark-submit's exit (the verdict, Spark's shutdown), loaded


def submit(hosts_cluster, test_hosts, script, *args, conf=(), during=None, timeout=420):
    """``spark-submit --master spark://h1:7077 jobs/SCRIPT ARGS`` from the driver on the bridge, with
    the S3 server on h2 as its store; ``during(proc)`` runs while the job does. Returns the finished
    process with ``output`` (stdout and stderr) and ``ended`` (monotonic time of its exit)."""
    cluster, s3, _ = hosts_cluster
    cmd = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", cluster.url,
           "--conf", "spark.executor.memory=512m",
           "--driver-java-options", f"-Dlog4j2.configurationFile={REPO}/conf/log4j2.properties"]
    for c in conf:
        cmd += ["--conf", c]
    env = subprocess_env(SPARK_LOCAL_IP=test_hosts.driver, PYTHONUNBUFFERED="1",
                         **s3server.standard_environment(s3.endpoint), **cluster.client_env)
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd + [os.path.join(REPO, "jobs", script), *args], env=env, text=True,
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            if during:
                during(proc)
            proc.wait(timeout=timeout)
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            out.seek(0)
            raise AssertionError(f"{exc}; the job's output ends:\n{out.read()[-4000:]}") from exc
        finally:
            proc.kill()
            proc.wait()
        proc.ended = time.monotonic()
        out.seek(0)
        proc.output = out.read()
    return proc


def read_key(s3, bucket, key):
    return s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def etl_on(s3, bucket):
    """``s3://BUCKET/etl`` on h2's server, as a ``pipelines.io.storage.Location``."""
    from pipelines.io import storage

    return storage.resolve(f"s3://{bucket}/etl", {"endpoint_override": s3.endpoint, "region": s3server.REGION,
                                                  "access_key": s3server.ACCESS_KEY,
                                                  "secret_key": s3server.SECRET_KEY})


def bucket_keys(s3, bucket, prefix):
    """Every key under ``prefix``, through boto3 (not through the code under test)."""
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.fixture(scope="module")
def hosts_etl(hosts_cluster, test_hosts, tmp_path_factory):
    """The generated tree uploaded (boto3) to ``s3://BUCKET/tree`` on h2, and the ETL of it across
    the hosts to ``s3://BUCKET/etl``: ``(bucket, manifest, expected, uploaded keys, process)``. Every
    training test here reads this one output."""
    _, s3, _ = hosts_cluster
    root = str(tmp_path_factory.mktemp("hosts-tree") / "tree")
    expected = make_tree(root, classes=3, per_class=16)
    bucket, client = s3.bucket("data"), s3.client()
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            client.upload_file(path, bucket, "tree/" + os.path.relpath(path, root))
    uploaded = bucket_keys(s3, bucket, "tree/")
    proc = submit(hosts_cluster, test_hosts, "etl.py", "--input", f"s3://{bucket}/tree", "--output",
                  f"s3://{bucket}/etl", "--image-size", str(SIZE), "--test-fraction", "0.3", "--validation-fraction", "0.2",
                  "--min-row-groups", "4")
    assert proc.returncode == 0, proc.output[-3000:]
    manifest = json.loads(read_key(s3, bucket, "etl/manifest.json"))
    return bucket, manifest, expected, uploaded, proc


def test_etl_across_the_hosts_from_and_to_the_s3_server(hosts_etl, hosts_cluster):
    bucket, manifest, expected, uploaded, proc = hosts_etl
    _, s3, _ = hosts_cluster
    files = manifest["files"]
    assert files["found"] == len(uploaded) == files["written"] + files["rejected"] + files["skipped"]
    assert (files["written"], files["rejected"], files["skipped"]) == \
        (expected["good"], len(expected["rejected"]), len(expected["skipped"]))
    splits = manifest["splits"]
    assert sum(splits[s]["rows"] for s in SPLITS) == expected["good"]
    assert manifest["max_world_size"] >= 4 and min(splits[s]["row_groups"] for s in splits) >= 4
    parts = [f"etl/{p}" for s in SPLITS for p in splits[s]["parts"]]
    run = manifest["run_id"]
    # not the folder placeholders pyarrow writes when it deletes the run's _tasks/ (no data)
    data = [k for k in bucket_keys(s3, bucket, "etl/") if not k.endswith("/")]
    assert data == sorted(["etl/manifest.json", f"etl/runs/{run}/rejected.jsonl"] + parts)
    rows = sum(pq.read_metadata(pa.BufferReader(read_key(s3, bucket, p))).num_rows for p in parts)
    assert rows == expected["good"]  # the part files themselves, read from the bucket


def rank_host(test_hosts, workers, rank):
    """The worker host whose processes include rank ``rank``'s (the launcher's child, by its
    HOROVOD_RANK), read from /proc: independent of the job's own reports."""
    for host in workers:
        listed = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True).stdout
        for pid in listed.split():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    command = f.read()
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if b"pipelines.launch.child" in command and f"HOROVOD_RANK={rank}".encode() in environ:
                return host
    return None


def kill_host(host):
    """SIGKILL every process of ``host`` (its Spark worker, executor, Python workers, rank): the host
    is lost. Returns the number of processes killed."""
    killed = 0
    for _ in range(3):  # anything a dying process started meanwhile
        listed = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True).stdout
        for pid in map(int, listed.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.2)
    return killed


def on_rank_host_after(hosts_cluster, test_hosts, bucket, marker, rank, record, act):
    """A ``during`` for :func:`submit`: once ``marker`` (a checkpoint's completion marker) is in the
    bucket, ``act(host)`` on the host of rank ``rank``; ``record`` gets ``host`` and ``at`` (the act's start)."""
    _, s3, workers = hosts_cluster

    def during(proc):
        deadline = time.monotonic() + 300
        while not bucket_keys(s3, bucket, marker):
            assert proc.poll() is None and time.monotonic() < deadline, f"no {marker} before the job ended"
            time.sleep(0.1)
        host = rank_host(test_hosts, workers, rank)
        assert host is not None, f"rank {rank} runs on no worker host"
        record.update(host=host, at=time.monotonic())
        act(host)

    return during


def lose_rank_host_after(hosts_cluster, test_hosts, bucket, marker, rank, record):
    """:func:`on_rank_host_after` that kills every process of the host; ``record`` gets ``processes`` too."""
    return on_rank_host_after(hosts_cluster, test_hosts, bucket, marker, rank, record,
                              lambda host: record.update(processes=kill_host(host)))


@contextlib.contextmanager
def host_restored(hosts_cluster, record):
    """After the block, restart the Spark worker of the host ``record`` names (killed by the block),
    so the cluster has all its workers for the tests after it, whatever order they run in."""
    cluster, _, workers = hosts_cluster
    try:
        yield record
    finally:
        if "host" in record:
            cluster.restart_worker(workers.index(record["host"]))


def train_args(bucket, manifest_prefix, output, *extra):
    return ["--data", f"s3://{bucket}/{manifest_prefix}", "--output", f"s3://{bucket}/{output}", *TRAIN, *extra]


GLOO_TIMEOUT_S = 10  # the ranks' Gloo timeout in the recovered run (Horovod's default: 30 s)
CUT_S = 2 * GLOO_TIMEOUT_S  # how long a link stays down: past the Gloo timeout, well inside Spark's (120 s)


def cut_link(host):
    """Take ``host``'s link (eth0) down for ``CUT_S``, then up again."""
    subprocess.run(["ip", "-n", host.netns, "link", "set", "eth0", "down"], check=True)
    try:
        time.sleep(CUT_S)
    finally:
        subprocess.run(["ip", "-n", host.netns, "link", "set", "eth0", "up"], check=True)


@pytest.fixture(scope="module")
def recovered_run(hosts_cluster, test_hosts, hosts_etl):
    """Training ``--spark-np 4 --max-failures 2`` across the worker hosts, from and to the S3 server, that
    loses a host, then a link, and finishes. Rank 1 stalls at the end of epoch 2 (the fault hook) and,
    once checkpoint 2 is complete in the bucket, every process of its host is killed; once checkpoint 4
    is complete, rank 1's host of the relaunch loses its link for twice the ranks' Gloo timeout.
    Yields ``(process, metrics, record of the kill, record of the cut)``."""
    bucket, _, _, _, _ = hosts_etl
    _, s3, _ = hosts_cluster
    cut = {}
    with host_restored(hosts_cluster, {}) as killed:
        lose_host = lose_rank_host_after(hosts_cluster, test_hosts, bucket, "recovered/checkpoint-2.json", 1, killed)
        cut_host = on_rank_host_after(hosts_cluster, test_hosts, bucket, "recovered/checkpoint-4.json", 1, cut,
                                      cut_link)
        proc = submit(hosts_cluster, test_hosts, "train.py",
                      *train_args(bucket, "etl", "recovered", "--epochs", "8", "--warmup-epochs", "3",
                                  "--max-failures", "2"),
                      conf=[f"spark.executorEnv.{FAULT}=rank=1,epoch=2,mode=stall",
                            f"spark.executorEnv.HOROVOD_GLOO_TIMEOUT_SECONDS={GLOO_TIMEOUT_S}"],
                      during=lambda proc: (lose_host(proc), cut_host(proc)))
    assert proc.returncode == 0, proc.output[-4000:]
    return proc, json.loads(read_key(s3, bucket, "recovered/metrics.json")), killed, cut


def test_training_on_four_hosts_in_step_with_exact_test_metrics_and_outputs_in_the_bucket(
        recovered_run, hosts_etl, hosts_cluster):
    proc, m, _, _ = recovered_run
    bucket, manifest, _, _, _ = hosts_etl
    _, s3, workers = hosts_cluster
    assert m["world_size"] == 4 and len(m["weights_checksum_per_rank"]) == 4
    assert len(set(m["weights_checksum_per_rank"])) == 1  # every rank holds the same weights
    assert_exact_test_count(m, etl_on(s3, bucket))  # every test row once, summed over the 4 ranks' shards
    assert len(set(m["host_per_rank"])) == 4 and set(m["host_per_rank"]) <= {w.netns for w in workers}
    keys = bucket_keys(s3, bucket, "recovered/")
    for name in ("metrics.json", "model.keras", "model.json", "class_names.json", "history.csv",
                 "checkpoint-8.json", *(f"logs/rank-{r}.log" for r in range(4))):
        assert f"recovered/{name}" in keys, keys
    assert "test accuracy" in proc.output and "[rank 0 on " in proc.output


def test_a_lost_worker_host_is_replaced_and_the_job_continues_from_its_checkpoint(recovered_run, hosts_cluster):
    """The host of rank 1 lost (every process killed) after checkpoint 2: the driver relaunches the 4
    ranks on the 4 worker hosts left, which continue from checkpoint 2."""
    proc, m, killed, _ = recovered_run
    lost = killed["host"]
    first, second, _ = m["attempts"]
    assert (first["attempt"], first["world_size"], second["attempt"], second["world_size"]) == (1, 4, 2, 4)
    assert first["failure"].startswith(f"rank 1 on {lost.address} failed: "), m["attempts"]
    assert f"WARNING attempt 2 of 3: relaunching from the newest complete checkpoint after {first['failure']}" \
        in proc.output
    assert [(g["world_size"], g["from_epoch"], g["reason"]) for g in m["segments"][:2]] == \
        [(4, 1, "start"), (4, 3, "relaunch")]  # attempt 2 from checkpoint 2
    assert len(set(m["resumed_optimizer_checksum_per_rank"])) == 1
    assert lost.netns not in m["host_per_rank"] and len(set(m["host_per_rank"])) == 4


def test_a_worker_host_cut_off_past_the_gloo_timeout_is_relaunched(recovered_run):
    """Rank 1's host of attempt 2 cut off (eth0 down) for twice the ranks' Gloo timeout after
    checkpoint 4, then back: every rank's collective times out (a peer's loss, not an error of the
    job), the tasks report it once the link is back, and the driver relaunches the 4 ranks, which
    finish from the newest complete checkpoint."""
    proc, m, _, cut = recovered_run
    _, second, third = m["attempts"]
    # every rank's collective timed out: a peer's loss (Horovod shut down), which is relaunched
    assert re.match(r"rank \d on \S+ failed: .*(Horovod|Gloo|gloo|Spark executor lost)", second["failure"], re.S), second
    assert third == {"attempt": 3, "world_size": 4, "failure": None}, m["attempts"]
    assert "WARNING attempt 3 of 3: relaunching from the newest complete checkpoint after " in proc.output
    assert m["resumed_after_epoch"] >= 4 and [h["epoch"] for h in m["history"]] == list(range(1, 9))
    assert m["segments"][2]["from_epoch"] == m["resumed_after_epoch"] + 1 and len(m["segments"]) == 3
    assert m["epochs_run_per_rank"] == [8 - m["resumed_after_epoch"]] * 4
    assert "host" in cut and len(set(m["weights_checksum_per_rank"])) == 1


def test_without_max_failures_a_lost_host_fails_the_job_promptly_naming_rank_and_host(
        hosts_cluster, test_hosts, hosts_etl):
    bucket, _, _, _, _ = hosts_etl
    _, s3, _ = hosts_cluster
    with host_restored(hosts_cluster, {}) as killed:
        proc = submit(hosts_cluster, test_hosts, "train.py", *train_args(bucket, "etl", "failfast", "--epochs", "3"),
                      conf=[f"spark.executorEnv.{FAULT}=rank=1,epoch=1,mode=stall"],
                      during=lose_rank_host_after(hosts_cluster, test_hosts, bucket, "failfast/checkpoint-1.json",
                                                  1, killed))
    assert proc.returncode == 1, proc.output[-4000:]
    assert f"training failed: rank 1 on {killed['host'].address} failed: " in proc.output, proc.output[-4000:]
    assert proc.ended - killed["at"] < KILL_TO_EXIT_S, proc.ended - killed["at"]  # from the kill, not the start
    assert "WARNING attempt" not in proc.output
    assert not bucket_keys(s3, bucket, "failfast/metrics.json")


# On both stacks: the one training across the hosts on the current stack (its Horovod patch, PySpark, reader
# and pyarrow's S3 at a relaunch on another world size); a relaunch at the same size is mission's alone
@pytest.mark.current
def test_a_host_lost_for_good_without_a_spare_leaves_the_run_to_the_hosts_left(hosts_cluster, test_hosts, hosts_etl):
    """--spark-np 3 --min-np 2 --max-failures 1 with three worker hosts up (the other two stopped for
    the test): once checkpoint 2 is in the bucket, rank 1's host is lost for good (every process
    killed, its worker not restarted). No slot is free, so the driver relaunches on the 2 slots
    left, which continue from checkpoint 2 and finish: epoch 3 on 2 ranks (the global batch of 3
    ranks kept), exact validation and test counts, each attempt's and segment's world size recorded."""
    bucket, _, _, _, _ = hosts_etl
    cluster, s3, workers = hosts_cluster
    spares, lost = workers[3:], {}
    try:
        for host in spares:
            kill_host(host)
        deadline = time.monotonic() + 60
        while cluster.alive_workers() > len(workers) - len(spares):
            assert time.monotonic() < deadline, "the master still lists the stopped workers"
            time.sleep(0.5)
        proc = submit(hosts_cluster, test_hosts, "train.py",
                      *train_args(bucket, "etl", "shrunk", "--epochs", "3", "--warmup-epochs", "0", "--spark-np", "3",
                                  "--min-np", "2", "--max-failures", "1", "--slots-timeout", "20"),
                      conf=[f"spark.executorEnv.{FAULT}=rank=1,epoch=2,mode=stall"],
                      during=lose_rank_host_after(hosts_cluster, test_hosts, bucket, "shrunk/checkpoint-2.json", 1,
                                                  lost))
    finally:
        gone = [host for host in [*spares, lost.get("host")] if host is not None]
        cluster.restart_worker(*(workers.index(host) for host in gone))
    assert proc.returncode == 0, proc.output[-4000:]
    m = json.loads(read_key(s3, bucket, "shrunk/metrics.json"))
    (first, second) = m["attempts"]
    assert first["world_size"] == 3 and first["failure"].startswith(f"rank 1 on {lost['host'].address} failed: "), first
    assert second == {"attempt": 2, "world_size": 2, "failure": None}, m["attempts"]
    assert "WARNING relaunching on 2 ranks (world size 3 -> 2): the cluster offers 2 task slots now (--min-np 2, " \
           "--max-np 3)" in proc.output, proc.output[-4000:]
    assert m["world_size"] == 2 and m["resumed_after_epoch"] == 2 and [h["epoch"] for h in m["history"]] == [1, 2, 3]
    assert [(g["world_size"], g["per_rank_batches"], g["from_epoch"], g["reason"]) for g in m["segments"]] == \
        [(3, [2, 2, 2], 1, "start"), (2, [3, 3], 3, "relaunch")]  # the data world, 3 x 2 rows, kept
    assert m["epochs_run_per_rank"] == [1, 1] and len(set(m["weights_checksum_per_rank"])) == 1
    assert lost["host"].netns not in m["host_per_rank"] and len(set(m["host_per_rank"])) == 2
    assert m["validation"]["count"] == m["validation"]["expected_count"]
    assert_exact_test_count(m, etl_on(s3, bucket))
