"""The training job's input paths (images, or cached backbone features), each an ``InputPath`` (``inputpath.py``)."""
from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Tuple

from pipelines.contract import EVALUATED, SPLITS
from pipelines.runtime.logs import plural
from pipelines.training.config import TrainConfig
from pipelines.training.data import Dataset, OnePassShard, check_reader, make_dataset, open_reader, verify_total
from pipelines.training.data import features as feat
from pipelines.training.evaluate import Totals, evaluate_dataset
from pipelines.training.model.build import backbone_of, build_head, feature_extractor, model_input

if TYPE_CHECKING:
    import numpy as np

    from pipelines.io.storage import Location
    from pipelines.training.inputpath import InputPath
    from pipelines.training.rank import Rank

log = logging.getLogger("pipelines")


class ImageInputs:
    """The whole model trained on images (the article's path)."""

    name = "images"
    features: Optional[Location] = None  # no cached features
    directory: Optional[str] = None

    def __init__(self, config: TrainConfig, data: Dataset, rank: Rank, full_model, input_size: int):
        self.config, self.data, self.rank = config, data, rank
        self.model = self.full_model = full_model
        self.input_size = input_size

    _train_reader = None  # the training reader, inside fit_datasets only

    @property
    def exact_positions(self) -> bool:
        """Whether the train stream opens exactly at a row: with our reader, not Petastorm's.

        Raises:
            pipelines.runtime.errors.Refused: ``--reader`` is unknown or cannot run here."""
        return check_reader(self.config.loader.reader) == "own"

    def _open(self, split: str, cache_root: str):
        c = self.config
        return open_reader(self.data, split, self.rank.rank, self.rank.size, cache_root,
                           workers=c.loader.reader_workers, seed=c.fit.seed + self.rank.rank, reader=c.loader.reader)

    def _dataset_over(self, reader, split: str, start_row: int):
        """The dataset of ``split`` over ``reader`` from stream row ``start_row`` (ignored by Petastorm's)."""
        c, training = self.config, split == "train"
        return make_dataset(reader, self.data.stored_size, c.fit.batch_size, c.loader.shuffle_buffer if training else 0,
                            seed=c.fit.seed + self.rank.rank, augment=c.loader.augmentations if training else (),
                            start_row=start_row)

    @contextlib.contextmanager
    def reader_dataset(self, split: str, cache_root: str, start_row: int = 0) -> Iterator[object]:
        """A looping dataset of ``split`` over a reader living until the block ends."""
        with self._open(split, cache_root) as reader:
            yield self._dataset_over(reader, split, start_row)

    @contextlib.contextmanager
    def fit_datasets(self, cache_root: str, start_row: int = 0) -> Iterator[Tuple[object, None]]:
        """``(train, None)``: the training dataset from stream row ``start_row`` over a reader living in the block.

        Raises:
            ValueError: a negative ``start_row``."""
        with self._open("train", cache_root) as reader:
            self._train_reader = reader
            try:
                yield self._dataset_over(reader, "train", start_row), None
            finally:
                self._train_reader = None

    def evaluate_shard(self, model, split: str, after_batch: Optional[Callable[[int], None]] = None) -> Totals:
        """Totals over this rank's shard of an evaluated ``split``, each row once, count checked against footers."""
        _check_evaluated(split)
        shard = OnePassShard(self.data, split, self.rank.rank, self.rank.size)
        totals = evaluate_dataset(model, shard.dataset(self.config.fit.batch_size), after_batch)
        shard.verify(totals.count)
        return totals

    def exported_model(self):
        """The trained whole model."""
        return self.full_model


