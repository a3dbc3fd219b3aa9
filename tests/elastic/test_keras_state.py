"""hora.keras.elastic's KerasState and callbacks, and hora.tensorflow.elastic's TensorFlowState, in one process."""

from __future__ import annotations

from collections.abc import Iterator

import hora
import numpy as np
import pytest

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import hora.keras as hvd  # noqa: E402
import hora.tensorflow as htf  # noqa: E402


@pytest.fixture
def one_rank() -> Iterator[None]:
    hora.init()
    yield
    hora.shutdown()


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.1)), loss="mse")
    return model


def test_keras_state_restores_weights_and_optimizer_slots(one_rank: None) -> None:
    model = _model()
    state = hvd.elastic.KerasState(model, epoch=0)
    assert model.optimizer.built  # built at once: every save covers the same variables
    x, y = np.ones((8, 3), np.float32), np.zeros((8, 2), np.float32)
    model.train_on_batch(x, y)
    state.epoch = 1
    state.commit()
    committed = [np.array(v) for v in model.get_weights()]
    iterations = int(model.optimizer.iterations.numpy())
    model.train_on_batch(x, y)
    state.epoch = 2
    state.restore()
    assert state.epoch == 1 and int(model.optimizer.iterations.numpy()) == iterations == 1
    for now, then in zip(model.get_weights(), committed, strict=True):
        np.testing.assert_array_equal(now, then)
    state.sync()  # one rank: its own values
    np.testing.assert_array_equal(model.get_weights()[0], committed[0])


def test_keras_state_refuses_a_model_that_is_not_built() -> None:
    with pytest.raises(ValueError, match="build the model first"):
        hvd.elastic.KerasState(keras.Sequential([keras.layers.Dense(2)]))


def test_the_callbacks_commit_and_count_epochs_across_fits(one_rank: None) -> None:
    model = _model()
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    commits: list[tuple[int, int]] = []
    save = state.save
    state.save = lambda: (commits.append((state.epoch, state.batch)), save())[1]  # type: ignore[method-assign]
    callbacks = [
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
    ]
    x, y = np.ones((16, 3), np.float32), np.zeros((16, 2), np.float32)
    model.fit(x, y, batch_size=4, epochs=2, callbacks=callbacks, verbose=0)
    # 4 batches an epoch: commits after batches 2 and 4 (state.batch 1 and 3, counting from 0), and at each epoch's
    # end with the next epoch's number, so a reset after it does not repeat the epoch.
    assert commits == [(0, 1), (0, 3), (1, 0), (1, 1), (1, 3), (2, 0)]
    assert state.epoch == 2 and state.batch == 0
    model.fit(x, y, batch_size=4, epochs=1, callbacks=callbacks, verbose=0)  # after a reset: counts on
    assert state.epoch == 3
    with pytest.raises(ValueError, match="batches_per_commit must be a positive integer, got 0"):
        hvd.elastic.CommitStateCallback(state, batches_per_commit=0)


def test_tensorflow_state_restores_and_syncs_variables(one_rank: None) -> None:
    variables = [tf.Variable([1.0, 2.0]), tf.Variable(3)]
    state = htf.elastic.TensorFlowState(variables, step=0)
    variables[0].assign([5.0, 6.0])
    variables[1].assign(7)
    state.step = 4
    state.restore()
    assert variables[0].numpy().tolist() == [1.0, 2.0] and int(variables[1].numpy()) == 3 and state.step == 0
    state.sync()
    assert htf.elastic.TensorFlowKerasState is hvd.elastic.KerasState
