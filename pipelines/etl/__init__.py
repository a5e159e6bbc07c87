"""Stage 1: a Caltech-256-style tree of images to Parquet train/validation/test splits (Spark)."""
