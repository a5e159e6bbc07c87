"""What the training spine asks of an input path: ``inputs.py``'s images or cached features, ``resized.py``'s wrap."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional, Protocol, Tuple

if TYPE_CHECKING:
    from pipelines.io.storage import Location
    from pipelines.training.config import TrainConfig
    from pipelines.training.data import Dataset
    from pipelines.training.totals import Totals


class InputPath(Protocol):
    """One rank's input path (``make_inputs``', ``resized_inputs``'): its model, train stream, evaluation, export."""

    @property
    def name(self) -> str:
        """The path's name in the report and the run's records: ``images`` or ``features``."""

    @property
    def config(self) -> TrainConfig:
        """The run's configuration."""

    @property
    def data(self) -> Dataset:
        """The ETL output the path reads."""

    @property
    def model(self) -> Any:
        """The Keras model that trains, compiled by the spine with the distributed optimizer."""

    @property
    def exact_positions(self) -> bool:
        """Whether the train stream opens exactly at a stream row (a resume reads on exactly)."""

    @property
    def features(self) -> Optional[Location]:
        """The cached features' folder this path trains on (the linear probe fits them); ``None`` on images."""

    @property
    def directory(self) -> Optional[str]:
        """The cached features' folder as the report names it; ``None`` on images."""

    def fit_datasets(self, cache_root: str, start_row: int = 0) -> ContextManager[Tuple[Any, None]]:
        """``(train, None)``: the endless train stream from stream row ``start_row`` (>= 0), its readers the block's."""

    def evaluate_shard(self, model: Any, split: str, after_batch: Optional[Callable[[int], None]] = None) -> Totals:
        """Exact totals of ``model`` over this rank's shard of an evaluated ``split``, each row once."""

    def exported_model(self) -> Any:
        """The whole Keras model to save as ``model.keras``."""
