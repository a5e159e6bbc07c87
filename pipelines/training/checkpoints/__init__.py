"""A run's checkpoints: their names (``names``), files (``files``), rank 0's writer (``writer``) and the
choice of the one a run continues from (``choose``)."""
