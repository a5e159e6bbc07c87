"""``--augment``: the ops it names, in order, each drawn from a row's key alone; refused names exit 2."""
import numpy as np
import pytest

from pipelines.runtime.config import parse_config
from pipelines.runtime.errors import Refused
from pipelines.training.config import TrainConfig
from pipelines.training.data.augment import augmentation_names


def train_config(*flags):
    return parse_config(TrainConfig, ["--data", "d", "--output", "o", "--no-tracking", *flags])


@pytest.mark.parametrize("flags, value, names", [
    ([], "", ()),
    (["--augment"], "flip", ("flip",)),  # the flag alone: the flips it always meant
    (["--augment", "crop"], "crop", ("crop",)),
    (["--augment", "flip,crop"], "flip,crop", ("flip", "crop")),
    (["--augment", " crop , flip "], "crop,flip", ("crop", "flip")),
    (["--augment="], "", ()),
])
def test_augment_names_the_ops_in_the_order_they_apply(flags, value, names):
    loader = train_config(*flags).loader
    assert (loader.augment, loader.augmentations) == (value, names)


@pytest.mark.parametrize("value", ["blur", "flip,rotate", "flip,flip", "FLIP"])
def test_an_op_that_is_not_there_or_named_twice_exits_2_in_one_line(value, capsys):
    with pytest.raises(SystemExit) as info:
        train_config("--augment", value)
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"--augment {value}: a comma-separated list of distinct ops among flip, crop" in err
    with pytest.raises(Refused, match="--augment"):
        augmentation_names(value)


def crops(images, keys):
    import tensorflow as tf

    from pipelines.training.data.augment import augment_rows

    return augment_rows(tf.constant(images), tf.constant(keys), ("crop",)).numpy()


def test_crop_is_a_square_of_7_8_of_the_side_resized_back_drawn_from_the_key():
    """16 px images, a ramp along the width: each crop keeps dtype and shape, a plain image stays
    the same, a ramp stays a ramp (non-decreasing), and the same key gives the same crop while the
    14 px square's place (3 x 3 choices) varies with the key."""
    side = 16
    ramp = np.broadcast_to((np.arange(side) * 16).astype(np.uint8)[None, :, None], (side, side, 3))
    plain = np.full((side, side, 3), 77, np.uint8)
    keys = np.stack([np.full(24, 5), np.arange(24)], axis=1).astype(np.int64)
    out = crops(np.stack([ramp] * 24), keys)
    assert out.dtype == np.uint8 and out.shape == (24, side, side, 3)
    assert (np.diff(out.astype(int), axis=2) >= 0).all() and not (out == ramp).all(axis=(1, 2, 3)).any()
    assert len({row.tobytes() for row in out}) > 1  # the place differs with the key
    np.testing.assert_array_equal(crops(np.stack([ramp] * 24), keys), out)
    np.testing.assert_array_equal(crops(np.stack([plain] * 3), keys[:3]), np.stack([plain] * 3))


def test_ops_apply_in_the_order_named_the_later_ones_from_the_key_with_their_index_folded_in():
    import tensorflow as tf

    from pipelines.training.data.augment import augment_rows, crop, flip

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    keys = np.stack([np.full(6, 9), np.arange(6)], axis=1).astype(np.int64)
    got = augment_rows(tf.constant(images), tf.constant(keys), ("crop", "flip")).numpy()
    for image, key, row in zip(images, keys, got):
        second = tf.random.experimental.stateless_fold_in(tf.constant(key), 1)
        np.testing.assert_array_equal(row, flip(crop(tf.constant(image), tf.constant(key)), second).numpy())
