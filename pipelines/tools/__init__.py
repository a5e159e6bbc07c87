"""Set-up tools, never imported by a rank: the sample data sets (``samples``), the offline
backbone weights (``weights``) and the notebooks' and benchmarks' working folder with a sample
through the ETL on demand (``workspace``). What a rank runs lives in ``pipelines.training``."""
