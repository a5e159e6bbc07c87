"""What a job left, read back: a training run's metrics, the Parquet files an ETL output's manifest
names, its test rows counted in their footers, the MLflow run a job logged."""
import json
import os


def etl_parts(output: str, split: str) -> list:
    """The local paths of the Parquet files the manifest of the ETL output ``output`` names for
    ``split`` (the only files of it a reader may read)."""
    from pipelines.manifest import Manifest

    return [part.location.path for part in Manifest.read(output).part_locations(output, split)]


def read_metrics(output: str) -> dict:
    """The ``metrics.json`` a training run wrote to ``output``."""
    with open(os.path.join(output, "metrics.json")) as f:
        return json.load(f)


def parquet_test_rows(data) -> int:
    """The test split's rows of the ETL output ``data`` (a path, URI or ``pipelines.io.storage.Location``),
    counted in the footers of the Parquet files its manifest names: not the manifest's own count,
    which the training run took its expected count from."""
    import pyarrow.parquet as pq

    from pipelines.manifest import Manifest
    from pipelines.io.storage import Location, resolve

    root = data if isinstance(data, Location) else resolve(data)
    rows = 0
    for part in Manifest.read(root).part_locations(root, "test"):
        with part.open() as f:
            rows += pq.ParquetFile(f).metadata.num_rows
    return rows


def assert_exact_test_count(report: dict, data) -> None:
    """A run evaluated every test row once: the rows it counted, the rows it expected, and the rows
    the test split's Parquet files hold (:func:`parquet_test_rows` of the ETL output ``data``)
    are one number."""
    test, rows = report["test"], parquet_test_rows(data)
    assert rows > 0 and test["count"] == test["expected_count"] == rows, (test, rows)


def mlflow_run(output: str):
    """The one MLflow run a job logged for ``output``, as its ``mlflow_run.json`` records it (store
    and run id): ``(client, run)``. Fails when the run's experiment holds any other run. The store
    becomes this process's tracking URI too: ``runs:/`` and ``models:/`` URIs, and a server's
    proxied artifacts, resolve through it."""
    from pipelines.tracking import RUN_FILE, open_store

    with open(os.path.join(output, RUN_FILE)) as f:
        record = json.load(f)
    client = open_store(record["tracking_uri"])
    runs = client.search_runs([record["experiment_id"]])
    assert [r.info.run_id for r in runs] == [record["run_id"]], [r.info.run_id for r in runs]
    return client, runs[0]


def checkpoint_bytes(n: int) -> bytes:
    """The bytes of a real checkpoint file (an ``.npz``) whose one array has ``n`` float32 values:
    other ``n``, other bytes and size, as a marker records them."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, trainable_0000=np.arange(n, dtype=np.float32))
    return buffer.getvalue()
