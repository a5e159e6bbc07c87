"""Launching Horovod ranks: :class:`HorovodRunner` (local processes or Spark barrier tasks).

One module per job: ``config`` (:class:`LaunchConfig`: how many ranks, where, how many
relaunches; apart from each rank's own config), ``runner`` (:class:`HorovodRunner`), ``local``
(local ranks: child processes of the driver), ``barrier`` (Spark barrier tasks) and ``child`` (a rank's process inside
a task), ``sparkcheck`` (the cluster's checks before any task), ``network`` (Gloo's interface,
hosts and ports), ``rendezvous`` (Gloo's rendezvous, on one address), ``gpus`` (each rank's GPU, NCCL's interface), ``failures`` and ``recovery``
(what failed, what is relaunched), ``worlds`` (the world's bounds: ``--min-np``, ``--max-np``),
``elastic`` and ``discovery`` (horovodrun's elastic mode: the ranks left continue), ``ranklogs`` (the ranks' output at the driver), ``cluster`` (a
Spark standalone cluster on this machine). Importing it loads neither TensorFlow, Horovod nor
PySpark: those are imported inside the functions that start ranks.
"""
from pipelines.launch.config import LaunchConfig
from pipelines.launch.failures import ClusterConfigError, HorovodJobFailed, RankFailure, RelaunchImpossible
from pipelines.launch.runner import HorovodRunner

__all__ = ["ClusterConfigError", "HorovodJobFailed", "HorovodRunner", "LaunchConfig", "RankFailure", "RelaunchImpossible"]
