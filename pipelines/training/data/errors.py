"""What the data layer raises when the data cannot feed a run, or a read does not add up."""
from __future__ import annotations

from pipelines.runtime.errors import Refused


class DataError(Refused):
    """The dataset cannot feed this training run; the message says why and what to change."""


class ImageSizeError(DataError):
    """A row group holds an image of another byte size than the manifest's ``row_bytes``."""


class ShardCountError(RuntimeError):
    """A read counted another number of rows than the Parquet metadata holds."""
