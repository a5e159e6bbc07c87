"""Pictures of a training run, written by rank 0 beside ``metrics.json`` (matplotlib, Agg backend).

* :func:`plot_history` - ``curves.png``: loss and accuracy per epoch, training and validation;
* :func:`plot_confusion` - ``confusion.png``: the exact test confusion matrix (all ranks' sum);
* :func:`contact_sheet` - ``contact_sheet.png``: test images with their true and predicted
  labels, misses framed and labelled in red.

Each takes plain data (lists, arrays) and a path, writes one PNG atomically and returns the path.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np

from pipelines.logs import plural

MISS = "#d62728"
HIT = "#2ca02c"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> str:
    from pipelines.atomic import replacing

    plt = _pyplot()
    with replacing(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _name(class_names: Sequence[Optional[str]], index: int) -> str:
    name = class_names[index] if 0 <= index < len(class_names) else None
    return str(name) if name is not None else f"class {index}"


def plot_history(history: List[Dict], path: str) -> str:
    """Loss (left) and accuracy (right) per epoch, training and validation, from the history
    records of ``metrics.json`` (``epoch``, ``loss``, ``val_loss``, ``accuracy``, ``val_accuracy``)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    epochs = [h["epoch"] for h in history]
    for ax, metric in zip(axes, ("loss", "accuracy")):
        for key, label, style in ((metric, "train", "o-"), (f"val_{metric}", "validation", "s--")):
            values = [h.get(key, float("nan")) for h in history]
            if any(not math.isnan(v) for v in values):
                ax.plot(epochs, values, style, label=label)
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} per epoch")
        ax.grid(alpha=0.3)
        ax.legend()
        if epochs:
            ax.set_xticks(epochs if len(epochs) <= 15 else epochs[::max(1, len(epochs) // 10)])
    axes[1].set_ylim(0, 1.02)
    return _save(fig, path)


def plot_confusion(matrix, class_names: Sequence[Optional[str]], path: str, title: str = "") -> str:
    """The confusion matrix, rows = true class, columns = predicted, counts in the cells."""
    plt = _pyplot()
    m = np.asarray(matrix, np.int64)
    k = len(m)
    names = [_name(class_names, i) for i in range(k)]
    side = max(4.0, 0.7 * k + 2.5)
    fig, ax = plt.subplots(figsize=(side + 1, side))
    image = ax.imshow(m, cmap="Blues", vmin=0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(range(k), names, rotation=45, ha="right")
    ax.set_yticks(range(k), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    total = int(m.sum())
    accuracy = np.trace(m) / total if total else float("nan")
    ax.set_title(title or f"test confusion matrix: {plural(total, 'image')}, accuracy {accuracy:.3f}")
    high = m.max() / 2 if m.size else 0
    for i in range(k):
        for j in range(k):
            ax.text(j, i, str(m[i, j]), ha="center", va="center", fontsize=9,
                    color="white" if m[i, j] > high else "black")
    return _save(fig, path)


def contact_sheet(images, true: Sequence[int], pred: Sequence[int], class_names: Sequence[Optional[str]],
                  path: str, columns: int = 8) -> str:
    """A grid of uint8 RGB ``images`` titled ``true -> predicted``; misses framed and titled in red."""
    plt = _pyplot()
    n = len(images)
    columns = max(1, min(columns, n))
    rows = max(1, math.ceil(n / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(2.0 * columns, 2.3 * rows), squeeze=False)
    misses = 0
    for index, ax in enumerate(axes.ravel()):
        ax.set_xticks([])
        ax.set_yticks([])
        if index >= n:
            ax.axis("off")
            continue
        hit = int(true[index]) == int(pred[index])
        misses += not hit
        color = HIT if hit else MISS
        ax.imshow(np.asarray(images[index], np.uint8))
        label = _name(class_names, int(true[index]))
        if not hit:
            label += f"\n-> {_name(class_names, int(pred[index]))}"
        ax.set_title(label, fontsize=8, color="black" if hit else MISS)
        for spine in ax.spines.values():
            spine.set_edgecolor(color)
            spine.set_linewidth(1 if hit else 4)
    fig.suptitle(f"{plural(n, 'test image')}: true label (misses in red: true -> predicted), {misses} missed",
                 fontsize=10)
    return _save(fig, path)
