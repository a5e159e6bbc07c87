"""Stage 3: batch inference with a trained model (``jobs/predict.py``, ``python -m pipelines.predict``).

``model.py`` resolves the model and its contract, ``inputs.py`` plans the input (an image tree or
an ETL split), ``infer.py`` is what the executors run (decode with the ETL's functions, predict,
top k), ``metrics.py`` the pure metrics, ``job.py`` the driver, ``config.py`` and ``cli.py`` the
job's options, ``local.py`` a few files in one process without Spark.
"""
