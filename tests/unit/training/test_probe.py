"""The linear probe (pure: numpy and scikit-learn)."""
import numpy as np
import pytest

from pipelines.training.probe import ProbeRefused, check_grid, fit_probe, stratified_rows


def blobs(n, classes=3, width=8, spread=0.5, seed=0):
    """``n`` rows around ``classes`` well separated centres (the same centres for every seed)."""
    centres = np.random.default_rng(123).normal(size=(classes, width)) * 4
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % classes
    return (centres[labels] + rng.normal(scale=spread, size=(n, width))).astype(np.float32), labels.astype(np.int32)


def test_separable_classes_are_learned_and_reported():
    train, val, test = blobs(60, seed=1), blobs(30, seed=2), blobs(30, seed=3)
    result = fit_probe(*train, *val, *test, grid=(0.01, 1.0))
    assert result["validation_accuracy"] == 1.0 and result["test_accuracy"] == 1.0
    assert (result["rows"], result["train_rows"], result["features"], result["classes"]) == (60, 60, 8, 3)
    assert [p["C"] for p in result["grid"]] == [0.01, 1.0] and result["C"] in (0.01, 1.0)
    assert result["seconds"] > 0 and result["converged"]


def test_c_is_chosen_on_validation_and_the_test_split_chooses_nothing():
    """Noisy classes: the grid's validation accuracies differ. The chosen C is the validation
    path's best; any test split, even one whose labels are shuffled, leaves the choice alone."""
    train, val, test = blobs(90, spread=4.0, seed=4), blobs(45, spread=4.0, seed=5), blobs(45, spread=4.0, seed=6)
    grid = (0.0001, 0.01, 1.0, 100.0)
    result = fit_probe(*train, *val, *test, grid=grid)
    best = max(result["grid"], key=lambda p: (p["validation_accuracy"], -p["validation_loss"], -p["C"]))
    assert result["C"] == best["C"] and result["validation_accuracy"] == best["validation_accuracy"]
    assert len({p["validation_accuracy"] for p in result["grid"]}) > 1  # the grid's choice matters here
    shuffled = fit_probe(*train, *val, test[0], np.random.default_rng(0).permutation(test[1]), grid=grid)
    assert shuffled["C"] == result["C"] and shuffled["grid"] == result["grid"]
    assert fit_probe(*train, *val, grid=grid)["test_accuracy"] is None


def test_rows_are_capped_by_a_stratified_sample():
    labels = np.array([0] * 90 + [1] * 10)
    rows = stratified_rows(labels, 20, seed=0)
    assert len(rows) == 20 and (labels[rows] == 1).sum() == 2 and list(rows) == sorted(rows)
    assert list(stratified_rows(labels, 100, seed=0)) == list(range(100))
    train = blobs(300, seed=7)
    result = fit_probe(*train, *blobs(30, seed=8), max_rows=30, max_iter=5)
    assert (result["rows"], result["train_rows"], result["max_iter"]) == (30, 300, 5)
    assert all(p["iterations"] <= 5 for p in result["grid"])


@pytest.mark.parametrize("grid", [(), (0.0,), (-1.0, 1.0), (float("nan"),), (float("inf"),)])
def test_a_bad_grid_is_refused(grid):
    with pytest.raises(ProbeRefused, match="C grid must be finite numbers > 0"):
        check_grid(grid)


def test_arrays_it_cannot_fit_are_refused():
    x, y = blobs(30)
    with pytest.raises(ProbeRefused, match="validation split has 4 features, the train split 8"):
        fit_probe(x, y, x[:, :4], y)
    with pytest.raises(ProbeRefused, match="train split: features"):
        fit_probe(x, y[:10], x, y)
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ProbeRefused, match="train split holds non-finite features"):
        fit_probe(bad, y, x, y)
    with pytest.raises(ProbeRefused, match="two classes"):
        fit_probe(x, np.zeros_like(y), x, y)
    with pytest.raises(ProbeRefused, match="max_rows and max_iter must be >= 1"):
        fit_probe(x, y, x, y, max_iter=0)


def report_with(probe, model_accuracy, rule="converge", count=30):
    return {"probe": probe, "validation": {"accuracy": model_accuracy, "expected_count": count},
            "stopping": {"rule": rule}}


FITTED = {"C": 0.1, "validation_accuracy": 0.7667, "test_accuracy": 0.7955, "rows": 74, "seconds": 1.5}


