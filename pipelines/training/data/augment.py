"""``--augment``: stateless random ops on the training images in ``tf.data``, each row's draws from its key
``(seed, stream position)`` alone, so a stream opened at a row augments every row as the whole stream did,
whatever the reader. An augmentation is added to ``AUGMENTATIONS`` here, and nowhere else."""
from __future__ import annotations

from typing import Sequence


def flip(image, key):
    """``image`` uint8 (s, s, 3) mirrored left to right or not, the coin drawn from ``key`` int64 (2,)."""
    import tensorflow as tf

    return tf.image.stateless_random_flip_left_right(image, seed=key)


#: what ``--augment`` applies, in this order: ``name: op(image uint8 (s, s, 3), key int64 (2,)) -> image``
AUGMENTATIONS = {"flip": flip}


def augment_rows(images, keys, names: Sequence[str] = tuple(AUGMENTATIONS)):
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
