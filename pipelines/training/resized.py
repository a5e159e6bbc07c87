"""A rank of a run on another world size than its data world (arithmetic: ``dataworld``).

Virtual ranks' streams are read as data-world ranks read them, joined in global-batch order (not under Petastorm)."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from pipelines.contract import TRAIN
from pipelines.runtime.logs import plural
from pipelines.training.data.features import read_shard
from pipelines.training.data.readers import open_reader, row_groups_of
from pipelines.training.data.stream import aligned_empty, feature_batches, keyed, stream_batches
from pipelines.training.data.tfdata import make_dataset, shard_stream, tail, weighted, without_autotune
from pipelines.training.dataworld import DataWorld, RankShare
from pipelines.training.records import progress
from pipelines.training.records import segments as worldsegments

if TYPE_CHECKING:
    from pipelines.io.storage import Location
    from pipelines.training.config import TrainConfig
    from pipelines.training.data import Dataset
    from pipelines.training.inputpath import InputPath
    from pipelines.training.rank import Rank
    from pipelines.training.totals import Totals

log = logging.getLogger("pipelines")


def agree_data_world(config, rank, claim) -> DataWorld:
    """Every rank: the run's data world (recorded, or this launch's if new), broadcast from rank 0's ``claim``.

    Raises:
        pipelines.runtime.errors.Refused: on every rank, more ranks than the global batch has rows."""
    import horovod.tensorflow as hvd_tf

    recorded = hvd_tf.broadcast_object(claim.run.world if claim is not None else None, root_rank=0, name="data_world")
    world = DataWorld.of_record(recorded, config.fit.batch_size, rank.size)
    world.check(rank.size)
    return world


def with_segments(config, rank, plan, resume):
    """``plan`` with the run's segments: those ``resume``'s checkpoint records, then this launch's."""
    import horovod.tensorflow as hvd_tf

    reason = worldsegments.reason_of(config.outputs.resume, rank.handed.relaunched)
    redone = None
    if rank.rank == 0 and resume.marker:
        redone = progress.steps_redone(progress.read_mark(plan.output_dir), resume.marker,
                                       plan.steps.steps_per_epoch, plan.claim.run.run_id)
    redone = hvd_tf.broadcast_object(redone, root_rank=0, name="steps_redone")  # Horovod: rank 0's figure
    segments = worldsegments.run_segments(resume.marker, plan.world, rank.size, reason, redone)
    if rank.rank == 0 and len(segments) > 1:
        log.info("segment %d of training run %s: %s", len(segments), plan.claim.run.run_id,
                 worldsegments.describe(segments[-1]))
    return dataclasses.replace(plan, segments=tuple(segments))


def joined_batches(streams: Sequence[Iterator[Tuple[np.ndarray, ...]]],
                   share: RankShare) -> Iterator[Tuple[np.ndarray, ...]]:
    """This rank's batch of every step, ``(rows (share.rows, ...), labels, ...)``: ``streams``' pieces joined in
    order, each array of a stream's batches (rows, labels, keys) joined alike.

    Raises:
        ValueError: not one stream per piece."""
    if len(streams) != len(share.pieces):
        raise ValueError(f"{len(streams)} streams for the {len(share.pieces)} pieces of rank {share.rank}'s batch")
    while True:
        got = [next(stream, None) for stream in streams]
        if any(batch is None for batch in got):
            return
        if len(got) == 1 and share.pieces[0].start == 0 and len(got[0][1]) == share.rows:
            yield got[0]
            continue
        joined = tuple((aligned_empty if i == 0 else np.empty)((share.rows,) + array.shape[1:], array.dtype)
                       for i, array in enumerate(got[0]))
        at = 0
        for batch, piece in zip(got, share.pieces):
            size = piece.stop - piece.start
            for out, array in zip(joined, batch):
                out[at:at + size] = array[piece.start:piece.stop]
            at += size
        yield joined