class FeatureInputs:
    """Only the head trained, on the frozen backbone's features computed once (the feature cache)."""

    name = "features"

    def __init__(self, config: TrainConfig, data: Dataset, rank: Rank, full_model, input_size: int):
        self.config, self.data, self.rank = config, data, rank
        self.full_model, self.input_size = full_model, input_size
        self.features = self._ensure_features()
        self.directory = self.features.uri  # as the report names it
        self.model = build_head(data.num_classes, config.model.dropout, config.fit.seed,
                                     backbone_of(full_model).output_shape[-1])
        # Start from the whole model's initial head, so both paths train the same function from the same point.
        self.model.get_layer("head").set_weights(full_model.get_layer("head").get_weights())

    def _ensure_features(self) -> Location:
        """The feature set (folder) of this data, backbone and size: reused when complete, else computed."""
        import horovod.tensorflow as hvd_tf

        c, data, rank, size = self.config, self.data, self.rank.rank, self.rank.size
        model = feat.model_key(c.model.weights, self.input_size, c.fit.seed, c.model.backbone,
                               backbone_of(self.full_model).compute_dtype,  # float16 under mixed precision
                               model_input(self.full_model))
        identity = hvd_tf.broadcast_object(data.identity() if rank == 0 else None, root_rank=0, name="data_identity")
        key = feat.feature_key(model, identity)
        directory = feat.feature_dir(c.loader.data, key, c.storage_options)
        if feat.is_complete(directory, {split: data.rows(split) for split in SPLITS}, key):
            if rank == 0:
                log.info("feature cache: reusing %s", directory)
            return directory
        if rank == 0:
            feat.say_why(c.loader.data, model, key, identity, directory, c.storage_options)
            directory.delete()  # a run interrupted before completion
        hvd_tf.broadcast_object(None, root_rank=0, name="features_cleared")
        extractor = feature_extractor(self.full_model)  # uint8 in, preprocessing and backbone inside
        start, counts = time.perf_counter(), {}
        for split in SPLITS:
            shard = OnePassShard(data, split, rank, size)
            features, labels = feat.compute_shard(extractor, shard.dataset(c.fit.batch_size))
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
            feat.prune(c.loader.data, feat.stale_sets(c.loader.data, model, key, c.storage_options), c.storage_options)
        hvd_tf.broadcast_object(None, root_rank=0, name="features_complete")
        return directory

    #: the feature cache's stream is positioned (``feature_batches``)
    exact_positions = True
    _train_rows: Optional[Tuple[np.ndarray, np.ndarray]] = None  # the shard's train features, inside fit_datasets

    def _train_at(self, start_row: int):
        return feat.feature_dataset(*self._train_rows, self.config.fit.batch_size, shuffle=True,
                                    seed=self.config.fit.seed + self.rank.rank, repeat=True, start_row=start_row)

    @contextlib.contextmanager
    def fit_datasets(self, cache_root: str, start_row: int = 0) -> Iterator[Tuple[object, None]]:
        """``(train, None)`` over this rank's cached features (held in memory) from stream row ``start_row``.

        Raises:
            ValueError: a negative ``start_row``."""
        self._train_rows = feat.read_shard(self.features, "train", self.rank.rank, self.rank.size)
        try:
            yield self._train_at(start_row), None
        finally:
            self._train_rows = None

    def evaluate_shard(self, model, split: str, after_batch: Optional[Callable[[int], None]] = None) -> Totals:
        """Totals of the head over this rank's cached features of an evaluated ``split``, every row once."""
        _check_evaluated(split)
        features, labels = feat.read_shard(self.features, split, self.rank.rank, self.rank.size)
        dataset = feat.feature_dataset(features, labels, self.config.fit.batch_size, shuffle=False, seed=0,
                                       repeat=False, drop_remainder=False)
        totals = evaluate_dataset(model, dataset, after_batch)
        if totals.count != len(labels):
            raise RuntimeError(f"rank {self.rank.rank} evaluated {totals.count} of its "
                               f"{plural(len(labels), f'cached {split} row')}")
        return totals

    def exported_model(self):
        """The whole model: backbone + the head just trained."""
        self.full_model.get_layer("head").set_weights(self.model.get_layer("head").get_weights())
        return self.full_model


def _check_evaluated(split: str) -> None:
    """Refuse to evaluate the train split (looping readers never read it whole)."""
    if split not in EVALUATED:
        raise ValueError(f"only {' and '.join(EVALUATED)} are evaluated, not {split!r}")


def make_inputs(config: TrainConfig, data: Dataset, rank: Rank, full_model, input_size: int) -> InputPath:
    """The input path of this run: features when ``--feature-cache`` applies, else images."""
    not_applicable = feat.inapplicable_reason(config.loader) if config.loader.feature_cache else None
    if not_applicable and rank.rank == 0:
        log.info("feature cache off: %s; training the whole model on images", not_applicable)
    if config.loader.feature_cache and not_applicable is None:
        return FeatureInputs(config, data, rank, full_model, input_size)
    return ImageInputs(config, data, rank, full_model, input_size)

