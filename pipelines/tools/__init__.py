"""Set-up tools, never imported by a rank: sample data sets, offline weights, the notebooks' workspace."""
