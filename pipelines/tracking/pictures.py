"""Pictures of a run's results (matplotlib, Agg), one PNG each, written atomically: curves, confusions, images.

Class names are any folder's names: drawn plain (`plain_text`) and cut (`cut_name`)."""
from __future__ import annotations

import functools
import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from pipelines.io.atomic import PUBLIC, replacing
from pipelines.runtime.logs import plural

#: The pictures' file names, stated once (their names in ``metrics.json``'s ``pictures``).
PICTURES = {"curves": "curves.png", "confusion": "confusion.png", "top_confusions": "top_confusions.png",
            "contact_sheet": "contact_sheet.png"}
MISS = "#d62728"
HIT = "#2ca02c"
PLAIN_TEXT: Any = {"text.parse_math": False, "text.usetex": False}  # matplotlib's rcParams, while a picture is drawn
NAME_CHARS = 40  # a longer class name is cut, so that no name stretches a picture without bound


def plain_text(draw):
    """Run the picture function ``draw`` under `PLAIN_TEXT`, so that a figure it returns shows its text plain too."""
    @functools.wraps(draw)
    def plain(*args, **kwargs):
        import matplotlib

        with matplotlib.rc_context(PLAIN_TEXT):
            return draw(*args, **kwargs)

    return plain


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> str:
    plt = _pyplot()
    try:
        with replacing(path, suffix=".png", mode=PUBLIC) as tmp:
            fig.savefig(tmp, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def _name(class_names: Sequence[Optional[str]], index: int) -> str:
    name = class_names[index] if 0 <= index < len(class_names) else None
    return cut_name(name if name is not None else f"class {index}")


def cut_name(name) -> str:
    """``name`` as text, cut to `NAME_CHARS` (its last character an ellipsis when cut)."""
    name = str(name)
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "\u2026"


@plain_text
def plot_history(history: List[Dict], path: str, best_epoch: Optional[int] = None, stopped_epoch: Optional[int] = None,
                 monitor: str = "", probe_accuracy: Optional[float] = None) -> str:
    """Loss (left) and accuracy (right) per epoch, training and validation, from ``metrics.json``'s history records.

    Args:
        best_epoch, stopped_epoch: early stopping's chosen (1-based, solid line) and last epoch (dotted line).
        monitor: the metric it watched, named in the legend.
        probe_accuracy: the linear probe's validation accuracy, a horizontal line on the right."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    epochs = [h["epoch"] for h in history]
    for ax, metric in zip(axes, ("loss", "accuracy")):
        for key, label, style in ((metric, "train", "o-"), (f"val_{metric}", "validation", "s--")):
            values = [h.get(key, float("nan")) for h in history]
            if any(not math.isnan(v) for v in values):
                ax.plot(epochs, values, style, label=label)
        watched = f" ({monitor})" if monitor else ""
        if best_epoch is not None:
            best = "the start (the linear probe's head)" if best_epoch == 0 else f"epoch {best_epoch}"
            ax.axvline(best_epoch, color="green", alpha=0.6, label=f"best: {best}{watched}")
        if stopped_epoch is not None:
            ax.axvline(stopped_epoch, color="red", linestyle=":", label=f"stopped after epoch {stopped_epoch}")
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} per epoch")
        ax.grid(alpha=0.3)
        ax.legend()
        if epochs:
            ax.set_xticks(epochs if len(epochs) <= 15 else epochs[::max(1, len(epochs) // 10)])
    if probe_accuracy is not None:
        axes[1].axhline(probe_accuracy, color="gray", linestyle="-.", label=f"linear probe {probe_accuracy:.3f}")
        axes[1].legend()
    axes[1].set_ylim(0, 1.02)
    return _save(fig, path)


#: Up to this many classes the confusion matrix shows every class's name and each cell's count;
#: above it, the matrix is an image (a pixel block per cell) with a readable subset of names.
CELL_TEXT_CLASSES = 30
#: The confusion picture's largest side, inches at 100 dpi (at most 2,400 px whatever the classes).
MAX_SIDE = 24.0
MAX_TICKS = 40  # class names on an axis of the image view: more are not legible at 7 pt
TOP_CONFUSIONS = 20


@plain_text
def plot_confusion(matrix, class_names: Sequence[Optional[str]], path: str, title: str = "") -> str:
    """The confusion matrix (rows true, columns predicted), on a figure of bounded size.

    Up to `CELL_TEXT_CLASSES` classes: names, counts; above: 12 x 10 in, row-normalised rates, `MAX_TICKS` names."""
    plt = _pyplot()
    m = np.asarray(matrix, np.int64)
    k = len(m)
    names = [_name(class_names, i) for i in range(k)]
    total = int(m.sum())
    accuracy = np.trace(m) / total if total else float("nan")
    title = title or f"test confusion matrix: {plural(k, 'class')}, {plural(total, 'image')}, accuracy {accuracy:.3f}"
    if k <= CELL_TEXT_CLASSES:
        side = min(MAX_SIDE, max(4.0, 0.7 * k + 2.5))
        fig, ax = plt.subplots(figsize=(side + 1, side))
        _matrix_image(fig, ax, m, names, list(range(k)), "Blues", vmax=None)
        high = m.max() / 2 if m.size else 0
        for i in range(k):
            for j in range(k):
                ax.text(j, i, str(m[i, j]), ha="center", va="center", fontsize=9,
                        color="white" if m[i, j] > high else "black")
    else:
        fig, ax = plt.subplots(figsize=(12, 10))
        rows = m.sum(axis=1, keepdims=True)
        rates = np.divide(m, rows, out=np.zeros(m.shape, np.float64), where=rows > 0)
        ticks = list(range(0, k, math.ceil(k / MAX_TICKS)))
        _matrix_image(fig, ax, rates, names, ticks, "viridis", vmax=1.0, fontsize=7)
        title += " (share of each true class)"
    ax.set_title(title)
    return _save(fig, path)


def _matrix_image(fig, ax, values, names: List[str], ticks: List[int], cmap: str, vmax, fontsize: int = 10):
    """``values`` drawn as an image with a colour bar and the names of the classes ``ticks`` on both axes."""
    image = ax.imshow(values, cmap=cmap, vmin=0, vmax=vmax, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax.set_xticks(ticks, [names[i] for i in ticks], rotation=45 if len(ticks) <= 15 else 90, ha="right"
                  if len(ticks) <= 15 else "center", fontsize=fontsize)
    ax.set_yticks(ticks, [names[i] for i in ticks], fontsize=fontsize)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")


def top_confusions(matrix, top: int = TOP_CONFUSIONS) -> List[tuple]:
    """The ``top`` largest non-zero off-diagonal cells ``[(true, predicted, count)]``, largest first, then by index."""
    m = np.array(matrix, np.int64)
    np.fill_diagonal(m, 0)
    flat = m.ravel()
    order = np.lexsort((np.arange(flat.size), -flat))[:top]  # count descending, then position
    return [(int(i) // len(m), int(i) % len(m), int(flat[i])) for i in order if flat[i] > 0]


@plain_text
def plot_top_confusions(matrix, class_names: Sequence[Optional[str]], path: str, top: int = TOP_CONFUSIONS) -> str:
    """`top_confusions` as horizontal bars ``true -> predicted`` on a fixed 10 x 6 in figure."""
    plt = _pyplot()
    pairs = top_confusions(matrix, top)
    fig, ax = plt.subplots(figsize=(10, 6))
    labels = [f"{_name(class_names, t)[:30]} -> {_name(class_names, p)[:30]}" for t, p, _ in pairs]
    counts = [c for _, _, c in pairs]
    ax.barh(range(len(pairs)), counts, color=MISS)
    ax.set_yticks(range(len(pairs)), labels, fontsize=8)
    ax.invert_yaxis()
    for y, count in enumerate(counts):
        ax.text(count, y, f" {count}", va="center", fontsize=8)
    ax.set_xlabel("test images")
    ax.set_title(f"the {plural(len(pairs), 'largest confusion')} (true -> predicted)" if pairs
                 else "no test image was confused")
    return _save(fig, path)


@plain_text
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
