"""Fixtures of the end-to-end tests: the test hosts and their Spark cluster (tests/e2e/test_hosts.py),
and a small real ETL output with uneven train shards (the training job's tests)."""
import os

import pytest

from pipelines.etl.config import ETLConfig
from pipelines.etl.job import run_etl
from tests.support import s3server
from tests.support.imagegen import make_tree
from tests.support.outputs import etl_parts
from tests.support.training import SIZE, shard_rows


@pytest.fixture(scope="session")
def test_hosts():
    """Seven test hosts (``scripts/testhosts.sh``, through tests/support/testhosts.py): h1 for a Spark master,
    h2 for an S3 server, h3-h7 for workers (four for a job of 4 ranks, and a spare that lets a job
    relaunch at its world size when a worker host is lost). Skips, printing the machine's refusal, where network
    namespaces cannot be made (not root, ``ip netns add`` refused); removed even when tests fail."""
    from tests.support.testhosts import TestHosts, refusal

    reason = refusal()
    if reason:
        pytest.skip(reason)
    hosts = TestHosts(7)
    try:
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="session")
def hosts_cluster(test_hosts, tmp_path_factory):
    """A Spark standalone cluster across the test hosts: the master on h1, one worker of 1 core on
    each of h3-h7, ``moto_server`` on h2 (port 9000). Yields ``(cluster, s3 server, worker hosts)``;
    the workers' environment (which executors inherit) points AWS_ENDPOINT_URL at h2."""
    from pipelines.launch.cluster import Place, StandaloneCluster

    master, s3_host, *workers = test_hosts.hosts
    base = tmp_path_factory.mktemp("hosts")
    s3 = s3server.start(9000, str(base / "moto.log"), host=s3_host.address, command=test_hosts.command(s3_host))
    places = [Place(w.address, tuple(test_hosts.command(w)), os.path.join(w.folder, "spark-worker")) for w in workers]
    try:
        with StandaloneCluster(cores=1, memory="1g", work_dir=str(base / "cluster"),
                               env=s3server.standard_environment(s3.endpoint),
                               master_at=Place(master.address, tuple(test_hosts.command(master))),
                               workers_at=places) as cluster:
            yield cluster, s3, workers
    finally:
        s3.stop()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, spark):
    """A small real ETL output whose two train shards hold different numbers of rows."""
    base = tmp_path_factory.mktemp("train-data")
    make_tree(str(base / "tree"), classes=3, per_class=26, bad=False)
    out = str(base / "etl")
    for partitions in (3, 4, 5, 2):
        manifest = run_etl(ETLConfig(input=str(base / "tree"), output=out, image_size=SIZE, test_fraction=0.3,
                                     min_row_groups=4, num_partitions=partitions), spark)
        rows = shard_rows(etl_parts(out, "train"))
        if rows[0] != rows[1]:
            assert sum(rows) == manifest["splits"]["train"]["rows"]
            return out, manifest
    pytest.fail(f"could not make uneven shards: {rows}")
