"""The search space (pure): ranges parsed and refused, settings drawn and rounded, the flags they print."""
import math

import optuna
import pytest

from pipelines.runtime.config import parse_configs
from pipelines.runtime.errors import Refused
from pipelines.launch.config import LaunchConfig
from pipelines.training.config import TrainConfig
from pipelines.tune.space import HeadSettings, Range, SearchSpace, parse_range, significant


@pytest.mark.parametrize("text, kwargs, expected", [
    ("0.0001,0.01", {"at_least": 0, "log": True}, Range(0.0001, 0.01, log=True)),
    (" 0 , 0.7 ", {"at_least": 0, "below": 1}, Range(0.0, 0.7)),
    ("25,400", {"at_least": 0, "integer": True}, Range(25, 400, integer=True)),
    ("1e-5,1e-1", {"at_least": 0, "log": True}, Range(1e-5, 0.1, log=True)),
])
def test_a_range_is_two_numbers_low_below_high(text, kwargs, expected):
    assert parse_range("--x-range", text, **kwargs) == expected


@pytest.mark.parametrize("text, kwargs, words", [
    ("0.5,0.5", {}, "an empty range"),
    ("0.7,0.1", {}, "an empty range"),
    ("nan,1", {}, "finite"),
    ("0,inf", {}, "finite"),
    ("-inf,1", {}, "finite"),
    ("0.1", {}, "give LOW,HIGH"),
    ("0.1,0.2,0.3", {}, "give LOW,HIGH"),
    ("a,b", {}, "give LOW,HIGH"),
    ("", {}, "give LOW,HIGH"),
    ("0.5,10.5", {"integer": True}, "two integers"),
    ("0,0.01", {"at_least": 0, "log": True}, "LOW must be > 0"),
    ("-0.1,0.5", {"at_least": 0}, "LOW must be >= 0"),
    ("0.2,1.0", {"at_least": 0, "below": 1}, "HIGH must be below 1"),
])
def test_a_range_that_cannot_be_searched_is_refused_naming_its_flag(text, kwargs, words):
    with pytest.raises(Refused) as caught:
        parse_range("--dropout-range", text, **kwargs)
    assert str(caught.value).startswith(f"--dropout-range {text}:") and words in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("value, digits, expected", [(0.0021347, 3, 0.00213), (123456.0, 3, 123000.0),
                                                     (0.0, 3, 0.0), (0.5, 3, 0.5), (1.23456e-5, 2, 1.2e-5)])
def test_significant_rounds_to_significant_digits(value, digits, expected):
    assert significant(value, digits) == expected


SPACE = SearchSpace(base_lr=Range(1e-4, 1e-2, log=True), dropout=Range(0.0, 0.7),
                    weight_decay=Range(1e-5, 0.1, log=True), patience_steps=Range(25, 400, integer=True))


def test_settings_drawn_are_rounded_and_within_their_ranges():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(20):
        s = SPACE.suggest(study.ask())
        assert 1e-4 <= s.base_lr <= 1e-2 and 0 <= s.dropout <= 0.7 and 1e-5 <= s.weight_decay <= 0.1
        assert isinstance(s.patience_steps, int) and 25 <= s.patience_steps <= 400
        assert all(v == significant(v) for v in (s.base_lr, s.dropout, s.weight_decay))


def test_a_fixed_trial_gives_its_values_rounded():
    fixed = optuna.trial.FixedTrial({"base_lr": 0.0021347, "dropout": 0.31234, "weight_decay": 0.000123456,
                                     "patience_steps": 180})
    assert SPACE.suggest(fixed) == HeadSettings(0.00213, 0.312, 0.000123, 180)


def test_the_flags_printed_are_the_values_trained_with():
    s = HeadSettings(base_lr=0.00213, dropout=0.312, weight_decay=1.23e-05, patience_steps=180)
    flags = s.train_flags()
    assert flags == "--base-lr 0.00213 --dropout 0.312 --weight-decay 1.23e-05 --patience-steps 180"
    values = dict(zip(flags.split()[::2], flags.split()[1::2]))
    assert float(values["--base-lr"]) == s.base_lr and float(values["--dropout"]) == s.dropout
    assert float(values["--weight-decay"]) == s.weight_decay and int(values["--patience-steps"]) == s.patience_steps


def test_jobs_train_takes_the_learning_rate_dropout_and_weight_decay_flags():
    """The flags of ``jobs/train.py`` the search prints, parsed by its own parser to the same values."""
    s = HeadSettings(base_lr=0.00213, dropout=0.312, weight_decay=1.23e-05, patience_steps=180)
    flags = s.train_flags().split()
    known = [part for i in range(0, len(flags), 2) if flags[i] != "--patience-steps" for part in flags[i:i + 2]]
    config, _ = parse_configs((TrainConfig, LaunchConfig), ["--data", "/tmp/d", "--output", "/tmp/o", *known])
    assert (config.fit.base_lr, config.model.dropout, config.fit.weight_decay) == (s.base_lr, s.dropout, s.weight_decay)


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf])
def test_jobs_train_refuses_a_weight_decay_that_is_negative_or_not_finite(value):
    with pytest.raises(Refused, match="--weight-decay must be a finite number >= 0"):
        TrainConfig(data="/tmp/d", output="/tmp/o", weight_decay=value)