class ResizedInputs:
    """The input path ``inputs`` on physical rank ``rank`` in a run of data world ``world`` (its train stream)."""

    def __init__(self, inputs: InputPath, world: DataWorld, rank: Rank):
        self.inputs, self.world = inputs, world
        self.share = world.share(rank.rank, rank.size)
        self._open: List = []  # inside fit_datasets: one reader (or feature rows) per piece

    @property
    def name(self) -> str:
        """The wrapped path's name."""
        return self.inputs.name

    @property
    def config(self) -> TrainConfig:
        """The run's configuration."""
        return self.inputs.config

    @property
    def data(self) -> Dataset:
        """The ETL output the wrapped path reads."""
        return self.inputs.data

    @property
    def model(self) -> Any:
        """The wrapped path's Keras model."""
        return self.inputs.model

    def evaluate_shard(self, model: Any, split: str, after_batch: Optional[Callable[[int], None]] = None) -> Totals:
        """The wrapped path's exact evaluation of this rank's shard: a one-pass read, on any world size."""
        return self.inputs.evaluate_shard(model, split, after_batch)

    def exported_model(self) -> Any:
        """The wrapped path's whole model."""
        return self.inputs.exported_model()

    @property
    def features(self) -> Optional[Location]:
        """The wrapped path's cached features; ``None`` on images."""
        return self.inputs.features

    @property
    def directory(self) -> Optional[str]:
        """The wrapped path's cached features' folder as the report names it; ``None`` on images."""
        return self.inputs.directory

    @property
    def features_path(self) -> bool:
        return self.features is not None

    @property
    def exact_positions(self) -> bool:
        """Whether the virtual streams are read (not Petastorm's physical shard)."""
        return self.inputs.exact_positions

    @contextlib.contextmanager
    def fit_datasets(self, cache_root: str, start_row: int = 0) -> Iterator[Tuple[object, None]]:
        """``(train, None)`` from the virtual ranks' stream row ``start_row`` (global steps x ``b``).

        Raises:
            ValueError: a negative ``start_row``."""
        with contextlib.ExitStack() as stack:
            self._open = self._open_sources(stack, cache_root)
            try:
                yield self._train_at(start_row), None
            finally:
                self._open = []

    def _open_sources(self, stack: contextlib.ExitStack, cache_root: str) -> List:
        if self.features_path:
            return [read_shard(self.features, TRAIN, v, self.world.size) for v in self.share.virtual_ranks]
        c, data = self.config, self.data
        if not self.exact_positions:  # Petastorm: this rank's physical shard
            return [stack.enter_context(open_reader(data, TRAIN, self.share.rank, self.share.world_size, cache_root,
                                                    workers=c.loader.reader_workers, seed=c.fit.seed + self.share.rank,
                                                    reader=c.loader.reader))]
        return [stack.enter_context(open_reader(data, TRAIN, v, self.world.size, cache_root,
                                                workers=c.loader.reader_workers, seed=c.fit.seed + v,
                                                reader=c.loader.reader,
                                                cache_name=f"rank{self.share.rank}-virtual{v}-{TRAIN}"))
                for v in self.share.virtual_ranks]

    def _train_at(self, start_row: int):
        """The training dataset over ``fit_datasets``' open sources from virtual stream row ``start_row``."""
        if start_row < 0:
            raise ValueError(f"a stream row is >= 0, got {start_row}")
        if self.features_path:
            return self._feature_dataset(start_row)
        if not self.exact_positions:
            c = self.config
            return make_dataset(self._open[0], self.data.stored_size, self.share.rows, c.loader.shuffle_buffer,
                                seed=c.fit.seed + self.share.rank, augment=c.loader.augmentations, weight=self.share.weight)
        return self._image_dataset(start_row)

    def _image_dataset(self, start_row: int):
        import tensorflow as tf


        c, s, b = self.config, self.data.stored_size, self.world.batch_size
        streams = [shard_stream(reader, c.loader.shuffle_buffer, c.fit.seed + v) for reader, v in
                   zip(self._open, self.share.virtual_ranks)]
        for stream in streams:
            stream.locate(start_row)  # refused here, not in a tf.data thread

        def opener(reader, stream):
            return lambda visit: row_groups_of(reader.restart(stream.visits_from(visit)), s)

        def generate():
            return joined_batches([keyed(stream_batches(stream, opener(reader, stream), start_row, b), stream.seed,
                                         start_row) for reader, stream in zip(self._open, streams)], self.share)

        ds = tf.data.Dataset.from_generator(generate, output_signature=(
            tf.TensorSpec((self.share.rows, s, s, 3), tf.uint8), tf.TensorSpec((self.share.rows,), tf.int32),
            tf.TensorSpec((self.share.rows, 2), tf.int64)))
        return tail(ds, c.loader.augmentations, weight=self.share.weight)

    def _feature_dataset(self, start_row: int):
        import tensorflow as tf


        c, b = self.config, self.world.batch_size
        features = self._open[0][0]

        def generate():
            return joined_batches([feature_batches(rows, labels, c.fit.seed + v, start_row, b, shuffle=True)
                                   for (rows, labels), v in zip(self._open, self.share.virtual_ranks)], self.share)

        ds = tf.data.Dataset.from_generator(generate, output_signature=(
            tf.TensorSpec((self.share.rows,) + features.shape[1:], tf.as_dtype(features.dtype)),
            tf.TensorSpec((self.share.rows,), tf.int32)))
        return without_autotune(weighted(ds, self.share.weight).prefetch(2))


def resized_inputs(inputs: InputPath, world: DataWorld, rank: Rank, announce: bool = False) -> InputPath:
    """``inputs`` for physical rank ``rank`` (of ``rank.size``), resized off the data world's size.

    Raises:
        pipelines.runtime.errors.Refused: more ranks than the global batch has rows."""
    world_size = rank.size
    if world.same(world_size):
        return inputs
    resized = ResizedInputs(inputs, world, rank)
    if announce:
        log.info("%s; each step trains the rows an uninterrupted run's step does", world.describe(world_size))
        if not resized.exact_positions:
            log.warning("--reader petastorm cannot read the data world's streams at another world size: each rank "
                        "reads its own shard of %s in these batches, with the same global batch and learning "
                        "rate, but other rows in each step than an uninterrupted run (--reader own is exact)",
                        plural(world_size, "rank"))
    return resized
