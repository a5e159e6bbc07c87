"""A process's set-up, the same in every stage's driver, rank and task: environment, configs, errors,
redaction, logs and progress, quiet output, Spark session. Importing this package imports none of them."""
