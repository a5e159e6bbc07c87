"""EpochStats: the per-epoch figures the scaling model is fitted to (step time, loss scale)."""
import numpy as np
import pytest

from pipelines.training.callbacks import EpochStats, loss_scale, step_seconds


@pytest.mark.parametrize("starts, end, wanted", [
    ([0.0, 1.0, 3.0], 6.0, 2.0),          # steps of 1, 2 and 3 s
    ([10.0], 10.25, 0.25),                # one step
    ([0.0, 0.5, 1.0, 1.5], 9.0, 0.5),     # a slow last step does not move the median
    ([], 5.0, 0.0),                       # no step
])
def test_the_step_time_is_the_median_from_start_to_start(starts, end, wanted):
    assert step_seconds(starts, end) == pytest.approx(wanted)


def _fit(policy: str, epochs: int = 2):
    from pipelines.stack.kerasapi import keras
    keras.mixed_precision.set_global_policy(policy)
    try:
        inputs = keras.Input((4,))
        outputs = keras.layers.Dense(3, dtype="float32")(keras.layers.Dense(8)(inputs))
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
        stats = EpochStats(steps_per_epoch=3, global_batch=2)
        history = model.fit(np.ones((6, 4), np.float32), np.arange(6) % 3, batch_size=2, epochs=epochs,
                            callbacks=[stats], verbose=0)
        return model, history.history
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_each_epoch_logs_its_step_time_and_float32_has_no_loss_scale():
    model, history = _fit("float32")
    assert len(history["step_ms"]) == 2 and all(ms > 0 for ms in history["step_ms"])
    assert all(ms <= 1000 * s for ms, s in zip(history["step_ms"], history["epoch_seconds"]))
    assert "loss_scale" not in history and loss_scale(model.optimizer) is None


def test_mixed_precision_logs_the_loss_scale_of_each_epoch():
    model, history = _fit("mixed_float16", epochs=3)
    scales = history["loss_scale"]
    # Keras' dynamic loss scale starts at 2**15, halves on each overflow, doubles after 2,000 finite steps
    assert len(scales) == 3 and all(s in [2.0 ** k for k in range(16)] for s in scales), scales
    assert scales == sorted(scales, reverse=True)
    assert scales[-1] == float(model.optimizer.loss_scale.numpy()) == loss_scale(model.optimizer)
