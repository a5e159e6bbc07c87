"""Helpers of the notebooks: their set-up in one call, runs through HorovodRunner, tables and plots (no ``dbutils``)."""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional

from pipelines.backbones import DEFAULT_BACKBONE
from pipelines.io.storage import check_reachable, resolve
from pipelines.launch.config import LaunchConfig
from pipelines.manifest import Manifest
from pipelines.runtime.environment import read_settings
from pipelines.runtime.errors import Refused
from pipelines.runtime.quiet import quiet_by_default
from pipelines.tools import workspace
from pipelines.tracking import check_store
from pipelines.tracking.pictures import cut_name, plain_text
from pipelines.training.cli import check_before_ranks, fetch_weights
from pipelines.training.config import TrainConfig
from pipelines.training.train import run_training


class Setup(NamedTuple):
    """What a training notebook's set-up gives the cells after it."""

    workdir: str  #: where the notebook writes (runs): a folder or a URI
    data_dir: str  #: the ETL output: a folder or a URI
    base: Dict  #: the ``TrainConfig`` keywords every run of the notebook shares (``nb.train(**base, ...)``)


def setup(workdir: str = "", data_dir: str = "", weights: str = "", **train) -> Setup:
    """The set-up every training notebook starts with; prints the data and weights used.

    Args:
        workdir: "" = ``workspace.default_workdir()``; a local folder is made, a URI's store is checked.
        data_dir: "" = ``workdir/etl``, made from the Tux Paint sample if missing.
        weights: "" = the backbone's default (``workspace.ensure_weights``: Xception's ImageNet weights converted
            offline).
        train: more ``TrainConfig`` keywords for ``Setup.base``.

    Raises:
        pipelines.io.storage.StorageError: a URI ``workdir`` or ``data_dir`` whose store cannot be used."""
    quiet_by_default(read_settings().verbose)  # before the first TensorFlow or Spark import

    location = resolve(workdir or workspace.default_workdir())
    check_reachable(location, "workdir")
    location.makedirs()
    workdir = location.uri
    if data_dir:
        check_reachable(resolve(data_dir), "data_dir")
    data_dir = data_dir or workspace.ensure_sample_etl(workdir)
    weights = workspace.ensure_weights(weights, train.get("backbone", DEFAULT_BACKBONE))
    print("data:", data_dir, "| weights:", weights)
    return Setup(workdir, data_dir, dict(data=data_dir, weights=weights, tensorboard=False, **train))


def train(launch: Optional[LaunchConfig] = None, **config) -> Dict:
    """Train with ``TrainConfig(**config)`` on fresh ranks as ``launch`` says; return rank 0's report.

    Raises:
        ValueError, pipelines.launch.HorovodJobFailed: as ``jobs/train.py`` refuses or fails."""
    launch = launch or LaunchConfig(np=-1)
    if not launch.launches:
        raise Refused("nb.train needs ranks to launch: LaunchConfig(np=-N) (local processes) or np=N (Spark tasks)")
    settings = TrainConfig(**config)
    run = check_before_ranks(settings, launch.world_size)  # refusals before any rank starts
    if settings.outputs.tracking:
        check_store(settings.outputs.tracking_uri)  # a tracking server that does not answer, too
    runner = launch.runner(before_ranks=lambda: fetch_weights(settings))
    return runner.run(run_training, config=settings, run_id=run.run_id)  # a relaunch continues this run only


def history_frame(report: Dict):
    """Per-epoch history of a report as a pandas DataFrame indexed by epoch."""
    import pandas as pd

    return pd.DataFrame(report["history"]).set_index("epoch")


def summary_table(reports: Dict[str, Dict]):
    """One row per run: world size, batch, learning rate, epochs, speed and accuracies."""
    import pandas as pd

    rows = []
    for label, r in reports.items():
        h = history_frame(r)
        steady = h["epoch_seconds"].iloc[1:] if len(h) > 1 else h["epoch_seconds"]
        rows.append({"run": label, "world size": r["world_size"], "global batch": r["global_batch_size"],
                     "learning rate": r["learning_rate"], "epochs": r["epochs_run"], "best epoch": r["best_epoch"],
                     "s / epoch": round(float(steady.mean()), 2),
                     "train images/s": round(r["train_images_per_second"] or 0.0, 1),
                     "best validation accuracy": _rounded((r.get("validation") or {}).get("accuracy")),
                     "test accuracy": round(r["test"]["accuracy"], 4)})
    return pd.DataFrame(rows).set_index("run")


def _rounded(value):
    return None if value is None else round(value, 4)


@plain_text
def plot_curves(reports: Dict[str, Dict]):
    """Loss and validation accuracy per epoch of several runs, labels as plain text; returns the figure."""
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


@plain_text
def show_samples(etl_dir: str, split: str = "train", n: int = 8):
    """The first ``n`` images of a split with their labels (plain text, cut to ``NAME_CHARS``); returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np
    import pyarrow.parquet as pq

    manifest = Manifest.read(etl_dir)
    size = manifest.image_size
    rows: List[Dict[str, Any]] = []
    for part in manifest.part_locations(etl_dir, split):  # the files the manifest names, no others
        with part.open() as f:
            rows += pq.read_table(f, columns=["image", "label_name"]).slice(0, n - len(rows)).to_pylist()
        if len(rows) >= n:
            break
    fig, axes = plt.subplots(1, len(rows), figsize=(2 * len(rows), 2.3), squeeze=False)
    for ax, row in zip(axes[0], rows):
        ax.imshow(np.frombuffer(row["image"], np.uint8).reshape(size, size, 3))
        ax.set_title(cut_name(row["label_name"]), fontsize=9)
        ax.axis("off")
    fig.tight_layout()
    return fig
