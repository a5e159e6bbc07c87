"""Horovod across separate hosts: network namespaces on this machine (scripts/testhosts.sh), a
Spark master, four 1-core workers and the S3 server each on a host of its own, the driver on the
bridge. One driver run (tests/hosts_driver.py) serves every test here: HorovodRunner(np=4) with
the default interface, then with each host's unroutable interface named."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tests import s3server
from tests.conftest import subprocess_env
from tests.hosts_driver import PAUSE_S, VECTOR

pytestmark = pytest.mark.slow
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosts_driver.py")


@pytest.fixture(scope="module")
def driver_run(hosts_cluster, test_hosts, tmp_path_factory):
    """Run the driver; yields ``(lines, log_dir, bucket)``, ``lines`` as ``(arrival s, text)``
    in the order they reached this process."""
    cluster, s3, _ = hosts_cluster
    bucket, log_dir = s3.bucket("hosts"), str(tmp_path_factory.mktemp("rank-logs"))
    env = subprocess_env(SPARK_LOCAL_IP=test_hosts.driver, PYTHONUNBUFFERED="1",
                         **s3server.standard_environment(s3.endpoint))
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
    assert sorted(h.name for h in hosts) == sorted(w.name for w in workers)  # one rank per worker host
    addresses = {w.address for w in workers}
    rendezvous = everyone[0]["address"]
    for rank, host in zip(everyone, hosts):
        assert rank["address"] == host.address and rank["hostname"] == host.netns
        assert rank["tmpdir"] == os.path.join(host.folder, "tmp")
        assert rank["total"] == [x * (1 + 2 + 3 + 4) for x in VECTOR]  # [10, 20, 30]
        assert rank["plan"]["HOROVOD_GLOO_IFACE"] == "eth0"  # eth1 is listed first, and unroutable
        assert rank["plan"]["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == rendezvous
        assert rank["plan"]["HOROVOD_HOSTNAME"] == host.address
        assert all(v != test_hosts.driver for v in rank["plan"].values())
        # Gloo's ring: connections from this host's address to the other worker hosts only
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
