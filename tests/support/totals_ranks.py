"""One rank of the exact totals' sum over ranks (tests/ranks/test_exact_validation.py), run by
``horovodrun -np 2 --gloo``.

Usage: python tests/support/totals_ranks.py OUT_DIR
Each rank builds its own :class:`~pipelines.training.evaluate.Totals` per case (:func:`rank_totals`,
rank 1 empty in ``gathered_one_empty``), sums them with ``allreduce_totals`` and writes every case's
sum (or its error) to ``OUT_DIR/rank-R.json``. The cases take both of its routes: label pairs
allgathered (many classes, few rows) and the matrix allreduced (few classes, more rows).
"""
import json
import os
import sys

import numpy as np

import pipelines  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow, as every launch path does)

#: case -> (classes on rank 0, on rank 1; rows on rank 0, on rank 1)
CASES = {"gathered": (50, 50, 4, 3), "gathered_one_empty": (50, 50, 5, 0), "reduced": (3, 3, 30, 20),
         "uncounted": (0, 0, 6, 2), "mismatched": (3, 4, 2, 2)}


def rank_totals(case: str, rank: int):
    """Rank ``rank``'s totals of ``case``: random probabilities and labels seeded by both."""
    from pipelines.training.evaluate import Totals, batch_totals

    k, rows = CASES[case][rank], CASES[case][2 + rank]
    rng = np.random.default_rng([rank, len(case)])
    if not k:
        return Totals(float(rows) / 2, rows // 2, rows)
    probs = rng.dirichlet(np.ones(k), rows)
    return batch_totals(probs, rng.integers(0, k, rows))


def main(out: str) -> None:
    import horovod.tensorflow as hvd

    from pipelines.training.evaluate import allreduce_totals

    hvd.init()
    result = {"rank": hvd.rank(), "size": hvd.size()}
    for case in CASES:
        try:
            t = allreduce_totals(rank_totals(case, hvd.rank()))
            result[case] = {"loss_sum": t.loss_sum, "correct": t.correct, "count": t.count,
                            "num_classes": t.num_classes, "confusion": t.confusion_matrix().tolist()}
        except ValueError as exc:
            result[case] = {"error": str(exc)}
    with open(os.path.join(out, f"rank-{hvd.rank()}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
