"""Linear evaluation (Sec. "Experimental settings"): a classifier head theta_c trained on
the frozen encoder's features of a labeled proxy set, scored on the proxy test set. The
paper pre-trains several encoders and keeps the one with the best proxy accuracy."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

from cpcfl_tf.compat import pretrain_settings
from cpcfl_tf.config import PretrainConfig
from cpcfl_tf.data.images import to_float
from cpcfl_tf.data.specs import LabeledImages
from cpcfl_tf.models import build_classifier_head
from cpcfl_tf.models.seeding import seeded


def encode(encoder: keras.Model, images: np.ndarray, batch_size: int = 512) -> np.ndarray:
    """Features of ``uint8`` ``images`` from the frozen ``encoder`` (inference mode)."""
    spec = tf.TensorSpec((None, *images.shape[1:]), tf.uint8)  # one trace for all batches
    forward = tf.function(lambda x: encoder(to_float(x), training=False), jit_compile=False,
                          input_signature=[spec])
    return np.concatenate([forward(tf.constant(images[i:i + batch_size])).numpy()
                           for i in range(0, len(images), batch_size)])


def linear_eval(encoder: keras.Model, train: LabeledImages, test: LabeledImages, *,
                epochs: int = 100, batch_size: int = 256, learning_rate: float = 1e-3,
                seed: int = 0) -> float:
    """Proxy test accuracy of a theta_c (Dense softmax) trained on frozen features.

    Features are computed once; the head trains with Adam on them (one ``fit`` per
    evaluation, which is cheap next to the pre-training it scores).
    """
    features = encode(encoder, train.images), encode(encoder, test.images)
    with seeded(seed):
        head = build_classifier_head("c", features[0].shape[1], train.num_classes)
    head.compile(optimizer=keras.optimizers.Adam(learning_rate),
                 loss="sparse_categorical_crossentropy", jit_compile=False)
    head.fit(features[0], train.labels, epochs=epochs, batch_size=batch_size, verbose=0,
             shuffle=True)
    predictions = np.argmax(head(features[1], training=False).numpy(), axis=1)
    return float(np.mean(predictions == test.labels))


def select_best(candidates: Sequence[tuple[str, PretrainConfig]], images: np.ndarray,
                proxy_train: LabeledImages, proxy_test: LabeledImages, out_root: str | Path,
                *, seed: int = 0, verbose: int = 1
                ) -> tuple[tuple[str, PretrainConfig], keras.Model, list[dict]]:
    """Pre-train every candidate ``(method, config)``, score each by linear evaluation,
    return the best.

    Returns the winning candidate, its encoder and one record per candidate
    (``{"key", "method", "config", "accuracy"}``); each pre-training lives in
    ``out_root/<pretrain_key>`` and is reused when it is already there.
    """
    from cpcfl_tf.pretraining.pretrain import pretrain, pretrain_key

    scores, best = [], None
    for method, config in candidates:
        key = pretrain_key(config, method, seed=seed, images=list(images.shape))
        result = pretrain(config, images, Path(out_root) / key, method=method, seed=seed,
                          verbose=verbose)
        accuracy = linear_eval(result.encoder, proxy_train, proxy_test, seed=seed)
        scores.append({"key": key, "method": method,
                       "config": pretrain_settings(dataclasses.asdict(config), method),
                       "accuracy": accuracy})
        if verbose:
            print(f"{key}: linear evaluation accuracy {accuracy:.4f}")
        if best is None or accuracy > best[2]:
            best = ((method, config), result.encoder, accuracy)
    return best[0], best[1], scores


def relevance_score(encoder: keras.Model, images_a: np.ndarray, images_b: np.ndarray, *,
                    count: int = 300, seed: int = 0) -> float:
    """Relevance of two datasets for an encoder (tab:different_datasets): ``count`` random
    images of each through the encoder, the mean cosine similarity over all cross pairs."""
    rng = np.random.default_rng(seed)
    pick = [x[rng.choice(len(x), min(count, len(x)), replace=False)] for x in (images_a, images_b)]
    a, b = (f / np.linalg.norm(f, axis=1, keepdims=True).clip(1e-12) for f in
            (encode(encoder, p) for p in pick))
    return float((a @ b.T).mean())
