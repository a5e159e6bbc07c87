"""``--augment``: stateless random ops on the training images in ``tf.data``, each row's draws from its key
``(seed, stream position)`` alone, so a stream opened at a row augments every row as the whole stream did,
whatever the reader. An augmentation is added to ``AUGMENTATIONS`` here, and nowhere else."""
from __future__ import annotations

from typing import Sequence, Tuple

from pipelines.runtime.errors import Refused

#: The side of ``crop``'s square, as a fraction of the image's side.
CROP_FRACTION = 0.875


def flip(image, key):
    """``image`` uint8 (s, s, 3) mirrored left to right or not, the coin drawn from ``key`` int64 (2,)."""
    import tensorflow as tf

    return tf.image.stateless_random_flip_left_right(image, seed=key)


def crop(image, key):
    """``image`` uint8 (s, s, 3): a square of ``CROP_FRACTION`` of its side at a place drawn from ``key`` int64 (2,),
    resized back to (s, s) (bilinear, rounded)."""
    import tensorflow as tf

    side = image.shape[0]
    cut = max(1, round(side * CROP_FRACTION))
    square = tf.image.stateless_random_crop(image, (cut, cut, image.shape[2]), seed=key)
    resized = tf.image.resize(tf.cast(square, tf.float32), (side, side))
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)


#: what ``--augment`` can apply: ``name: op(image uint8 (s, s, 3), key int64 (2,)) -> image``
AUGMENTATIONS = {"flip": flip, "crop": crop}


def augmentation_names(value: str) -> Tuple[str, ...]:
    """The ops ``--augment``'s ``value`` names, in order: ``"flip,crop"`` -> ``("flip", "crop")``; ``""``: none.

    Raises:
        pipelines.runtime.errors.Refused: a name not in ``AUGMENTATIONS``, or one named twice."""
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in AUGMENTATIONS]
    if unknown or len(set(names)) < len(names):
        raise Refused(f"--augment {value}: a comma-separated list of distinct ops among {', '.join(AUGMENTATIONS)}")
    return names


def augment_rows(images, keys, names: Sequence[str] = ("flip",)):
    """``images`` uint8 (b, s, s, 3), each row through the ops ``names`` seeded by its row of ``keys`` int64 (b, 2).

    The first op's seed is the row's key itself; each later op's is the key with the op's index folded in.

    Raises:
        KeyError: a name not in ``AUGMENTATIONS``."""
    import tensorflow as tf

    ops = [AUGMENTATIONS[name] for name in names]

    def one(row):
        image, key = row
        for index, op in enumerate(ops):
            image = op(image, key if index == 0 else tf.random.experimental.stateless_fold_in(key, index))
        return image

    return tf.map_fn(one, (images, keys), fn_output_signature=tf.TensorSpec(images.shape[1:], images.dtype))
