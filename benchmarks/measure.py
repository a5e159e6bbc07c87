"""Measuring training: steady-state throughput at a world size, the share of step time spent in
allreduce (from Horovod's timeline), scaling efficiency, and time to the best epoch.

Used by ``benchmarks/scaling.py`` and ``benchmarks/time_to_accuracy.py`` (imported as ``measure``: the
benchmarks run as scripts from this folder). The arithmetic is pure;
:func:`measure_throughput` is the part every Horovod rank runs, and it trains exactly as
:func:`pipelines.training.train.run_training` does (same model, optimizer, data path), minus the
callbacks that only matter across epochs.

Terms, as the scaling literature uses them (e.g. Sergeev & Del Balso 2018, "Horovod: fast and easy
distributed deep learning in TensorFlow", and Goyal et al. 2017):
``speed_up(n) = images_per_second(n) / images_per_second(1)`` and
``scaling_efficiency(n) = speed_up(n) / n`` (1.0 = perfect linear scaling).
"""
from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

ALLREDUCE = "ALLREDUCE"
NEGOTIATE = "NEGOTIATE_ALLREDUCE"


def write_csv(rows: Sequence[Dict], path: str) -> None:
    """Write ``rows`` (dicts with the same keys, in the first row's order) as a CSV with a header."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def time_to_best(setup_seconds: float, epoch_seconds: Sequence[float], best_epoch: int) -> float:
    """Seconds from job start to the end of the best epoch (1-based ``best_epoch``, whose
    validation accuracy is known when it ends): ``setup_seconds`` spent before ``fit`` (processes,
    model, data and, for the feature cache, computing the features and fitting the probe) plus the
    epochs up to and including the best one (each with its validation pass). Epoch 0 is the start,
    the linear probe's head kept: ``setup_seconds`` alone.

    Raises:
        ValueError: ``best_epoch`` outside ``0..len(epoch_seconds)``.
    """
    if not 0 <= best_epoch <= len(epoch_seconds):
        raise ValueError(f"best epoch {best_epoch} is not one of the {len(epoch_seconds)} epochs run, nor the start")
    return setup_seconds + sum(epoch_seconds[:best_epoch])


def union_seconds(intervals: Iterable[Tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals, in their unit (overlaps count once)."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def load_timeline(path: str) -> List[Dict]:
    """Events of a Horovod timeline file (Chrome trace JSON). A file cut short (the job killed
    while recording) is read up to its last complete event; an empty file has none."""
    with open(path) as f:
        text = f.read().strip()
    if not text:  # created but never written: no collective ran while recording (world size 1)
        return []
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        cut = text[:text.rfind("}") + 1].rstrip().rstrip(",")
        return json.loads(cut + "]")


def timeline_phase_seconds(events: Iterable[Dict]) -> Dict[str, float]:
    """Wall seconds covered by each top-level phase of Horovod's timeline, over all tensors.

    Horovod records, per tensor (``pid``), nested ``B``/``E`` events: a top-level
    ``NEGOTIATE_ALLREDUCE`` (from the tensor being ready on the coordinator until every rank has
    reported it ready: waiting for the slowest rank) then ``ALLREDUCE`` (fusion-buffer copies and
    the collective itself, e.g. ``GLOO_ALLREDUCE``). Phases of different tensors overlap (they are
    fused), so each phase's intervals are merged before summing (:func:`union_seconds`).
    Timestamps are microseconds; the result is seconds. Unmatched events are ignored.
    """
    stacks: Dict[object, List[Tuple[str, float]]] = defaultdict(list)
    intervals: Dict[str, List[Tuple[float, float]]] = defaultdict(list)
    for event in events:
        phase, pid = event.get("ph"), event.get("pid")
        if phase == "B":
            stacks[pid].append((event["name"], float(event["ts"])))
        elif phase == "E" and stacks[pid]:
            name, start = stacks[pid].pop()
            if not stacks[pid]:
                intervals[name].append((start, float(event["ts"])))
    return {name: union_seconds(spans) / 1e6 for name, spans in intervals.items()}


@dataclass(frozen=True)
class ScalingPoint:
    """One measurement: ``world_size`` ranks, ``batch_size`` images per rank per step, ``steps``
    steady-state steps taking ``seconds`` (the slowest rank's window), the seconds of that
    window rank 0's timeline spent in ``ALLREDUCE`` and in ``NEGOTIATE_ALLREDUCE``, whether the
    gradients were allreduced as float16 (``fp16``) and the bytes a rank allreduces per step
    (``allreduce_bytes``: trainable parameters x 4, or x 2 with fp16)."""

    world_size: int
    batch_size: int
    steps: int
    seconds: float
    allreduce_seconds: float = 0.0
    negotiation_seconds: float = 0.0
    fp16: bool = False
    allreduce_bytes: int = 0

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def images_per_second(self) -> float:
        return self.steps * self.global_batch / self.seconds

    @property
    def step_ms(self) -> float:
        return 1000.0 * self.seconds / self.steps


def scaling_rows(points: Sequence[ScalingPoint]) -> List[Dict]:
    """One row per point, with ``speed_up`` and ``scaling_efficiency`` against the world size 1
    point of the same per-rank batch size and allreduce precision (``None`` when there is none).
    Rows are sorted by precision (float32 first), batch size, then world size. Shares are
    fractions of the measured window (0..1)."""
    single = {(p.batch_size, p.fp16): p.images_per_second for p in points if p.world_size == 1}
    rows = []
    for p in sorted(points, key=lambda p: (p.fp16, p.batch_size, p.world_size)):
        base = single.get((p.batch_size, p.fp16))
        speed_up = p.images_per_second / base if base else None
        rows.append({
            "world_size": p.world_size, "batch_size_per_rank": p.batch_size, "global_batch_size": p.global_batch,
            "steps": p.steps, "seconds": round(p.seconds, 3), "step_ms": round(p.step_ms, 1),
            "images_per_second": round(p.images_per_second, 2),
            "speed_up": round(speed_up, 3) if speed_up else None,
            "scaling_efficiency": round(speed_up / p.world_size, 3) if speed_up else None,
            "allreduce_share": round(p.allreduce_seconds / p.seconds, 4),
            "negotiation_share": round(p.negotiation_seconds / p.seconds, 4),
            "fp16_allreduce": p.fp16, "allreduce_bytes_per_step": p.allreduce_bytes,
        })
    return rows


def measure_throughput(config, batch_sizes: Sequence[int], warmup_steps: int, steps: int,
                       timeline_dir: Optional[str] = None, fp16_variants: Sequence[bool] = ()) -> List[Dict]:
    """Run by every Horovod rank: for each per-rank batch size, train the article's model (frozen
    Xception + dropout + softmax, ``hvd.DistributedOptimizer(Nadam(base_lr * size))``) on this rank's
    Petastorm shard for ``warmup_steps + steps`` steps and time the last ``steps`` (graph tracing,
    cold caches and the initial broadcast fall in the warm-up).

    ``config`` (a :class:`pipelines.training.config.TrainConfig`) gives the data, weights, model
    input size, dropout, learning rate, seed, shuffle buffer, reader workers and threads, as for
    training; its batch size, epochs and output are not used. ``config.compute.threads`` must be set
    (>= 1): every world size then runs the same threads per rank.

    With ``timeline_dir``, Horovod's timeline is recorded over the timed window into
    ``timeline_dir/np<size>-b<batch>[-fp16].json`` (needs ``HOROVOD_TIMELINE=DYNAMIC`` in the ranks'
    environment; only the coordinator, rank 0, writes it).

    With ``config.model.fine_tune_blocks`` N, the backbone's top N blocks are trainable, as in the
    fine-tuning phase (:func:`pipelines.training.model.finetune.unfreeze`): their gradients are allreduced
    too. ``fp16_variants`` (default: ``[config.compute.fp16_allreduce]``) lists the allreduce precisions to
    measure at each batch size: ``False`` float32, ``True`` ``hvd.Compression.fp16``.

    With ``config.compute.bind_cores``, every rank and all its threads are bound to ``config.compute.threads`` cores
    of its own (:func:`pipelines.training.devices.bind_to_cores`): every world size then gets
    exactly that many cores per rank, and a small world cannot borrow the idle cores a bigger one uses.

    Returns, on every rank, one dict per batch size and precision: ``world_size``, ``batch_size``,
    ``steps``, ``seconds`` (the slowest rank's window), ``timeline`` (a path or ``None``), ``fp16``,
    ``allreduce_bytes`` (:func:`pipelines.training.model.finetune.allreduce_bytes`) and
    ``first_step_seconds`` (the slowest rank's, :func:`step_window`).

    Raises:
        ValueError: ``warmup_steps < 1``, ``steps < 1`` or ``config.compute.threads < 1``.
    """
    if warmup_steps < 1 or steps < 1:
        raise ValueError(f"need warmup_steps >= 1 and steps >= 1, got {warmup_steps} and {steps}")
    if config.compute.threads < 1:
        raise ValueError(f"need threads >= 1 per rank, got {config.compute.threads}")
    threads, seed = config.compute.threads, config.fit.seed

    import tempfile

    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    from pipelines.stack.kerasapi import keras

    from pipelines.training.data import load_dataset
    from pipelines.training.model.finetune import allreduce_bytes, trainable_parameters, unfreeze
    from pipelines.training.inputs import ImageInputs
    from pipelines.training.model.build import build_model, compile_distributed
    from pipelines.training.schedule import scaled_lr
    from pipelines.training.rank import setup_rank

    # The job's own set-up: core binding before any thread, hvd.init, logging, device, threads.
    this = setup_rank(config, job="scaling")
    rank, size = this.rank, this.size
    log = logging.getLogger("pipelines")
    dataset = load_dataset(config.loader.data, size, config.storage_options)
    size_px = config.model.input_size(dataset.stored_size)

    results = []
    variants = [(b, fp16) for b in batch_sizes for fp16 in (fp16_variants or [config.compute.fp16_allreduce])]
    with tempfile.TemporaryDirectory(prefix=f"scaling-rank{rank}-") as cache_root:
        for batch_size, fp16 in variants:
            name = f"np{size}-b{batch_size}{'-fp16' if fp16 else ''}"
            keras.backend.clear_session()
            model = build_model(dataset.num_classes, size_px, config.model.dropout, config.model.weights, seed=seed,
                                backbone=config.model.backbone, stored_size=dataset.stored_size)
            unfreeze(model, config.model.backbone, config.model.fine_tune_blocks)
            compile_distributed(model, scaled_lr(config.fit.base_lr, size), fp16, config.compute.xla_on)
            timeline = os.path.join(timeline_dir, f"{name}.json") if timeline_dir else None
            window = step_window(warmup_steps, steps,
                                 on_start=(lambda t=timeline: hvd.start_timeline(t)) if timeline else None,
                                 on_stop=hvd.stop_timeline if timeline else None)
            inputs = ImageInputs(dataclasses.replace(config, batch_size=batch_size), dataset, this, model, size_px)
            with inputs.reader_dataset("train", os.path.join(cache_root, name)) as ds:
                model.fit(ds, epochs=1, steps_per_epoch=warmup_steps + steps, verbose=0,
                          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), window])
            seconds = max(hvd_tf.allgather_object(window.seconds, name=f"window_{name}"))
            sent = allreduce_bytes(trainable_parameters(model), fp16)
            if rank == 0:
                log.info("%s: %d steps in %.2f s, %.1f images/s; %.2f MB allreduced per step", name, steps, seconds,
                         steps * batch_size * size / seconds, sent / 1e6)
            first = max(hvd_tf.allgather_object(window.first_step_seconds, name=f"first_{name}"))
            results.append({"world_size": size, "batch_size": batch_size, "steps": steps, "seconds": seconds,
                            "timeline": timeline, "fp16": fp16, "allreduce_bytes": sent, "first_step_seconds": first})
    return results


def step_window(warmup_steps: int, steps: int, on_start=None, on_stop=None):
    """A Keras callback timing one ``fit``'s steps ``warmup_steps + 1 .. warmup_steps + steps``
    (1-based): ``seconds``, wall seconds from the end of step ``warmup_steps`` to the end of step
    ``warmup_steps + steps`` (``None`` until then), and ``first_step_seconds``, from ``fit``'s
    start (``on_train_begin``) to the end of step 1: the step function's tracing and graph
    building, the first collectives' set-up and one step. ``on_start``/``on_stop`` (no
    arguments) run where the timed window starts and ends (Horovod's timeline). Used by every
    trainer the benchmarks time, so that all are timed alike."""
    from pipelines.stack.kerasapi import keras

    class StepWindow(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.begin = self.start = self.seconds = self.first_step_seconds = None

        def on_train_begin(self, logs=None):
            self.begin = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                self.first_step_seconds = time.perf_counter() - self.begin
            if batch == warmup_steps - 1:
                if on_start:
                    on_start()
                self.start = time.perf_counter()
            elif batch == warmup_steps + steps - 1:
                self.seconds = time.perf_counter() - self.start
                if on_stop:
                    on_stop()

    return StepWindow()


def point_from_result(result: Dict) -> ScalingPoint:
    """A :class:`ScalingPoint` from one :func:`measure_throughput` result, its timeline read
    (after the job has ended, so that Horovod has finished writing it)."""
    phases: Dict[str, float] = {}
    if result.get("timeline") and os.path.isfile(result["timeline"]):
        phases = timeline_phase_seconds(load_timeline(result["timeline"]))
    return ScalingPoint(result["world_size"], result["batch_size"], result["steps"], result["seconds"],
                        phases.get(ALLREDUCE, 0.0), phases.get(NEGOTIATE, 0.0), result.get("fp16", False),
                        result.get("allreduce_bytes", 0))
