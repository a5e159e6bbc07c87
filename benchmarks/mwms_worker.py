"""One worker of the trainer benchmark's peer: TensorFlow's own ``MultiWorkerMirroredStrategy``.

Started by ``benchmarks/trainer_bench.py`` as ``python benchmarks/mwms_worker.py SPEC`` once per
worker, each with its ``TF_CONFIG`` (the cluster's ``worker`` addresses on localhost and this
worker's index; none for a lone worker). ``SPEC`` is a pickle of ``(config, warmup_steps, steps,
result_path)``: ``config`` the benchmark's :class:`~pipelines.training.config.TrainConfig`, the
same one our Horovod ranks get. The worker trains what a Horovod rank of
:func:`measure.measure_throughput` trains, with only the trainer changed: the same model
(:func:`pipelines.training.model.build.build_model`, built inside the strategy's scope), the same
``Nadam(base_lr x workers)``, loss and metric, the same shard of the same ETL output read by the same
reader and ``tf.data`` pipeline (:meth:`pipelines.training.inputs.ImageInputs.reader_dataset`,
worker ``i`` reading shard ``i``, handed to the strategy as it is by
``distribute_datasets_from_function``: one replica per worker, no re-sharding and no re-batching),
the same per-worker batch, float32, and the same core binding and TensorFlow threads. Its gradients
are summed across workers by the strategy's own collectives (``CommunicationImplementation.RING``:
TensorFlow's ring all-reduce over gRPC, what ``AUTO`` picks on CPUs) inside Keras' ``fit``.

Writes ``result_path`` (JSON): ``worker``, ``workers``, ``batch_size``, ``steps``, ``seconds``
(this worker's timed window, :func:`measure.step_window`), ``first_step_seconds``,
``allreduce_seconds`` (one all-reduce of the step's gradients alone: :func:`allreduce_seconds`) and
``communication``. This is benchmark code: nothing under ``pipelines/`` imports it.
"""
from __future__ import annotations

import json
import os
import pickle
import sys


def bind(threads: int) -> list:
    """Bind this process to its worker's ``threads`` cores, as a Horovod rank binds
    (:func:`pipelines.training.devices.rank_cores` of the worker index among the ``TF_CONFIG``
    cluster's workers), before TensorFlow starts any thread. Returns the cores."""
    from pipelines.training.devices import rank_cores

    cluster = json.loads(os.environ.get("TF_CONFIG") or "{}")
    workers = len(cluster.get("cluster", {}).get("worker", [])) or 1
    index = int(cluster.get("task", {}).get("index", 0))
    cores = rank_cores(index, workers, threads, os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores)
    return cores


def train(config, warmup_steps: int, steps: int) -> dict:
    """Train ``warmup_steps + steps`` steps under the strategy on this worker's shard; returns the
    result (see the module's docstring)."""
    import tempfile

    import tensorflow as tf

    from pipelines.stack.kerasapi import keras
    from pipelines.training.data import load_dataset
    from pipelines.training.model.finetune import unfreeze
    from pipelines.training.inputs import ImageInputs
    from pipelines.training.model.build import build_model
    from pipelines.training.rank import Rank
    from pipelines.training.schedule import scaled_lr

    import measure

    tf.config.threading.set_intra_op_parallelism_threads(config.compute.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)  # as setup_rank sets a Horovod rank's
    ring = tf.distribute.experimental.CommunicationImplementation.RING
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=ring))
    workers = strategy.num_replicas_in_sync  # one CPU replica per worker
    index = strategy.cluster_resolver.task_id if workers > 1 else 0
    dataset = load_dataset(config.loader.data, workers, config.storage_options)
    size_px = config.model.input_size(dataset.stored_size)
    with strategy.scope():
        model = build_model(dataset.num_classes, size_px, config.model.dropout, config.model.weights,
                            seed=config.fit.seed, backbone=config.model.backbone, stored_size=dataset.stored_size)
        unfreeze(model, config.model.backbone, config.model.fine_tune_blocks)
        model.compile(optimizer=keras.optimizers.Nadam(learning_rate=scaled_lr(config.fit.base_lr, workers)),
                      loss="sparse_categorical_crossentropy",
                      metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
    window = measure.step_window(warmup_steps, steps)
    # the worker as a rank of the strategy's workers: ImageInputs shards by its rank and size
    worker = Rank(index, workers, local_rank=0, local_size=1, threads=config.compute.threads)
    inputs = ImageInputs(config, dataset, worker, model, size_px)
    with tempfile.TemporaryDirectory(prefix=f"mwms-worker{index}-") as cache_root:
        with inputs.reader_dataset("train", cache_root) as ds:
            distributed = strategy.distribute_datasets_from_function(lambda context: ds)
            model.fit(distributed, epochs=1, steps_per_epoch=warmup_steps + steps, verbose=0, callbacks=[window])
    return {"worker": index, "workers": workers, "batch_size": config.fit.batch_size, "steps": steps,
            "seconds": window.seconds, "first_step_seconds": window.first_step_seconds,
            "allreduce_seconds": allreduce_seconds(strategy, model.trainable_variables, steps) if workers > 1 else 0.0,
            "communication": "RING (gRPC)" if workers > 1 else "none (one worker)"}


def allreduce_seconds(strategy, variables, repeats: int) -> float:
    """Median wall seconds of one all-reduce (sum) of tensors shaped as ``variables`` (the trainable
    ones: what a step's gradients are) across the strategy's workers, in one replica context as
    Keras' optimizer makes it (``get_replica_context().all_reduce``), timed over ``repeats`` calls
    after one untimed; collective: every worker calls it the same number of times."""
    import statistics
    import time

    import tensorflow as tf

    @tf.function
    def exchange():
        def replica():
            return tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, [tf.zeros_like(v) for v in variables])
        return strategy.run(replica)

    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        [t.numpy() for t in tf.nest.flatten(strategy.experimental_local_results(exchange()))]
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main(argv) -> int:
    with open(argv[1], "rb") as f:
        config, warmup_steps, steps, result_path = pickle.load(f)
    if config.compute.bind_cores:
        bind(config.compute.threads)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import pipelines  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads: Keras 2 on both stacks)

    result = train(config, warmup_steps, steps)
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
