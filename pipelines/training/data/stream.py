"""The positioned train stream of a rank's shard: which row comes where, by arithmetic alone, so a resume
opens it at any row. Window ``k`` of pass ``p`` is shuffled by ``default_rng((seed, p, k))``."""
from __future__ import annotations

from typing import Callable, Dict, Iterator, NamedTuple, Sequence, Tuple

import numpy as np

from pipelines.runtime.logs import plural


def epoch_order(count: int, seed: int, epoch: int) -> np.ndarray:
    """Pass ``epoch``'s visit order of ``count`` items: a permutation (int64) from ``(seed, epoch)`` alone."""
    return np.random.default_rng((seed, epoch)).permutation(count)


def window_visits(shuffle_buffer: int, rows_per_row_group: int) -> int:
    """``W`` (>= 1), the row groups a window holds, so that about ``shuffle_buffer`` images shuffle together."""
    return max(1, -(-max(0, shuffle_buffer) // max(1, rows_per_row_group)))


class Position(NamedTuple):
    """Where a stream row lies: pass, window, ``offset`` in the permuted window, ``visit`` (where reading starts)."""

    pass_index: int
    window: int
    offset: int
    visit: int


class ShardStream:
    """The stream arithmetic of one rank's shard; ``rows``: each row group's rows in shard order.

    Raises:
        ValueError: no rows at all, a negative count, ``window < 1``."""

    def __init__(self, rows: Sequence[int], seed: int, window: int):
        self.rows = np.asarray(rows, np.int64).reshape(-1)
        if window < 1 or np.any(self.rows < 0):
            raise ValueError(f"a stream needs a window >= 1 and row counts >= 0, got {window} and {rows!r}")
        self.shard_rows = int(self.rows.sum())
        if self.shard_rows == 0:
            raise ValueError(f"a shard of {plural(len(self.rows), 'row group')} and no rows has no stream")
        self.seed, self.window, self.groups = seed, window, len(self.rows)
        self.windows_per_pass = -(-self.groups // window)
        self._plans: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}

    def _plan(self, pass_index: int) -> Tuple[np.ndarray, np.ndarray]:
        """Pass ``pass_index``'s visit order and its windows' cumulative row ends (int64)."""
        plan = self._plans.get(pass_index)
        if plan is None:
            order = epoch_order(self.groups, self.seed, pass_index)
            starts = np.arange(0, self.groups, self.window)
            plan = order, np.cumsum(np.add.reduceat(self.rows[order], starts))
            if len(self._plans) > 4:  # a stream walks forward: a few passes are all it revisits
                self._plans.clear()
            self._plans[pass_index] = plan
        return plan

    def window_groups(self, pass_index: int, window: int) -> np.ndarray:
        """The row groups (shard indices, visit order) of window ``window`` of pass ``pass_index``."""
        order, _ = self._plan(pass_index)
        return order[window * self.window:(window + 1) * self.window]

    def window_rows(self, pass_index: int, window: int) -> int:
        """Rows in window ``window`` of pass ``pass_index``."""
        _, ends = self._plan(pass_index)
        return int(ends[window] - (ends[window - 1] if window else 0))

    def locate(self, row: int) -> Position:
        """The ``Position`` of stream row ``row`` (global steps x per-rank batch); ValueError if negative."""
        if row < 0:
            raise ValueError(f"a stream row is >= 0, got {row}")
        pass_index, within = divmod(int(row), self.shard_rows)
        _, ends = self._plan(pass_index)
        window = int(np.searchsorted(ends, within, side="right"))  # skips windows of no rows
        offset = within - (int(ends[window - 1]) if window else 0)
        return Position(pass_index, window, offset, pass_index * self.groups + window * self.window)

    def next_window(self, pass_index: int, window: int) -> Tuple[int, int]:
        """The window after ``(pass_index, window)``: the next of the pass, or the next pass's first."""
        return (pass_index, window + 1) if window + 1 < self.windows_per_pass else (pass_index + 1, 0)

    def draws(self, pass_index: int, window: int, rows: int) -> np.ndarray:
        """A window's row order (int64): a permutation of ``rows`` from ``(seed, pass_index, window)`` alone."""
        return np.random.default_rng((self.seed, pass_index, window)).permutation(rows)

    def visits_from(self, visit: int) -> Iterator[int]:
        """The row groups (shard indices) visited from global visit ``visit`` on, forever."""
        pass_index, at = divmod(visit, self.groups)
        while True:
            yield from self._plan(pass_index)[0][at:].tolist()
            pass_index, at = pass_index + 1, 0


#: what opens the shard's row groups at a global visit: an iterator of ``(images uint8 (rows, s,
#: s, 3), labels int32 (rows,))``, one per row group of ``ShardStream.visits_from`` that visit,
#: ending only when its reader is closed or restarted elsewhere
OpenGroups = Callable[[int], Iterator[Tuple[np.ndarray, np.ndarray]]]


def stream_batches(stream: ShardStream, open_groups: OpenGroups, start_row: int,
                   batch_size: int) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """The stream's rows from ``start_row``, fresh full batches ``(uint8 (b, s, s, 3), int32 (b,))``, till groups stop.

    ``batch_size``: >= 1, as the config checks it.

    Raises:
        ValueError: a negative ``start_row``, or a row group unlike ``stream.rows``."""
    position = stream.locate(start_row)
    groups = open_groups(position.visit)
    pass_index, window, offset = position.pass_index, position.window, position.offset
    out = labels_out = None
    filled = 0
    while True:
        got = _window(stream, groups, pass_index, window)
        if got is None:
            return
        parts, starts, labels = got
        order = stream.draws(pass_index, window, len(labels))
        while offset < len(order):
            if out is None:
                out = aligned_empty((batch_size,) + parts[0].shape[1:], np.uint8)
                labels_out = aligned_empty((batch_size,), np.int32)
            take = order[offset:offset + batch_size - filled]
            labels_out[filled:filled + len(take)] = labels[take]
            _gather(out[filled:filled + len(take)], parts, starts, take)
            filled, offset = filled + len(take), offset + len(take)
            if filled == batch_size:
                yield out, labels_out
                out, filled = None, 0
        pass_index, window = stream.next_window(pass_index, window)
        offset = 0


#: bytes a batch's buffer is aligned to: TensorFlow's largest (Eigen's, AVX-512) alignment, at
#: which ``tf.data.Dataset.from_generator`` takes a NumPy array as its tensor without a copy
#: (np.empty's 16-byte alignment costs a copy of every batch: docs/benchmarks.md, Figures behind the code's constants)
ALIGNMENT = 64


def aligned_empty(shape: Tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised C-contiguous array of ``shape`` and ``dtype`` starting at a multiple of ``ALIGNMENT`` bytes."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    buffer = np.empty(size + ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % ALIGNMENT
    return buffer[start:start + size].view(dtype).reshape(shape)


def _window(stream: ShardStream, groups: Iterator, pass_index: int, window: int):
    """A window's images (list), each part's first row (int64) and its labels (int32); None when ``groups`` ended."""
    parts, labels = [], []
    for index in stream.window_groups(pass_index, window).tolist():
        group = next(groups, None)
        if group is None:
            return None
        if len(group[1]) != stream.rows[index] or len(group[0]) != len(group[1]):
            raise ValueError(f"row group {index} of the shard came with {plural(len(group[0]), 'image')} and "
                             f"{plural(len(group[1]), 'label')}, its footer says "
                             f"{plural(int(stream.rows[index]), 'row')}")
        parts.append(group[0])
        labels.append(group[1])
    starts = np.cumsum([0] + [len(x) for x in labels[:-1]])
    return parts, starts, np.concatenate(labels) if len(labels) > 1 else labels[0]


def _gather(out: np.ndarray, parts, starts: np.ndarray, take: np.ndarray) -> None:
    """Copy the window's rows ``take`` into ``out``, row by row, each image copied once."""
    where = np.searchsorted(starts, take, side="right") - 1
    rows = take - starts[where]
    for i, (part, row) in enumerate(zip(where.tolist(), rows.tolist())):
        out[i] = parts[part][row]


def keyed(batches: Iterator[Tuple[np.ndarray, np.ndarray]], seed: int,
          start_row: int = 0) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``batches`` ``(images, labels)`` with each row's key ``(seed, stream position)`` int64 (n, 2) added.

    A row's position counts the rows before it in ``batches``, from ``start_row``: the key ``--augment`` draws from."""
    position = int(start_row)
    for images, labels in batches:
        keys = np.empty((len(labels), 2), np.int64)
        keys[:, 0] = seed
        keys[:, 1] = np.arange(position, position + len(labels))
        position += len(labels)
        yield images, labels, keys


def feature_batches(features: np.ndarray, labels: np.ndarray, seed: int, start_row: int, batch_size: int,
                    shuffle: bool = True) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """The feature cache's stream from ``start_row`` in full batches, pass ``p`` in ``epoch_order(n, seed, p)``.

    ``start_row`` >= 0, as its datasets check it before a ``tf.data`` thread runs this; ``batch_size`` >= 1, as the
    config checks it.

    Raises:
        ValueError: no rows, not one label per row."""
    n = len(labels)
    if n == 0 or len(features) != n:
        raise ValueError(f"a feature stream needs rows, one label each ({plural(len(features), 'row')}, "
                         f"{plural(n, 'label')})")
    pass_index, offset = divmod(int(start_row), n)
    pending = []  # index pieces of the batch being built (a batch may cross a pass)
    held = 0
    while True:
        order = epoch_order(n, seed, pass_index) if shuffle else np.arange(n)
        while offset < n:
            piece = order[offset:offset + batch_size - held]
            pending.append(piece)
            held, offset = held + len(piece), offset + len(piece)
            if held == batch_size:
                index = pending[0] if len(pending) == 1 else np.concatenate(pending)
                yield features[index], labels[index]
                pending, held = [], 0
        pass_index, offset = pass_index + 1, 0
