"""The training stage's data layer (issue 39)."""
