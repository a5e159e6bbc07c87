"""Where the stages' files live, the same on a local disk and an object store.

- :mod:`~pipelines.io.storage`: every path or URI resolved once into a filesystem and a path
  (``Location``), an output's root refused;
- :mod:`~pipelines.io.options`: the storage options a backend needs (command line, an owner-only
  file, the environment), and the ``storage_options`` field every stage's config has;
- :mod:`~pipelines.io.atomic`: a local file written whole or not at all;
- :mod:`~pipelines.io.nofollow`: local files opened, written and deleted without following a
  link, each check made on the opened descriptor;
- :mod:`~pipelines.io.pinned`: a data file (a manifest's part) checked once and read only as
  that file;
- :mod:`~pipelines.io.paths`: local paths as ``file://`` URLs, folders that must not overlap;
- :mod:`~pipelines.io.leases`: readers' leases on an ETL run, which its commit keeps.

Importing this package imports none of them.
"""
