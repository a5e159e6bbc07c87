"""Early stopping's rule (pure) and its flags."""
import pytest

from pipelines.runtime.config import parse_config
from pipelines.runtime.errors import Refused
from pipelines.training.config import TrainConfig
from pipelines.training.stopping import MONITORS, RULES, StoppingRule, resolve


@pytest.mark.parametrize("rule, steps_per_epoch, epochs", [
    (RULES["converge"], 5, 30),        # 74 train images, global batch 16: patience in steps, 150 / 5
    (RULES["converge"], 4, 38),        # ceil(150 / 4): whole epochs, never fewer steps than asked
    (RULES["converge"], 1875, 3),      # Caltech-256 scale (30,000 images, global batch 16): the floor
    (RULES["converge"], 33, 5),        # ceil(150 / 33) = 5 epochs above the floor of 3
    (RULES["converge"], 93, 3),        # 1,500 images (fashion-mnist's sample): ceil(150 / 93) = 2, the floor
    (RULES["article"], 5, 3),          # the article's: epochs only, whatever the size
    (RULES["article"], 1875, 3),
    (StoppingRule("val_loss", 100, 1, 0.0), 0, 100),  # 0 steps an epoch counted as 1
])
def test_patience_counts_steps_with_a_floor_in_epochs(rule, steps_per_epoch, epochs):
    assert rule.patience(steps_per_epoch) == epochs


def test_the_named_rules_watch_the_logged_metrics_in_their_direction():
    assert set(RULES) == {"converge", "article"}
    assert (RULES["converge"].monitor, RULES["converge"].mode) == ("val_loss", "min")
    assert RULES["article"] == StoppingRule("val_accuracy", 0, 3, 0.001) and RULES["article"].mode == "max"
    assert all(rule.monitor in MONITORS for rule in RULES.values())
    assert RULES["converge"].to_dict() == {"monitor": "val_loss", "patience_steps": RULES["converge"].patience_steps,
                                           "patience_epochs": 3, "min_delta": 0.0}


def test_given_values_replace_the_rules_own():
    assert resolve("article") == RULES["article"]
    assert resolve("article", patience_epochs=10) == StoppingRule("val_accuracy", 0, 10, 0.001)
    assert resolve("converge", monitor="val_accuracy", patience_steps=0, min_delta=0.01) == StoppingRule(
        "val_accuracy", 0, RULES["converge"].patience_epochs, 0.01)


@pytest.mark.parametrize("make, message", [
    (lambda: resolve("fast"), "--stopping fast: choose one of converge, article"),
    (lambda: resolve("converge", monitor="accuracy"), "--monitor accuracy: early stopping watches a metric"),
    (lambda: resolve("converge", monitor="val_acc"), "--monitor val_acc: early stopping watches a metric"),
    (lambda: resolve("converge", patience_epochs=0), "--patience must be an integer >= 1, got 0"),
    (lambda: resolve("article", patience_epochs=-2), "--patience must be an integer >= 1, got -2"),
    (lambda: resolve("converge", patience_steps=-1), "--patience-steps must be an integer >= 0, got -1"),
    (lambda: resolve("converge", min_delta=float("nan")), "--min-delta must be a finite number >= 0, got nan"),
    (lambda: resolve("converge", min_delta=-0.5), "--min-delta must be a finite number >= 0, got -0.5"),
    (lambda: StoppingRule("val_loss", 100, True, 0.0), "--patience must be an integer >= 1, got True"),
])
def test_a_rule_no_run_can_use_is_refused_naming_the_flag(make, message):
    with pytest.raises(Refused) as info:
        make()
    assert str(info.value).startswith(message)


def train_config(*flags):
    return parse_config(TrainConfig, ["--data", "d", "--output", "o", "--no-tracking", *flags])


def test_the_config_records_the_rule_each_value_settled():
    """What --resume continues is the values recorded, not a default a later version may change."""
    default = train_config().fit
    assert (default.stopping, default.rule) == ("converge", RULES["converge"])
    assert (default.monitor, default.patience, default.patience_steps, default.min_delta) == (
        "val_loss", 3, RULES["converge"].patience_steps, 0.0)
    article = train_config("--stopping", "article", "--patience", "10").fit
    assert article.rule == StoppingRule("val_accuracy", 0, 10, 0.001)
    monitored = train_config("--monitor", "val_accuracy", "--patience-steps", "0", "--min-delta", "0.01").fit
    assert monitored.rule == StoppingRule("val_accuracy", 0, 3, 0.01)
    again = TrainConfig(data="d", output="o", tracking=False, stopping="article", monitor="val_loss").fit
    assert again.rule == StoppingRule("val_loss", 0, 3, 0.001)
    assert TrainConfig(data="d", output="o", tracking=False, **{k: getattr(again, k) for k in (
        "stopping", "monitor", "patience", "patience_steps", "min_delta")}).fit == again


@pytest.mark.parametrize("flags, message", [
    (["--monitor", "loss"], "--monitor loss: early stopping watches a metric every epoch logs: val_loss or "
                            "val_accuracy"),
    (["--monitor", "val_top5"], "--monitor val_top5: early stopping watches a metric"),
    (["--patience", "0"], "--patience must be an integer >= 1, got 0"),
    (["--patience=-3"], "--patience must be an integer >= 1, got -3"),
    (["--patience-steps=-1"], "--patience-steps must be an integer >= 0, got -1"),
    (["--min-delta", "nan"], "--min-delta must be a finite number >= 0, got nan"),
    (["--stopping", "patient"], "--stopping patient: choose one of converge, article"),
    (["--head-init", "zeros"], "--head-init zeros: choose one of probe, random"),
    (["--head-init", ""], "--head-init : choose one of probe, random"),
])
def test_bad_stopping_flags_exit_2_in_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as info:
        train_config(*flags)
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and len(err.splitlines()) == 1, err


def test_resume_continues_only_a_checkpoint_that_watched_the_same_metric():
    """Its best value and waiting count are of the metric it watched; a checkpoint written before
    the rule was recorded watched val_accuracy, the only metric there was."""
    from pipelines.training.resume import check_monitor, watched

    new = {"weights": "checkpoint-4.npz", "early_stopping": {"best": 0.61, "wait": 2, "monitor": "val_loss"}}
    old = {"weights": "checkpoint-2.npz", "early_stopping": {"best": 0.7, "wait": 0, "best_epoch": 2}}
    assert (watched(new), watched(old)) == ("val_loss", "val_accuracy")
    check_monitor(new, "val_loss", "out")
    check_monitor(old, "val_accuracy", "out")
    with pytest.raises(Refused, match=r"^--resume: checkpoint checkpoint-2.npz in out stopped on val_accuracy, this "
                                      r"run's early stopping watches val_loss: give --monitor val_accuracy"):
        check_monitor(old, "val_loss", "out")
    with pytest.raises(Refused, match=r"stopped on val_loss, this run's early stopping watches val_accuracy: give "
                                      r"--monitor val_loss"):
        check_monitor(new, "val_accuracy", "out")
