"""Training's data layer: the ETL's output read by rank, as ``tf.data``.

Only the training stage reads shards: the ETL writes its Parquet through Spark
(:mod:`pipelines.etl`) and batch inference reads whole files (:mod:`pipelines.predict`); both meet
this layer through :mod:`pipelines.contract` alone. Here, from the manifest to the device:

* :mod:`.dataset` - the ETL output as training sees it (:class:`Dataset`) and its refusals;
* :mod:`.sharding` - which row groups (or rows) a rank reads, stated once;
* :mod:`.rowgroups` - a split's row groups and one read with pyarrow;
* :mod:`.readers` - ``--reader``: the looping readers of a rank's shard behind one interface,
  ours (:mod:`.arrow_reader`) and Petastorm's (:mod:`.petastorm`, the mission stack's: all of it
  in that folder), both caching row groups on local disk (:mod:`.rowcache`);
* :mod:`.stream` - the positioned train stream (pure arithmetic: a resume opens it at any row);
* :mod:`.onepass` - every row of a rank's shard once, counted (exact evaluation);
* :mod:`.tfdata` - the ``tf.data`` tail: batches to the device (the only part that needs
  TensorFlow, imported there when called);
* :mod:`.features` - the feature cache: the frozen backbone's features, a data set of their own;
* :mod:`.errors` - what it raises.

Training and the benchmarks import the entry points below from here; the modules import each other.
"""
from pipelines.training.data.dataset import Dataset, load_dataset
from pipelines.training.data.errors import DataError, ShardCountError
from pipelines.training.data.onepass import OnePassShard, verify_total
from pipelines.training.data.petastorm import petastorm_available
from pipelines.training.data.readers import READERS, check_reader, default_cache_root, open_reader, row_groups_of
from pipelines.training.data.tfdata import batched, make_dataset, to_device

__all__ = ["Dataset", "load_dataset", "DataError", "ShardCountError", "READERS", "check_reader",
           "petastorm_available", "open_reader", "row_groups_of", "default_cache_root", "OnePassShard",
           "verify_total", "batched", "to_device", "make_dataset"]
