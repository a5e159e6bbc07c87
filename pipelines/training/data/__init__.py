"""Training's data layer: the ETL's output read by rank, as ``tf.data``; it meets the ETL and batch inference
through ``pipelines.contract`` alone. ``dataset``, ``sharding``, ``rowgroups`` and ``readers`` (``arrow_reader``,
``petastorm``, caching in ``rowcache``) read; ``stream``, ``onepass`` and ``features`` order; ``tfdata`` batches
and ``augment`` augments (the only parts needing TensorFlow)."""
from pipelines.training.data.dataset import Dataset, load_dataset
from pipelines.training.data.errors import DataError, ShardCountError
from pipelines.training.data.onepass import OnePassShard, verify_total
from pipelines.training.data.petastorm import petastorm_available
from pipelines.training.data.readers import READERS, check_reader, default_cache_root, open_reader, row_groups_of
from pipelines.training.data.tfdata import batched, make_dataset, to_device

__all__ = ["Dataset", "load_dataset", "DataError", "ShardCountError", "READERS", "check_reader",
           "petastorm_available", "open_reader", "row_groups_of", "default_cache_root", "OnePassShard",
           "verify_total", "batched", "to_device", "make_dataset"]
