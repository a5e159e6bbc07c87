"""Rank 0's records of a training run: whose output it is, where it is kept, what it reports."""
