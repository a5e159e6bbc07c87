"""The averaging proof, on every stack: 2 Horovod ranks (``horovodrun -np 2 --gloo``) with
rank-dependent data take one SGD step; every rank's weights must equal the step computed here by
hand from the gradient averaged over both ranks, and differ from a rank training alone.

It guards the Horovod patch of the current stack (scripts/patches/) and the Keras 2 import point
(pipelines/stack/kerasapi.py): run it on every TensorFlow or Horovod bump. It is shown to fail when ranks
train alone: the same run without ``DistributedOptimizer`` (``plain``) and, on the current stack, a
Keras 3 optimizer handed to Horovod (``keras3``) give weights the proof rejects.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pipelines import stack
from tests.support.averaging_ranks import LEARNING_RATE, UNEVEN, W0, batch, uneven
from tests.support.env import BIN, REPO, subprocess_env

pytestmark = pytest.mark.current  # on the current stack too (make test's current share)

ON_CURRENT = stack.active().name == "current"


def gradient(rank: int) -> np.ndarray:
    """The gradient of rank ``rank``'s loss ``mean((x @ w - y)^2)`` at ``W0``: ``2/n x^T (x W0 - y)``,
    float64, shape (3, 1)."""
    x, y = (a.astype(np.float64) for a in batch(rank))
    return 2.0 / len(x) * x.T @ (x @ W0.astype(np.float64) - y)


def averaged_step(size: int) -> np.ndarray:
    """The weights after one SGD step on the gradient averaged over ``size`` ranks (Horovod's
    ``Average``): ``W0 - lr * mean_r(grad_r)``, shape (3,)."""
    return (W0 - LEARNING_RATE * np.mean([gradient(r) for r in range(size)], axis=0)).ravel()


def alone_step(rank: int) -> np.ndarray:
    """The weights after one SGD step of rank ``rank`` on its own gradient, shape (3,)."""
    return (W0 - LEARNING_RATE * gradient(rank)).ravel()


def assert_averaged(results: list, mode: str) -> None:
    """Every rank holds the hand-computed averaged step (to float32 precision), which differs from
    each rank's step alone. Raises AssertionError otherwise."""
    expected = averaged_step(len(results))
    for result in results:
        got = np.array(result[mode])
        assert np.allclose(got, expected, rtol=0, atol=1e-6), (mode, result["rank"], got, expected)
        assert not np.allclose(got, alone_step(result["rank"]), rtol=0, atol=1e-3), (mode, result["rank"])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list:
    """Both ranks' results of one ``horovodrun -np 2 --gloo`` run of tests/support/averaging_ranks.py."""
    out = tmp_path_factory.mktemp("averaging")
    modes = ["distributed", "horovod", "plain", "weighted", "unweighted"] + (["keras3", "keras3_refused"] if ON_CURRENT else [])
    command = [os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
               sys.executable, os.path.join(REPO, "tests", "support", "averaging_ranks.py"), str(out), *modes]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=subprocess_env(PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = []
    for rank in range(2):
        with open(out / f"rank-{rank}.json") as f:
            results.append(json.load(f))
    assert [r["size"] for r in results] == [2, 2]
    return results


def global_batch_step() -> np.ndarray:
    """The weights after one SGD step on the gradient of the mean loss over the whole global batch
    of :func:`tests.support.averaging_ranks.uneven`'s rows, shape (3,)."""
    x, y = (np.concatenate(parts).astype(np.float64) for parts in zip(*(uneven(r, 2)[:2] for r in range(2))))
    assert len(x) == UNEVEN
    return (W0 - LEARNING_RATE * 2.0 / len(x) * x.T @ (x @ W0.astype(np.float64) - y)).ravel()


def test_the_hand_computed_steps_differ():
    """The data makes the proof able to fail: each rank alone steps elsewhere than the average."""
    assert not np.allclose(alone_step(0), alone_step(1), atol=1e-3)
    assert not np.allclose(averaged_step(2), alone_step(0), atol=1e-3)


@pytest.mark.slow
def test_every_rank_takes_the_averaged_step(ranks):
    assert_averaged(ranks, "distributed")


@pytest.mark.slow
def test_the_allreduce_traced_without_autograph_steps_as_horovods_own(ranks):
    """pipelines.stack.kerasapi traces Horovod's gradient allreduce without AutoGraph (faster start of
    every rank): the step equals the one through Horovod's own wrapper, bit for bit."""
    assert_averaged(ranks, "horovod")
    for result in ranks:
        assert result["distributed"] == result["horovod"], result


@pytest.mark.slow
def test_unequal_per_rank_batches_with_their_loss_weights_step_as_the_whole_global_batch(ranks):
    """Ranks of 3 and 4 rows (a run on another world size than its data world): with each row's
    loss weighted n b_j / G, Keras' reduction and Horovod's average give the step of the mean over
    the 7 rows on every rank; without the weights, another step (the proof can fail)."""
    expected = global_batch_step()
    assert [len(uneven(r, 2)[0]) for r in range(2)] == [3, 4]
    for result in ranks:
        assert np.allclose(result["weighted"], expected, rtol=0, atol=1e-6), (result["weighted"], expected)
        assert not np.allclose(result["unweighted"], expected, rtol=0, atol=1e-4), result["unweighted"]


@pytest.mark.slow
def test_ranks_that_train_alone_fail_the_proof(ranks):
    """Without DistributedOptimizer each rank takes its own step: the proof must reject that."""
    for result in ranks:
        assert np.allclose(result["plain"], alone_step(result["rank"]), rtol=0, atol=1e-6)
    with pytest.raises(AssertionError):
        assert_averaged(ranks, "plain")


@pytest.mark.slow
@pytest.mark.skipif(not ON_CURRENT, reason="Keras 3 exists on the current stack only (TF 2.15 has Keras 2)")
def test_a_keras_3_optimizer_trains_alone_and_is_refused_before_any_step(ranks):
    """On TF 2.21 Horovod wraps a Keras 3 optimizer without error and without averaging (the
    hazard); the project's wrapper refuses it, naming the class."""
    for result in ranks:
        assert np.allclose(result["keras3"], alone_step(result["rank"]), rtol=0, atol=1e-6)
        assert "Keras 2" in result["keras3_refused"] and "keras" in result["keras3_refused"], result
    with pytest.raises(AssertionError):
        assert_averaged(ranks, "keras3")
