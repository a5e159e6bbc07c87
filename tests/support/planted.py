"""What the tests plant: secrets (in storage options, the environment, an owner-only file) to
check that no command line, log or page shows them, and a pickle that leaves a marker file when
unpickled, to check that no data file runs code."""
import json
import os

SECRET = "S3CR3T-FROM-A-FILE"
ENV_SECRET = "S3CR3T-FROM-THE-ENV"
URIS = ["--data", "s3://bucket/etl", "--output", "s3://bucket/out", "--no-tracking"]


def options_file(folder, options, mode=0o600):
    path = folder / "storage.json"
    path.write_text(json.dumps(options))
    path.chmod(mode)
    return str(path)


class Plant:
    """Unpickling it runs ``builtins.exec``, which Petastorm's "restricted" unpickler allows: it
    writes the marker file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def plant_common_metadata(folder, marker):
    """A ``_common_metadata`` in ``folder`` whose Petastorm unischema is the :class:`Plant` pickle."""
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    schema = pa.schema([("image", pa.binary())]).with_metadata(
        {b"dataset-toolkit.unischema.v1": pickle.dumps(Plant(marker))})
    pq.write_metadata(schema, os.path.join(folder, "_common_metadata"))
