"""Launching Horovod ranks: ``HorovodRunner`` (local processes or Spark barrier tasks), ``LaunchConfig``.

Importing it loads neither TensorFlow, Horovod nor PySpark: the functions that start ranks import them."""
from pipelines.launch.config import LaunchConfig
from pipelines.launch.failures import ClusterConfigError, HorovodJobFailed, RankFailure, RelaunchImpossible
from pipelines.launch.runner import HorovodRunner

__all__ = ["ClusterConfigError", "HorovodJobFailed", "HorovodRunner", "LaunchConfig", "RankFailure", "RelaunchImpossible"]
