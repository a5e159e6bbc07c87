"""Search of the head's settings on cached features (``jobs/tune.py``): Optuna trials as Spark tasks.

Chosen on validation; the test split is read once, for the chosen settings."""
