"""The training job run as a test runs it (under horovodrun or alone, the tiny backbone), and the
rows Petastorm gives each shard of a real ETL output."""
import os
import subprocess
import sys

from pipelines.training.data import petastorm_available
from tests.support.env import BIN, REPO, subprocess_env

SIZE = 71  # Xception's smallest input


def train(data, output, *args, np_=2, env=None, timeout=420, tensorboard=False, pictures=False, cache=None,
          own_group=False):
    """Run jobs/train.py under horovodrun (np_ > 0) or alone (np_ == 0) on the tiny backbone (the
    Xception run: tests/e2e/test_training_hvd.py's ``full_run``); return the finished process. The Petastorm cache is
    ``cache``, else ``OUTPUT-cache`` (a local ``output``'s sibling). ``own_group``: in a process
    group of its own (a signal to the job's group then spares the tests). ``pictures``: draw them
    (about 1.5 of a tiny job's 13 CPU-s); MLflow only where a test asks (tests/conftest.py)."""
    job = [sys.executable, os.path.join(REPO, "jobs", "train.py"), "--data", data, "--output", output,
           "--weights", "none", "--backbone", "tiny", "--batch-size", "4", "--cache-dir", cache or output + "-cache",
           *([] if tensorboard else ["--no-tensorboard"]), *([] if pictures else ["--no-pictures"]),
           *args]
    cmd = job if np_ == 0 else [os.path.join(BIN, "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}",
                                "--gloo", *job]
    return subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env(**(env or {})), timeout=timeout,
                          start_new_session=own_group)


def refused_launch(tmp_path, spark_np, test_groups, **env):
    """jobs/train.py alone with ``--spark-np spark_np`` on a small dataset (4 train row groups,
    ``test_groups`` test ones) in ``tmp_path``, the environment's ``env`` added: a launch the tests
    expect refused before any rank. Returns the finished process and its stderr's ERROR lines."""
    from tests.support.datagen import write_dataset

    write_dataset(str(tmp_path / "data"), train_groups=[4], test_groups=[test_groups])
    proc = subprocess.run([sys.executable, os.path.join(REPO, "jobs", "train.py"), "--data", str(tmp_path / "data"),
                           "--output", str(tmp_path / "out"), "--spark-np", str(spark_np), "--batch-size", "1",
                           "--backbone", "tiny", "--weights", "none"],
                          capture_output=True, text=True, timeout=300, env=subprocess_env(**env))
    return proc, [line for line in proc.stderr.splitlines() if " ERROR " in line]


def shard_rows(files, shards=2):
    """Rows Petastorm itself gives each shard (one unshuffled pass of its own reader per shard);
    where Petastorm cannot run, the rows of the readers' rule (row groups ``shard::shards``)."""
    import warnings
    if not petastorm_available():
        import pyarrow.parquet as pq
        metas = [pq.read_metadata(f) for f in files]  # row groups in file order, as split_row_groups lists them
        groups = [meta.row_group(i).num_rows for meta in metas for i in range(meta.num_row_groups)]
        return [sum(groups[shard::shards]) for shard in range(shards)]
    from petastorm import make_batch_reader
    warnings.simplefilter("ignore", FutureWarning)  # pyarrow's deprecations, raised inside petastorm
    counts = []
    for shard in range(shards):
        with make_batch_reader(["file://" + f for f in files], schema_fields=["label"], cur_shard=shard, shard_count=shards,
                               num_epochs=1, shuffle_row_groups=False, reader_pool_type="dummy") as reader:
            counts.append(sum(len(batch.label) for batch in reader))
    return counts


def error_lines(text):
    return [line for line in text.splitlines() if " ERROR " in line]
