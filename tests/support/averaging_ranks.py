"""One rank of the averaging proof (tests/ranks/test_averaging.py), run by ``horovodrun -np 2 --gloo``.

Usage: python tests/support/averaging_ranks.py OUT_DIR MODE [MODE ...]
Each rank builds the same linear model ``y = x @ w`` (3 weights, no bias, float32) from the same
starting weights, takes ONE Keras ``fit`` step of plain SGD on its own, rank-dependent batch
(:func:`batch`), and writes the weights after the step per mode to ``OUT_DIR/rank-R.json``. Modes:
``distributed`` (the project's path: :func:`pipelines.stack.kerasapi.distributed_optimizer`, which traces
Horovod's allreduce without AutoGraph), ``horovod`` (``hvd.DistributedOptimizer`` as Horovod builds
it, with AutoGraph), ``plain`` (no DistributedOptimizer: each rank trains alone), ``keras3`` (a
Keras 3 optimizer given straight to ``hvd.DistributedOptimizer``, the hazard the project refuses)
and ``keras3_refused`` (the same through our wrapper: the error text is written instead of weights);
``weighted`` and ``unweighted`` (the project's path on per-rank batches of unequal size, rows of
:func:`uneven`, with and without their loss weights: a run on another world size than its data
world, pipelines/training/dataworld.py).
"""
import json
import os
import sys

import numpy as np

import pipelines  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow, as every launch path does)

W0 = np.array([[0.5], [-0.25], [1.0]], dtype=np.float32)
LEARNING_RATE = 0.1
ROWS = 4
UNEVEN = 2 * ROWS - 1  # a global batch that 2 ranks split 3 + 4


def batch(rank: int):
    """Rank ``rank``'s batch: ``x`` float32 ``(ROWS, 3)``, ``y`` float32 ``(ROWS, 1)``, different per rank."""
    rng = np.random.default_rng(100 + rank)
    x = rng.uniform(-1, 1, (ROWS, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [2.0], [-1.0]], dtype=np.float32) + rank).astype(np.float32)
    return x, y


def uneven(rank: int, size: int):
    """Rank ``rank`` of ``size``'s rows of the global batch of the first :data:`UNEVEN` rows of
    ranks 0 and 1's batches, split as a run on another world size splits it
    (:func:`pipelines.training.dataworld.rank_rows`): ``x`` ``(b_j, 3)``, ``y`` ``(b_j, 1)`` and
    the rows' loss weight (:func:`~pipelines.training.dataworld.loss_weight`, ``None``: none)."""
    from pipelines.training.dataworld import loss_weight, rank_rows

    x, y = (np.concatenate(parts)[:UNEVEN] for parts in zip(*(batch(r) for r in range(2))))
    lo, hi = rank_rows(UNEVEN, rank, size)
    return x[lo:hi], y[lo:hi], loss_weight(hi - lo, UNEVEN, size)


def one_step(optimizer, keras, x, y, weight=None) -> list:
    """One ``fit`` step (the whole batch, mean squared error, each row's loss weighted ``weight``
    when given) of a fresh model starting at ``W0``."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].set_weights([W0])
    model.compile(optimizer=optimizer, loss="mse")
    weights = None if weight is None else np.full(len(x), weight, np.float32)
    model.fit(x, y, sample_weight=weights, batch_size=len(x), epochs=1, shuffle=False, verbose=0)
    return model.layers[0].get_weights()[0].ravel().tolist()


def main(out: str, modes) -> None:
    import horovod.tensorflow.keras as hvd

    from pipelines.stack.kerasapi import Keras3Error, distributed_optimizer, keras

    hvd.init()
    x, y = batch(hvd.rank())
    result = {"rank": hvd.rank(), "size": hvd.size()}
    for mode in modes:
        if mode == "distributed":
            result[mode] = one_step(distributed_optimizer(keras.optimizers.SGD(LEARNING_RATE)), keras, x, y)
        elif mode == "horovod":
            result[mode] = one_step(hvd.DistributedOptimizer(keras.optimizers.SGD(LEARNING_RATE)), keras, x, y)
        elif mode in ("weighted", "unweighted"):
            ux, uy, weight = uneven(hvd.rank(), hvd.size())
            result[mode] = one_step(distributed_optimizer(keras.optimizers.SGD(LEARNING_RATE)), keras, ux, uy,
                                    weight if mode == "weighted" else None)
        elif mode == "plain":
            result[mode] = one_step(keras.optimizers.SGD(LEARNING_RATE), keras, x, y)
        elif mode == "keras3":
            import keras as keras3  # Keras 3 on TF >= 2.16; its model too, as a user mixing them would
            result[mode] = one_step(hvd.DistributedOptimizer(keras3.optimizers.SGD(LEARNING_RATE)), keras3, x, y)
        elif mode == "keras3_refused":
            import keras as keras3
            try:
                distributed_optimizer(keras3.optimizers.SGD(LEARNING_RATE))
                result[mode] = "accepted"
            except Keras3Error as error:
                result[mode] = str(error)
        else:
            raise SystemExit(f"unknown mode {mode}")
    with open(os.path.join(out, f"rank-{hvd.rank()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
