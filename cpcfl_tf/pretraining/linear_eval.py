"""Linear evaluation (Sec. "Experimental settings"): a classifier head theta_c trained on
the frozen encoder's features of a labeled proxy set, scored on the proxy test set. The
paper pre-trains several encoders and keeps the one with the best proxy accuracy."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from cpcfl_tf.compat import pretrain_settings
from cpcfl_tf.data.images import to_float
from cpcfl_tf.data.specs import LabeledImages
from cpcfl_tf.methods.ssl import SSLMethod
from cpcfl_tf.models import build_classifier_head
from cpcfl_tf.models.seeding import seeded
from cpcfl_tf.plan.sections import PretrainConfig


def features_of(encoder: keras.Model, batch_size: int = 512) -> Callable[[np.ndarray], np.ndarray]:
    """``uint8`` images -> their features from the frozen ``encoder`` (inference mode), in
    batches of ``batch_size``: one trace for every call and batch of one image shape
    (a linear evaluation's two splits, each client's images)."""
    traced = {}

    def features(images: np.ndarray) -> np.ndarray:
        shape = tuple(images.shape[1:])
        if shape not in traced:
            spec = tf.TensorSpec((None, *shape), tf.uint8)
            traced[shape] = tf.function(
                lambda x: encoder(to_float(x), training=False),
                jit_compile=False,
                input_signature=[spec],
            )
        return np.concatenate(
            [
                traced[shape](tf.constant(images[i : i + batch_size])).numpy()
                for i in range(0, len(images), batch_size)
            ]
        )

    return features


def encode(encoder: keras.Model, images: np.ndarray, batch_size: int = 512) -> np.ndarray:
    """Features of ``uint8`` ``images`` from the frozen ``encoder`` (inference mode);
    :func:`features_of` for several sets of images."""
    return features_of(encoder, batch_size)(images)


def linear_eval(
    encoder: keras.Model,
    train: LabeledImages,
    test: LabeledImages,
    *,
    epochs: int = 100,
    batch_size: int = 256,
    learning_rate: float = 1e-3,
    seed: int = 0,
) -> float:
    """Proxy test accuracy of a theta_c (Dense softmax) trained on frozen features.

    Features are computed once; the head trains with Adam on them, as ``head.fit(...,
    shuffle=True)`` trains it (:func:`fit_head`).
    """
    features = tuple(map(features_of(encoder), (train.images, test.images)))
    with seeded(seed):
        head = build_classifier_head("c", features[0].shape[1], train.num_classes)
    head.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        jit_compile=False,
    )
    fit_head(head, features[0], train.labels, epochs=epochs, batch_size=batch_size)
    predictions = np.argmax(head(features[1], training=False).numpy(), axis=1)
    return float(np.mean(predictions == test.labels))


def fit_head(
    head: keras.Model, features: np.ndarray, labels: np.ndarray, *, epochs: int, batch_size: int
) -> None:
    """Train the compiled ``head`` as ``head.fit(features, labels, epochs=epochs,
    batch_size=batch_size, shuffle=True)`` does, bit for bit, at a fifth of the cost.

    ``fit`` makes a new tf.data iterator every epoch, most of a linear evaluation's time.
    With TensorFlow's global seed set (``seeded`` sets it), each of those iterators
    shuffles into the same batches: they are taken once from Keras's own input pipeline
    and replayed through the compiled ``train_step`` fit runs. Should a second pass give
    other batches, or the pipeline not be where this Keras keeps it (another Keras),
    ``fit`` itself trains.
    """
    batches = _epoch_batches(features, labels, batch_size)
    if batches is None:
        head.fit(features, labels, epochs=epochs, batch_size=batch_size, verbose=0, shuffle=True)
        return
    spec = [tf.TensorSpec((None, *t.shape[1:]), t.dtype) for t in batches[0]]
    step = tf.function(
        lambda x, y: head.train_step((x, y)),
        input_signature=spec,
        jit_compile=False,
        autograph=False,
    )
    for _ in range(epochs):
        for x, y in batches:
            step(x, y)


def _epoch_batches(features: np.ndarray, labels: np.ndarray, batch_size: int) -> list | None:
    """The shuffled batches every epoch of ``fit`` gets from Keras's array pipeline, or
    None where two passes of it differ or this Keras keeps it elsewhere."""
    try:
        from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    except ImportError:
        return None
    dataset = ArrayDataAdapter(
        features, labels, batch_size=batch_size, shuffle=True
    ).get_tf_dataset()
    first, second = list(dataset), list(dataset)
    same = len(first) == len(second) and all(
        np.array_equal(a, b) for one, two in zip(first, second) for a, b in zip(one, two)
    )
    return first if same else None


def select_best(
    candidates: Sequence[tuple[SSLMethod, PretrainConfig]],
    images: np.ndarray,
    proxy_train: LabeledImages,
    proxy_test: LabeledImages,
    out_root: str | Path,
    *,
    seed: int = 0,
    verbose: int = 1,
) -> tuple[tuple[SSLMethod, PretrainConfig], keras.Model, list[dict]]:
    """Pre-train every candidate ``(method, config)`` (``method`` an entry of
    :data:`~cpcfl_tf.methods.ssl.SSL_METHODS`), score each by linear evaluation, return
    the best.

    Returns the winning candidate, its encoder and one record per candidate
    (``{"key", "method", "config", "accuracy"}``); each pre-training lives in
    ``out_root/<pretrain_key>`` and is reused when it is already there.
    """
    from cpcfl_tf.pretraining.pretrain import pretrain, pretrain_key

    scores: list[dict] = []
    best: tuple[tuple[SSLMethod, PretrainConfig], keras.Model, float] | None = None
    for method, config in candidates:
        key = pretrain_key(config, method.name, seed=seed, images=list(images.shape))
        result = pretrain(
            config, images, Path(out_root) / key, method=method, seed=seed, verbose=verbose
        )
        accuracy = linear_eval(result.encoder, proxy_train, proxy_test, seed=seed)
        scores.append(
            {
                "key": key,
                "method": method.name,
                "config": pretrain_settings(dataclasses.asdict(config), method.name),
                "accuracy": accuracy,
            }
        )
        if verbose:
            print(f"{key}: linear evaluation accuracy {accuracy:.4f}")
        if best is None or accuracy > best[2]:
            best = ((method, config), result.encoder, accuracy)
    if best is None:
        raise ValueError("no candidate to select from")
    return best[0], best[1], scores


def relevance_score(
    encoder: keras.Model,
    images_a: np.ndarray,
    images_b: np.ndarray,
    *,
    count: int = 300,
    seed: int = 0,
) -> float:
    """Relevance of two datasets for an encoder (tab:different_datasets): ``count`` random
    images of each through the encoder, the mean cosine similarity over all cross pairs."""
    rng = np.random.default_rng(seed)
    pick = [x[rng.choice(len(x), min(count, len(x)), replace=False)] for x in (images_a, images_b)]
    a, b = (
        f / np.linalg.norm(f, axis=1, keepdims=True).clip(1e-12)
        for f in map(features_of(encoder), pick)
    )
    return float((a @ b.T).mean())
