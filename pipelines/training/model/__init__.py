"""The model of the training stage (issue 39)."""
