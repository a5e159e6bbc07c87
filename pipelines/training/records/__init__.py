"""Rank 0's records of a training run: whose output it is, where it is kept, what it reports.

* :mod:`.ownership` - which training run an output folder belongs to (``train_run.json``), so that
  no run adopts or deletes another's files (``--overwrite``, ``--resume``, a relaunch);
* :mod:`.mirror` - the local folder rank 0 writes in, mirrored to a URI ``--output``;
* :mod:`.shapes` - the shapes of a checkpoint marker, the run record and the progress mark, checked
  before any field is read;
* :mod:`.report` - the report (``metrics.json``), the exported model, the pictures and the MLflow
  run written at the end.
"""