def test_the_log_says_the_probes_figures_and_one_line_more_when_the_model_trails_it():
    from pipelines.training.records.report import PROBE_NEEDS_FEATURES, probe_lines, probe_metrics

    first = ("linear probe (logistic regression on the same frozen features, C 0.1 chosen on validation): "
             "validation accuracy 0.7667, test accuracy 0.7955; 74 train rows, 1.5 s")
    assert probe_lines(report_with(FITTED, 0.7667)) == [first]
    assert probe_lines(report_with(FITTED, 0.75)) == [first]  # 1.7 points: within the margin of 2
    trailing = probe_lines(report_with(FITTED, 0.7333))
    assert trailing[0] == first and len(trailing) == 2
    assert trailing[1].startswith("the model's validation accuracy 0.7333 trails the linear probe's 0.7667 by 3.3 "
                                  "points (one of 30 validation images is 3.3)")
    assert "--stopping converge" not in trailing[1] and "jobs/tune.py" in trailing[1]
    assert "try --stopping converge (the default, on val_loss)" in probe_lines(report_with(FITTED, 0.6, "article"))[1]
    assert probe_lines(report_with({"skipped": PROBE_NEEDS_FEATURES}, 0.5)) == [f"linear probe: none "
                                                                                f"({PROBE_NEEDS_FEATURES})"]
    assert probe_metrics(FITTED) == {"probe_C": 0.1, "probe_validation_accuracy": 0.7667,
                                     "probe_test_accuracy": 0.7955, "probe_seconds": 1.5, "probe_rows": 74}
    assert probe_metrics({"skipped": "--no-probe"}) == {} == probe_metrics(None)


def test_the_replay_of_a_rule_stops_where_the_job_would():
    """benchmarks/stopping_rules.py replays the job's rule on recorded curves ([val_loss,
    val_accuracy, test_loss, test_accuracy] an epoch)."""
    from benchmarks.stopping_rules import parse_rule, replay
    from pipelines.runtime.errors import Refused
    from pipelines.training.stopping import RULES, StoppingRule

    curve = [[1.0, 0.5, 0, 0], [0.8, 0.6, 0, 0], [0.9, 0.6, 0, 0], [0.7, 0.55, 0, 0], [0.75, 0.5, 0, 0],
             [0.76, 0.5, 0, 0], [0.77, 0.5, 0, 0]]
    assert replay(StoppingRule("val_loss", 0, 3, 0.0), curve, 4) == (3, 6)
    assert replay(StoppingRule("val_loss", 40, 3, 0.0), curve, 4) == (3, 6)  # 10 epochs: the curve ends
    assert replay(RULES["article"], curve, 4) == (1, 4)
    assert parse_rule("val_loss:100:3:0") == ("val_loss:100:3:0", StoppingRule("val_loss", 100, 3, 0.0))
    assert parse_rule("article") == ("article", RULES["article"])
    with pytest.raises(Refused, match="--rules val_loss:x:3:0"):
        parse_rule("val_loss:x:3:0")
    with pytest.raises(Refused, match="--patience must be an integer >= 1, got 0"):
        parse_rule("val_loss:100:0:0")


def softmax_of(x, weights):
    """What ``Dense(k, softmax)`` with ``weights`` gives for rows ``x``."""
    logits = x.astype(np.float64) @ weights[0] + weights[1]
    logits -= logits.max(axis=1, keepdims=True)
    return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)


@pytest.mark.parametrize("classes, num_classes, absent", [(3, 3, None), (2, 2, None), (4, 5, 4), (3, 4, 1)])
def test_the_probe_as_a_softmax_head_gives_its_probabilities_on_raw_features(classes, num_classes, absent):
    """The scaler folded into the kernel: the head on raw features gives the probe's probabilities on the
    standardized ones, for a binary probe (one row of coefficients) too; a class with no train rows gets ~0."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from pipelines.training.probe import head_weights

    x, y = blobs(120, classes=classes, spread=3.0, seed=9)
    x = x * np.arange(1, 9) + 5.0  # features of other scales and offsets, as a backbone's are
    y = np.where(y == absent, num_classes - 1, y) if absent is not None else y
    result = fit_probe(x, y, *blobs(30, classes=classes, seed=10), grid=(1.0,))
    weights = head_weights(result["head"], num_classes)
    assert [w.shape for w in weights] == [(8, num_classes), (num_classes,)] and weights[0].dtype == np.float32
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=1.0, max_iter=200).fit(scaler.transform(x), y)
    probabilities = softmax_of(x, weights)
    np.testing.assert_allclose(probabilities[:, model.classes_], model.predict_proba(scaler.transform(x)),
                               atol=2e-4)
    if absent is not None:
        assert absent not in model.classes_ and probabilities[:, absent].max() < 1e-4


def test_the_validation_loss_is_scikit_learns_and_a_class_missing_from_train_costs_its_clip():
    from sklearn.metrics import log_loss as sklearn_log_loss

    from pipelines.training.probe import log_loss

    probabilities = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]])
    labels, classes = np.array([0, 2, 1]), np.array([0, 1, 2])
    assert log_loss(labels, probabilities, classes) == pytest.approx(sklearn_log_loss(labels, probabilities))
    # column 1 is class 3 here; label 1 (absent from train) costs -log(1e-15)
    expected = -(np.log(0.7) + np.log(0.8) + np.log(1e-15)) / 3
    assert log_loss(labels, probabilities, np.array([0, 3, 2])) == pytest.approx(expected)
