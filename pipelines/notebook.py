"""Helpers of the notebooks: sample data on demand, runs through HorovodRunner, tables and plots.

The notebooks stay a readable walk through the article's steps; what they share lives here. Nothing
here needs ``dbutils``: paths are plain (on Databricks, give ``/dbfs/...`` paths).
"""
from __future__ import annotations

import json
import os
from typing import Dict, Optional

WORKDIR_ENV = "PIPELINES_WORKDIR"


def default_workdir() -> str:
    """``$PIPELINES_WORKDIR``, or ``~/pipelines-work``: where the notebooks write."""
    return os.path.abspath(os.path.expanduser(os.environ.get(WORKDIR_ENV, "~/pipelines-work")))


def ensure_sample_etl(workdir: str, image_size: int = 299, test_fraction: float = 0.3, spark=None,
                      input_dir: Optional[str] = None, sample: str = "tuxpaint",
                      per_class: Optional[int] = None) -> str:
    """The ETL output folder ``workdir/etl``, made first when it has no manifest.

    With no ``input_dir``, a sample is fetched into ``workdir/<sample>`` first: ``tuxpaint`` (148
    photos, 8 classes) or ``fashion-mnist`` (``per_class`` images of each of 10 classes, all when
    ``None``). An existing ``workdir/etl`` is reused as it is, whatever it was made from.
    Returns the ETL output folder.

    Raises:
        ValueError: an unknown ``sample``.
    """
    from pipelines.tools import samples
    from pipelines.etl.config import ETLConfig
    from pipelines.etl.job import run_etl

    if sample not in ("tuxpaint", "fashion-mnist"):
        raise ValueError(f"unknown sample {sample!r}: tuxpaint or fashion-mnist")
    etl = os.path.join(workdir, "etl")
    if not os.path.exists(os.path.join(etl, "manifest.json")):
        if not input_dir:
            input_dir = os.path.join(workdir, sample)
            extra = ["--per-class", str(per_class)] if (sample == "fashion-mnist" and per_class) else []
            samples.main([sample, "--dest", input_dir, *extra])
        from pyspark.sql import SparkSession

        ours = spark is None and SparkSession.getActiveSession() is None
        run_etl(ETLConfig(input=input_dir, output=etl, image_size=image_size, test_fraction=test_fraction), spark)
        if ours:  # a session this call started would hold a JVM through everything that follows
            SparkSession.getActiveSession().stop()
    return etl


def train(np: int = -1, **config) -> Dict:
    """Train with ``TrainConfig(**config)`` on ``abs(np)`` ranks via :class:`HorovodRunner`
    (``np < 0``: local processes, ``np > 0``: Spark barrier tasks); return rank 0's report.

    Each run is a fresh set of processes, so a notebook can train several times.
    """
    from pipelines.launcher import HorovodRunner
    from pipelines.training.config import TrainConfig
    from pipelines.training.train import run_training

    return HorovodRunner(np=np).run(run_training, config=TrainConfig(**config))


def history_frame(report: Dict):
    """Per-epoch history of a report as a pandas DataFrame indexed by epoch."""
    import pandas as pd

    return pd.DataFrame(report["history"]).set_index("epoch")


def summary_table(reports: Dict[str, Dict]):
    """One row per run: world size, global batch, learning rate, epochs, seconds per epoch,
    steady-state training images/s and exact test accuracy."""
    import pandas as pd

    rows = []
    for label, r in reports.items():
        h = history_frame(r)
        steady = h["epoch_seconds"].iloc[1:] if len(h) > 1 else h["epoch_seconds"]
        rows.append({"run": label, "world size": r["world_size"], "global batch": r["global_batch_size"],
                     "learning rate": r["learning_rate"], "epochs": r["epochs_run"], "best epoch": r["best_epoch"],
                     "s / epoch": round(float(steady.mean()), 2),
                     "train images/s": round(r["train_images_per_second"] or 0.0, 1),
                     "test accuracy": round(r["test"]["accuracy"], 4)})
    return pd.DataFrame(rows).set_index("run")


def plot_curves(reports: Dict[str, Dict]):
    """Training curves of several runs: loss and validation accuracy per epoch. Returns the figure."""
    import matplotlib.pyplot as plt  # inline in a notebook kernel, Agg without a display

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for label, r in reports.items():
        h = history_frame(r)
        ax_loss.plot(h.index, h["loss"], marker="o", label=f"{label} train")
        ax_loss.plot(h.index, h["val_loss"], marker="x", linestyle="--", label=f"{label} val")
        ax_acc.plot(h.index, h["val_accuracy"], marker="o", label=label)
    ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
    ax_acc.set(xlabel="epoch", ylabel="val accuracy", title="validation accuracy")
    ax_loss.legend(fontsize=8)
    ax_acc.legend(fontsize=8)
    fig.tight_layout()
    return fig


def show_samples(etl_dir: str, split: str = "train", n: int = 8):
    """The first ``n`` images of a split with their labels, as stored (uint8 RGB). Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np
    import pyarrow.parquet as pq

    with open(os.path.join(etl_dir, "manifest.json")) as f:
        size = json.load(f)["image"]["height"]
    rows = pq.read_table(os.path.join(etl_dir, split), columns=["image", "label_name"]).slice(0, n).to_pylist()
    fig, axes = plt.subplots(1, len(rows), figsize=(2 * len(rows), 2.3), squeeze=False)
    for ax, row in zip(axes[0], rows):
        ax.imshow(np.frombuffer(row["image"], np.uint8).reshape(size, size, 3))
        ax.set_title(row["label_name"], fontsize=9)
        ax.axis("off")
    fig.tight_layout()
    return fig
