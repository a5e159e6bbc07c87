"""Rank 0's records of a training run (issue 39)."""
