"""Search of the head's settings on cached features (``jobs/tune.py``): Optuna trials as Spark tasks.

Each trial is an MLflow child run; the choice is made on validation, and the test split is read once, for the
chosen settings, which print as ``jobs/train.py`` flags.
"""
