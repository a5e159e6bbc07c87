"""Stage 3: batch inference with a trained model (``jobs/predict.py``, ``python -m pipelines.predict``)."""
