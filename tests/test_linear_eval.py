"""Real-data check (offline Fashion-MNIST): contrastive pre-training must pay."""
import sys

import keras
import numpy as np
import tensorflow as tf
import pytest

from cpcfl_tf.plan.sections import PretrainConfig
from cpcfl_tf.pretraining.linear_eval import encode, linear_eval, select_best
from cpcfl_tf.pretraining.pretrain import pretrain_key
from cpcfl_tf.pretraining.pretrain import pretrain
from cpcfl_tf.data import load_labeled, load_unlabeled
from cpcfl_tf.models import build_encoder
from cpcfl_tf.methods.ssl import SSL_METHODS


@pytest.fixture(scope="module")
def proxy():
    return (load_labeled("fashion_mnist_idx", "train[50000:51000]", image_size=32),
            load_labeled("fashion_mnist_idx", "test[:1000]", image_size=32))


def test_simclr_beats_a_random_encoder_on_fashion_mnist(proxy, tmp_path):
    unlabeled = load_unlabeled("fashion_mnist_idx", "train[:2500]", image_size=32)
    keras.utils.set_random_seed(0)
    random_encoder = build_encoder("cnn", (32, 32, 3))  # the same init pre-training starts from
    baseline = linear_eval(random_encoder, *proxy)
    # 20 steps lift the linear accuracy from about 0.36 to 0.59 (measured): far above
    # the margin asked, at half the cost of a longer pre-training.
    result = pretrain(PretrainConfig(epochs=2, batch_size=250), unlabeled, tmp_path,
                      method=SSL_METHODS["simclr"], seed=0, verbose=0)
    trained = linear_eval(result.encoder, *proxy)
    assert trained > baseline + 0.05, (baseline, trained)


def test_encode_is_batched_and_deterministic(proxy):
    encoder = build_encoder("cnn", (32, 32, 3))
    features = encode(encoder, proxy[0].images[:700], batch_size=256)
    assert features.shape == (700, 256)
    assert np.allclose(features, encode(encoder, proxy[0].images[:700], batch_size=700), atol=1e-5)


def test_select_best_keeps_the_highest_linear_accuracy(tmp_path):
    images = load_unlabeled("digits", "train[:256]", image_size=32)
    train = load_labeled("digits", "train[697:997]", image_size=32)
    test = load_labeled("digits", "test", image_size=32)
    candidates = [(SSL_METHODS["simclr"], PretrainConfig(epochs=1, batch_size=128).with_settings(
        "simclr", projector_dim=d)) for d in (256, 512)]
    (method, best), encoder, scores = select_best(candidates, images, train, test, tmp_path,
                                                  verbose=0)
    assert [s["key"] for s in scores] == [pretrain_key(c, m.name, seed=0, images=list(images.shape))
                                          for m, c in candidates]
    winner = max(scores, key=lambda s: s["accuracy"])
    assert (best.settings("simclr")["projector_dim"] == winner["config"]["projector_dim"]
            and method is SSL_METHODS["simclr"])
    assert encoder.output_shape == (None, 256)
    assert all((tmp_path / s["key"] / "encoder.keras").exists() for s in scores)


@pytest.mark.parametrize("second_pass", ["repeats the first", "differs", "cannot be made"])
def test_the_heads_training_is_keras_fit_bit_for_bit(monkeypatch, second_pass):
    # fit_head replays one pass of fit's shuffled batches instead of fit's iterator per
    # epoch; its weights must be those Keras's own fit gives, with a partial last batch
    # (70 = 2 x 32 + 6). Should a second pass differ, or Keras's pipeline be elsewhere
    # (another Keras), fit itself trains.
    from cpcfl_tf.models import build_classifier_head
    from cpcfl_tf.models.seeding import seeded
    from cpcfl_tf.pretraining import linear_eval as module

    rng = np.random.default_rng(1)
    features = rng.normal(size=(70, 12)).astype(np.float32)
    labels = rng.integers(0, 3, 70)

    def compiled():
        with seeded(5):
            head = build_classifier_head("c", 12, 3)
        head.compile(optimizer=keras.optimizers.Adam(1e-2),
                     loss="sparse_categorical_crossentropy", jit_compile=False)
        return head

    keras_fit = compiled()
    keras_fit.fit(features, labels, epochs=7, batch_size=32, verbose=0, shuffle=True)
    fitted = []
    if second_pass == "differs":
        from keras.src.trainers.data_adapters import array_data_adapter as arrays

        class Reshuffling(arrays.ArrayDataAdapter):  # each pass its own order (fit's own
            def get_tf_dataset(self):                # adapter is bound elsewhere)
                return tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(
                    70, reshuffle_each_iteration=True).batch(32)

        monkeypatch.setattr(arrays, "ArrayDataAdapter", Reshuffling)
    elif second_pass == "cannot be made":
        monkeypatch.setitem(sys.modules, "keras.src.trainers.data_adapters.array_data_adapter",
                            None)  # its import fails
    else:  # the replay, not fit, trains
        monkeypatch.setattr(keras.Model, "fit", lambda *a, **k: fitted.append(1))
    mine = compiled()
    module.fit_head(mine, features, labels, epochs=7, batch_size=32)
    assert not fitted
    moved = [not np.array_equal(a, b) for a, b in zip(mine.get_weights(), compiled().get_weights())]
    assert all(moved)
    for a, b in zip(mine.get_weights(), keras_fit.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_features_of_traces_once_per_image_shape_and_gives_the_encoders_features():
    # A linear evaluation's two splits, or every client's images, through one trace;
    # Python runs the encoder's call only while tracing, so the calls count the traces.
    from cpcfl_tf.data.images import to_float
    from cpcfl_tf.pretraining.linear_eval import features_of

    model = keras.Sequential([keras.Input((None, None, 3)), keras.layers.Conv2D(4, 3),
                              keras.layers.GlobalAveragePooling2D()])  # any image size
    traces = []

    def counted(x, training):
        traces.append(x.shape)
        return model(x, training=training)

    rng = np.random.default_rng(0)
    sets = [rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8) for n in (5, 3)]
    features = features_of(counted, batch_size=2)
    got = [features(images) for images in sets]
    assert len(traces) == 1  # two calls, five batches: one trace
    for images, f in zip(sets, got):
        np.testing.assert_allclose(f, model(to_float(images), training=False).numpy(),
                                   rtol=1e-5, atol=1e-6)
    features(rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8))
    assert len(traces) == 2  # another image shape: its own trace
