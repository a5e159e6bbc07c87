"""The feature set a search reads, found before Spark starts or refused with the command that makes it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

from pipelines.backbones import backbone_spec
from pipelines.contract import SPLITS
from pipelines.runtime.errors import MissingInput
from pipelines.training.data import features as feat
from pipelines.training.model.build import input_tag

#: What the model takes, as the feature cache keys it: the stored image as it is
#: (`MODEL_INPUT_DTYPE`).
STORED_DTYPE = "uint8"


@dataclass(frozen=True)
class FeatureSet:
    """A complete feature set: its folder's ``uri``, ``key``, row ``counts`` per split, classes and ``feature_dim``."""

    uri: str
    key: str
    counts: Dict[str, int]
    num_classes: int
    class_names: Tuple[Optional[str], ...]
    feature_dim: int


def find_feature_set(data: str, backbone: str, weights: str, image_size: int, seed: int,
                     storage_options: Optional[Mapping[str, str]] = None) -> FeatureSet:
    """The complete float32 feature set of the ETL output ``data`` for this backbone, weights and input side.

    Args:
        weights: ``imagenet``, ``none`` (random with ``seed``), or a weights file.
        image_size: input side in px, 0 = the stored size.

    Raises:
        MissingInput: no complete set; the message names the command that makes it.
        DataError: ``data`` is no ETL output."""
    from pipelines.training.data.dataset import load_dataset

    dataset = load_dataset(data, 1, dict(storage_options or {}))
    input_size = image_size or dataset.stored_size
    model = feat.model_key(weights, input_size, seed, backbone, "float32", input_tag(STORED_DTYPE, dataset.stored_size))
    key = feat.feature_key(model, dataset.identity())
    directory = feat.feature_dir(data, key, storage_options)
    counts = {split: dataset.rows(split) for split in SPLITS}
    if not feat.is_complete(directory, counts, key):
        size = f" --image-size {image_size}" if image_size else ""
        seeded = f" --seed {seed}" if weights == "none" else ""
        raise MissingInput(f"no complete feature cache of {data} for --backbone {backbone} --weights {weights}"
                           f"{size}{seeded} (looked for {directory.uri}): make it with "
                           f"`python jobs/train.py --data {data} --output DIR --feature-cache --backbone {backbone} "
                           f"--weights {weights}{size}{seeded}` (or horovodrun -np N ...), then search again")
    return FeatureSet(directory.uri, key, counts, dataset.num_classes, tuple(dataset.class_names),
                      backbone_spec(backbone).feature_dim)


def read_splits(uri: str, splits, storage_options: Optional[Mapping[str, str]] = None) -> Dict[str, Tuple]:
    """Every row of each of ``splits``: ``{split: (features float32 (n, feature_dim), labels int32 (n,))}``."""
    from pipelines.io.storage import resolve

    directory = resolve(uri, storage_options)
    return {split: feat.read_shard(directory, split, 0, 1) for split in splits}
