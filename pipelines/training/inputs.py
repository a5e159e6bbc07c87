"""The training job's input paths, siblings behind one small interface.

* :class:`ImageInputs` - the article's path: the whole model (frozen backbone + head) on images,
  read by looping readers (Petastorm's or ours, ``--reader``) for ``fit`` and by
  :class:`~pipelines.training.data.OnePassShard` for the exact evaluation (each epoch's and the end's).
* :class:`FeatureInputs` - the feature cache: the backbone's pooled features computed once per
  rank shard (:mod:`pipelines.training.features`), and only the head trained on them.

Each path answers the same questions: which model trains (:attr:`model`), which ``tf.data``
dataset feeds ``fit`` (:meth:`fit_datasets`, a context manager that owns the readers; it yields
``(train, None)``: every epoch's validation is the exact evaluation of the validation split, run by
:func:`pipelines.training.evaluate.exact_validation`), what the exact totals of this rank's shard
of an evaluated split are (:meth:`evaluate_shard`: validation each epoch, test once at the end),
and which model is exported
(:meth:`exported_model`, always the whole model). A third path is one more class with these
four members, chosen in :func:`make_inputs`. (Fine-tuning is not a path but a second phase,
:mod:`pipelines.training.finetune`, on :class:`ImageInputs` over the whole model.)
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator, Tuple

from pipelines.contract import EVALUATED, SPLITS
from pipelines.logs import plural
from pipelines.training.config import TrainConfig
from pipelines.training.data import Dataset, OnePassShard, make_dataset, open_reader, verify_total
from pipelines.training.model import backbone_of, feature_extractor, model_input

log = logging.getLogger("pipelines")


class ImageInputs:
    """The whole model trained on images (the article's path)."""

    name = "images"

    def __init__(self, config: TrainConfig, data: Dataset, rank: int, size: int, full_model, image_size: int):
        self.config, self.data, self.rank, self.size = config, data, rank, size
        self.model = self.full_model = full_model
        self.image_size = image_size

    @contextlib.contextmanager
    def reader_dataset(self, split: str, cache_root: str) -> Iterator[object]:
        """A looping dataset of ``split`` over a reader (``--reader``) that lives until the block ends;
        the training split is shuffled (and augmented with ``--augment``)."""
        c, data, training = self.config, self.data, split == "train"
        with open_reader(data, split, self.rank, self.size, cache_root, workers=c.reader_workers,
                         seed=c.seed + self.rank, reader=c.reader) as reader:
            yield make_dataset(reader, data.image_size, c.batch_size, c.shuffle_buffer if training else 0,
                               seed=c.seed + self.rank, augment=c.augment and training)

    @contextlib.contextmanager
    def fit_datasets(self, cache_root: str) -> Iterator[Tuple[object, None]]:
        """``(train, None)``: the training dataset over a reader that lives until the block ends
        (each epoch's validation is the exact evaluation,
        :func:`pipelines.training.evaluate.exact_validation`)."""
        with self.reader_dataset("train", cache_root) as train:
            yield train, None

    def evaluate_shard(self, model, split: str):
        """Totals over this rank's shard of ``split`` (one of :data:`pipelines.contract.EVALUATED`),
        each row once, count checked against the footers."""
        from pipelines.training.evaluate import evaluate_dataset

        _check_evaluated(split)
        shard = OnePassShard(self.data, split, self.rank, self.size)
        totals = evaluate_dataset(model, shard.dataset(self.config.batch_size))
        shard.verify(totals.count)
        return totals

    def exported_model(self):
        """The trained whole model."""
        return self.full_model


class FeatureInputs:
    """Only the head trained, on the frozen backbone's features computed once (the feature cache)."""

    name = "features"

    def __init__(self, config: TrainConfig, data: Dataset, rank: int, size: int, full_model, image_size: int):
        from pipelines.training import features as feat

        self.config, self.data, self.rank, self.size = config, data, rank, size
        self.full_model, self.image_size = full_model, image_size
        self.features = self._ensure_features()
        self.directory = self.features.uri  # as the report names it
        self.model = feat.build_head(data.num_classes, config.dropout, config.seed,
                                     backbone_of(full_model).output_shape[-1])
        # Start from the whole model's initial head, so both paths train the same function from the same point.
        self.model.get_layer("head").set_weights(full_model.get_layer("head").get_weights())

    def _ensure_features(self):
        """The feature set of this data (its ETL run and parts' footers: rank 0's
        :meth:`~pipelines.training.data.Dataset.identity`, the same on every rank), backbone and
        size: reused when complete and of the manifest's row counts, else computed, each rank its
        own shard of each split. Returns its folder (a :class:`pipelines.storage.Location`)."""
        import horovod.tensorflow as hvd_tf

        from pipelines.training import features as feat

        c, data, rank = self.config, self.data, self.rank
        model = feat.model_key(c.weights, self.image_size, c.seed, c.backbone,
                               backbone_of(self.full_model).compute_dtype,  # float16 under mixed precision
                               model_input(self.full_model))
        identity = hvd_tf.broadcast_object(data.identity() if rank == 0 else None, root_rank=0, name="data_identity")
        key = feat.feature_key(model, identity)
        directory = feat.feature_dir(c.data, key, c.storage_options)
        if feat.is_complete(directory, {split: data.rows(split) for split in SPLITS}, key):
            if rank == 0:
                log.info("feature cache: reusing %s", directory)
            return directory
        if rank == 0:
            feat.say_why(c.data, model, key, identity, directory, c.storage_options)
            directory.delete()  # a run interrupted before completion
        hvd_tf.broadcast_object(None, root_rank=0, name="features_cleared")
        extractor = feature_extractor(self.full_model)  # uint8 in, preprocessing and backbone inside
        start, counts = time.perf_counter(), {}
        for split in SPLITS:
            shard = OnePassShard(data, split, rank, self.size)
            features, labels = feat.compute_shard(extractor, shard.dataset(c.batch_size))
            shard.verify(len(labels))
            feat.write_shard(directory, split, rank, features, labels)
            counts[split] = sum(hvd_tf.allgather_object(len(labels), name=f"feature_rows_{split}"))
            verify_total(counts[split], data, split)
            if rank == 0:  # progress: the backbone over a whole split takes minutes on CPU
                log.info("feature cache: %s split done, %s over all ranks, %.1f s so far", split,
                         plural(counts[split], "row"), time.perf_counter() - start)
        if rank == 0:
            feat.mark_complete(directory, counts, key, model, identity)
            log.info("feature cache: %s rows in %.1f s", counts, time.perf_counter() - start)
            feat.prune(c.data, feat.stale_sets(c.data, model, key, c.storage_options), c.storage_options)
        hvd_tf.broadcast_object(None, root_rank=0, name="features_complete")
        return directory

    def _dataset(self, split: str, training: bool):
        from pipelines.training import features as feat

        return feat.feature_dataset(*feat.read_shard(self.features, split, self.rank, self.size),
                                    self.config.batch_size, shuffle=training, seed=self.config.seed + self.rank,
                                    repeat=True)

    @contextlib.contextmanager
    def fit_datasets(self, cache_root: str) -> Iterator[Tuple[object, None]]:
        """``(train, None)`` over this rank's cached features (in memory: 2048 floats a row); each
        epoch's validation is the exact evaluation (:meth:`evaluate_shard`)."""
        yield self._dataset("train", training=True), None

    def evaluate_shard(self, model, split: str):
        """Totals of the head over this rank's share of the cached features of ``split`` (one of
        :data:`pipelines.contract.EVALUATED`), every row once."""
        from pipelines.training import features as feat
        from pipelines.training.evaluate import evaluate_dataset

        _check_evaluated(split)
        features, labels = feat.read_shard(self.features, split, self.rank, self.size)
        dataset = feat.feature_dataset(features, labels, self.config.batch_size, shuffle=False, seed=0,
                                       repeat=False, drop_remainder=False)
        totals = evaluate_dataset(model, dataset)
        if totals.count != len(labels):
            raise RuntimeError(f"rank {self.rank} evaluated {totals.count} of its "
                               f"{plural(len(labels), f'cached {split} row')}")
        return totals

    def exported_model(self):
        """The whole model: backbone + the head just trained."""
        self.full_model.get_layer("head").set_weights(self.model.get_layer("head").get_weights())
        return self.full_model


def _check_evaluated(split: str) -> None:
    """Refuse to evaluate the train split (it is read by looping readers, never whole)."""
    if split not in EVALUATED:
        raise ValueError(f"only {' and '.join(EVALUATED)} are evaluated, not {split!r}")


def make_inputs(config: TrainConfig, data: Dataset, rank: int, size: int, full_model, image_size: int):
    """The input path of this run: features when ``--feature-cache`` applies, else images."""
    from pipelines.training import features as feat

    not_applicable = feat.inapplicable_reason(config) if config.feature_cache else None
    if not_applicable and rank == 0:
        log.info("feature cache off: %s; training the whole model on images", not_applicable)
    cls = FeatureInputs if config.feature_cache and not_applicable is None else ImageInputs
    return cls(config, data, rank, size, full_model, image_size)

