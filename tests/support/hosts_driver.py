"""A driver for tests/e2e/test_hosts.py, run in this machine's network namespace (on the test hosts'
bridge): ``python tests/support/hosts_driver.py MASTER_URL BUCKET LOG_DIR``. One Spark application runs
HorovodRunner(np=4) twice on the worker hosts: ``probe`` with the default network interface
(prints ``RESULT <json>``: what every rank saw), then with ``network_interface="eth1"``, each
host's unroutable interface (prints ``FAILED <the error>``). Each rank checks its own binding
itself; a violated check fails the run naming the rank.
"""
import json
import sys

PAUSE_S = 3.0  # between a rank's first line and its end: a line seen earlier at the driver was live
VECTOR = [1.0, 2.0, 3.0]  # rank r contributes (r + 1) * VECTOR


def probe(driver: str, bucket: str, pause_s: float, gloo_timeout_s: int = 0):
    """One rank: its host's identity, an allreduce, the Gloo connections it holds, its identity
    written to the S3 server from its host; returns every rank's identity (allgather).
    ``gloo_timeout_s``: Gloo's connection timeout (0: Horovod's 30 s)."""
    import os
    import re
    import socket
    import time

    import horovod.tensorflow as hvd
    import psutil
    import tensorflow as tf

    from pipelines.launch.network import local_interfaces
    from pipelines.io.storage import resolve

    if gloo_timeout_s:
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(gloo_timeout_s)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    print(f"tick: rank {rank} of {size} started", flush=True)
    time.sleep(pause_s)
    total = hvd.allreduce(tf.constant(VECTOR) * (rank + 1), op=hvd.Sum).numpy().tolist()
    me = os.environ["SPARK_LOCAL_IP"]  # the test host's address (scripts/testhosts.sh)
    plan = {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")}
    process = psutil.Process()
    connections = getattr(process, "net_connections", process.connections)("tcp")
    peers = [(c.laddr.ip, c.raddr.ip) for c in connections if c.status == "ESTABLISHED"]
    expected = [x * size * (size + 1) / 2 for x in VECTOR]
    assert total == expected, (total, expected)
    assert plan["HOROVOD_HOSTNAME"] == me and me in local_interfaces()[plan["HOROVOD_GLOO_IFACE"]], plan
    leaked = {k: v for k, v in plan.items()
              if "localhost" in v or {driver, "127.0.0.1"} & set(re.findall(r"[\d.]+", v))}
    assert not leaked, leaked
    assert peers and all(local == me and remote not in (driver, "127.0.0.1") for local, remote in peers), peers
    identity = {"rank": rank, "address": me, "hostname": socket.gethostname(), "total": total, "plan": plan,
                "netns": os.stat("/proc/self/ns/net").st_ino, "peers": peers, "tmpdir": os.environ["TMPDIR"]}
    resolve(f"s3://{bucket}/ranks/rank-{rank}.json").write_bytes(json.dumps(identity).encode())
    everyone = hvd.allgather_object(identity)
    print(f"done: rank {rank}", flush=True)
    return everyone


def main(master: str, bucket: str, log_dir: str) -> None:
    import os

    from pipelines import HorovodJobFailed, HorovodRunner
    from pipelines.runtime.spark import spark_session

    driver = os.environ["SPARK_LOCAL_IP"]
    spark_session("hosts-test", master, {"spark.executor.memory": "512m", "spark.executor.cores": "1"})
    everyone = HorovodRunner(np=4, log_dir=log_dir).run(probe, driver=driver, bucket=bucket, pause_s=PAUSE_S)
    print("RESULT " + json.dumps(everyone), flush=True)
    try:
        HorovodRunner(np=4, network_interface="eth1").run(probe, driver=driver, bucket=bucket, pause_s=0.0,
                                                          gloo_timeout_s=3)
        print("FAILED nothing: the run over eth1 succeeded", flush=True)
    except HorovodJobFailed as exc:
        print(f"FAILED {exc}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
