"""Search of the head's settings on cached features (``jobs/tune.py``): Optuna trials as Spark
tasks, each an MLflow child run of the search's run; chosen on validation, the test split read
once for the chosen settings, which print as ``jobs/train.py`` flags.

=====================================  ==========================================================
:mod:`~pipelines.tune.config`          :class:`~pipelines.tune.config.TuneConfig`, the flags
:mod:`~pipelines.tune.space`           the ranges and the settings a trial draws (pure)
:mod:`~pipelines.tune.trial`           one trial: the head trained and validated in one process
:mod:`~pipelines.tune.cache`           the feature set found (or refused) before Spark starts
:mod:`~pipelines.tune.runners`         trials to Spark: MLflow's ``MlflowSparkStudy``, or ask-tell rounds
:mod:`~pipelines.tune.search`          the job: trials, choice, refit and test, records
=====================================  ==========================================================
"""
