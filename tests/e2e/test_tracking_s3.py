"""Tracking on data in a bucket that only the storage options reach: a real training run (one
process, the tiny backbone) reads ``--data`` on the suite's S3 server (moto) with the endpoint
and credentials given as ``--storage-option`` only (the environment's endpoint is dead), and
tracks to an MLflow SQLite store; the run's params carry the manifest's sha256, read through the
options."""
import hashlib

import pytest

from pipelines.io.storage import resolve
from tests.support.datagen import write_dataset
from tests.support.planted import options_file
from tests.support.s3server import ACCESS_KEY, SECRET_KEY
from tests.support.training import train

pytestmark = pytest.mark.slow
DEAD_ENDPOINT = "http://127.0.0.1:9"  # discard: nothing answers there


# On the current stack too with the flags (its pyarrow's S3 filesystem, its MLflow): the options reach
# them the same way from a file, whose reading is the stack-free configuration's
@pytest.mark.parametrize("given", [pytest.param("flags", marks=pytest.mark.current), "file"])
def test_a_tracked_run_on_s3_data_that_needs_storage_options_logs_the_manifests_hash(s3_server, tmp_path, given):
    """The options as ``--storage-option`` flags, or in an owner-only ``--storage-options-file``;
    ``--output`` in the same bucket, reached through them too."""
    local = str(tmp_path / "etl")
    write_dataset(local, train_groups=[4], test_groups=[2], size=8)
    bucket = s3_server.bucket("track")
    data = f"s3://{bucket}/etl"
    resolve(data).upload(local)  # through the environment's endpoint, before it is made dead below
    out = f"s3://{bucket}/out"
    options = {"endpoint_override": s3_server.endpoint, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY,
               "region": "us-east-1"}
    store = tmp_path / "store" / "mlruns.db"
    proc = train(data, out, "--epochs", "1", "--tracking", "--tracking-uri", f"sqlite:///{store}",
                 *(["--storage-options-file", options_file(tmp_path, options)] if given == "file" else
                   [arg for key, value in options.items() for arg in ("--storage-option", f"{key}={value}")]),
                 np_=0, cache=str(tmp_path / "cache"), env={"AWS_ENDPOINT_URL": DEAD_ENDPOINT, "AWS_ACCESS_KEY_ID": "wrong",
                             "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(f"{local}/manifest.json", "rb") as f:
        expected = hashlib.sha256(f.read()).hexdigest()
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{store}")
    runs = [run for experiment in client.search_experiments()
            for run in client.search_runs([experiment.experiment_id])]
    assert len(runs) == 1 and runs[0].data.params["data.manifest_sha256"] == expected
    assert runs[0].info.status == "FINISHED"
    assert resolve(out + "/metrics.json").read_json()["world_size"] == 1  # the environment reaches the server
