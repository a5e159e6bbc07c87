"""Distributed deep-learning pipeline: Spark ETL, Petastorm + Horovod training."""

__version__ = "0.1.0"
