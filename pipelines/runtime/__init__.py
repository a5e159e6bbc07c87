"""A process's set-up, the same in every stage's driver, rank and task.

- :mod:`~pipelines.runtime.environment`: the user's ``PIPELINES_*`` variables, read once;
- :mod:`~pipelines.runtime.config`: typed configs from the command line, a stage's ``main``;
- :mod:`~pipelines.runtime.errors`: the refusal (exit 2) and the failure (exit 1);
- :mod:`~pipelines.runtime.redact`: secrets masked wherever something is written or printed;
- :mod:`~pipelines.runtime.logs`, :mod:`~pipelines.runtime.progress`: logging, ``plural``, the
  progress line;
- :mod:`~pipelines.runtime.quiet`, :mod:`~pipelines.runtime.tflog`: third-party noise kept down
  unless ``--verbose`` (TensorFlow's load-time lines too);
- :mod:`~pipelines.runtime.spark`, :mod:`~pipelines.runtime.zipcache`: the Spark session and a
  job's progress, PySpark's task start without re-reading ``pyspark.zip``.

Importing this package imports none of them (``import pipelines`` imports ``tflog`` alone).
"""
