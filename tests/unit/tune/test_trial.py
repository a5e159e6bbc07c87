"""One trial on tiny synthetic features (no Spark, no MLflow): exact validation totals, the same
seed the same head, early stopping by the rule, a diverging trial failed, the test split read by the refit only."""
from dataclasses import replace

import numpy as np
import pytest

from pipelines.training.divergence import TrainingDiverged
from pipelines.training.stopping import RULES
from pipelines.tune.search import choose
from pipelines.tune.runners import TrialRecord
from pipelines.tune.space import HeadSettings
from pipelines.tune.trial import TrialPlan, evaluate, refit_and_test, run_trial, train_head


def _split(rng, n, classes=3, dim=6, scale=2.0):
    labels = rng.integers(0, classes, n).astype(np.int32)
    features = (rng.normal(size=(n, dim)) + scale * np.eye(classes, dim)[labels]).astype(np.float32)
    return features, labels


@pytest.fixture(scope="module")
def splits():
    rng = np.random.default_rng(0)
    return _split(rng, 32), _split(rng, 16), _split(rng, 16)


PLAN = TrialPlan(epochs=6, batch_size=8, ranks=1, seed=3, rule=RULES["converge"], num_classes=3)
SETTINGS = HeadSettings(base_lr=0.01, dropout=0.2, weight_decay=0.001, patience_steps=40)


def test_a_trial_reports_the_exact_validation_totals_of_its_best_weights_and_repeats_them(splits):
    train, validation, _ = splits
    model, result = train_head(SETTINGS, PLAN, train, validation)
    loss, accuracy = evaluate(model, validation)
    probabilities = model.predict(validation[0], verbose=0)
    exact = -np.mean(np.log(probabilities[np.arange(len(validation[1])), validation[1]]))
    assert (result.val_loss, result.val_accuracy) == (loss, accuracy)
    assert result.val_loss == pytest.approx(exact, rel=1e-5)
    assert result.val_accuracy == np.mean(probabilities.argmax(1) == validation[1])
    assert result.steps_per_epoch == 4 and 1 <= result.best_epoch <= result.epochs_run <= PLAN.epochs
    assert result.test_loss is None and result.test_accuracy is None
    assert run_trial(SETTINGS, PLAN, train, validation).val_loss == result.val_loss  # same seed, same head


def test_ranks_scale_the_batch_and_the_rate_as_horovodrun_would(splits):
    train, validation, _ = splits
    result = run_trial(SETTINGS, replace(PLAN, ranks=2, epochs=1), train, validation)
    assert result.steps_per_epoch == 2  # 32 rows / (8 x 2)


def test_early_stopping_follows_the_rule_with_the_trials_patience(splits):
    """A rate of ~0 never gains: the run stops after the rule's patience, max(floor, ceil(steps / 4))."""
    train, validation, _ = splits
    plan = replace(PLAN, epochs=30, rule=replace(RULES["converge"], min_delta=10.0))
    result = run_trial(replace(SETTINGS, base_lr=1e-9, patience_steps=20), plan, train, validation)
    assert (result.best_epoch, result.epochs_run) == (1, 1 + 5)  # patience ceil(20 / 4) = 5 > floor 3


def test_a_diverging_trial_raises_training_diverged(splits):
    train, validation, _ = splits
    huge = (train[0] * np.float32(1e37), train[1])
    with pytest.raises(TrainingDiverged, match="the trial diverged at epoch 1"):
        run_trial(SETTINGS, PLAN, huge, validation)


def test_the_refit_is_the_chosen_trial_again_then_the_test_split_once(splits):
    train, validation, test = splits
    trial = run_trial(SETTINGS, PLAN, train, validation)
    refit = refit_and_test(SETTINGS, PLAN, train, validation, test)
    assert (refit.val_loss, refit.val_accuracy, refit.best_epoch) == (trial.val_loss, trial.val_accuracy,
                                                                      trial.best_epoch)
    assert refit.test_loss > 0 and 0 <= refit.test_accuracy <= 1


def _record(number, val_loss):
    result = None if val_loss is None else {"val_loss": val_loss, "val_accuracy": 0.5}
    return TrialRecord(number, f"run{number}", SETTINGS, result, None if result else "diverged")


def test_the_choice_is_the_lowest_validation_loss_failed_trials_aside():
    chosen = choose([_record(0, 0.9), _record(1, None), _record(2, 0.4), _record(3, float("nan")), _record(4, 0.4)])
    assert chosen.number == 2


def test_no_completed_trial_is_no_choice():
    from pipelines.tune.search import NoTrialFinished

    with pytest.raises(NoTrialFinished, match="all 2 trials failed"):
        choose([_record(0, None), _record(1, None)])


def test_a_trial_starts_from_the_probe_and_keeps_it_unless_training_beats_it_on_validation(splits):
    """The probe as the first head weights: with a rate of ~0 the trained head is the start; a useless start
    (every class equal) is beaten by training and left; a start better than training is kept as epoch 0."""
    from pipelines.training.probe import fit_probe, head_weights

    train, validation, _ = splits
    start = head_weights(fit_probe(*train, *validation, grid=(1.0,))["head"], 3)
    probe_plan = replace(PLAN, start=start)
    model, still = train_head(replace(SETTINGS, base_lr=1e-9), probe_plan, train, validation)
    logits = validation[0] @ start[0] + start[1]
    assert still.val_accuracy == pytest.approx(np.mean(logits.argmax(1) == validation[1]))
    flat = [np.zeros_like(start[0]), np.zeros_like(start[1])]  # loss log(3) on every row
    beaten = run_trial(SETTINGS, replace(PLAN, start=flat), train, validation)
    assert beaten.best_epoch >= 1 and beaten.val_loss < np.log(3)
    kept = run_trial(replace(SETTINGS, base_lr=0.5, patience_steps=4), replace(probe_plan, epochs=2), train,
                     validation)
    started = run_trial(replace(SETTINGS, base_lr=1e-9), replace(probe_plan, epochs=1), train, validation)
    assert kept.val_loss <= started.val_loss + 1e-6
    assert (kept.best_epoch == 0) == (kept.val_loss == pytest.approx(started.val_loss, rel=1e-6))
