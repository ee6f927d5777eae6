"""The kNN monitor of a pre-training: weighted k-nearest-neighbour accuracy of the
encoder's features on a labeled proxy (InstDisc, Wu et al., CVPR 2018, Sec. 3.4; the
monitor lightly and solo-learn print every epoch).

The proxy's training images are the memory bank; each proxy test image votes its k most
cosine-similar bank images, each with weight ``exp(similarity / temperature)``, and takes
the class with the largest sum. The labels serve the monitor only: the pre-training's
loss never sees them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from cpcfl_tf.data.specs import LabeledImages
from cpcfl_tf.errors import UserError
from cpcfl_tf.pretraining.linear_eval import features_of, linear_eval

K = 200
"""InstDisc's k (Sec. 3.4; lightly's and solo-learn's kNN callbacks use it too)."""
TEMPERATURE = 0.07
"""InstDisc's tau for the weights exp(s / tau) (Sec. 3.4)."""


def knn_predict(
    bank: np.ndarray,
    bank_labels: np.ndarray,
    queries: np.ndarray,
    num_classes: int,
    *,
    k: int = K,
    temperature: float = TEMPERATURE,
    chunk: int = 1024,
) -> np.ndarray:
    """The weighted-kNN class of every row of ``queries`` among ``bank``'s rows (features,
    L2-normalised here), ``chunk`` queries at a time."""
    bank = tf.math.l2_normalize(tf.constant(bank, tf.float32), -1)
    labels = tf.constant(bank_labels, tf.int32)
    k = min(k, int(bank.shape[0]))
    out = []
    for start in range(0, len(queries), chunk):
        q = tf.math.l2_normalize(tf.constant(queries[start : start + chunk], tf.float32), -1)
        similarity, index = tf.math.top_k(tf.matmul(q, bank, transpose_b=True), k=k)
        weights = tf.exp(similarity / temperature)
        votes = tf.reduce_sum(
            tf.one_hot(tf.gather(labels, index), num_classes) * weights[..., None], axis=1
        )
        out.append(tf.argmax(votes, -1, output_type=tf.int32).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.int32)


@dataclasses.dataclass
class KnnMonitor:
    """kNN accuracy of an encoder on a labeled proxy, every ``every`` epochs."""

    train: LabeledImages
    test: LabeledImages
    every: int = 1
    k: int = K
    temperature: float = TEMPERATURE

    def __post_init__(self) -> None:
        for part in (self.train, self.test):
            if part.labels is None or len(part.labels) != len(part.images):
                raise UserError(
                    f"the kNN proxy {part.source} has no labels; name a labeled "
                    "split for --knn-proxy"
                )
        if not (isinstance(self.every, int) and self.every >= 1):
            raise UserError(f"--knn-every must be a positive integer, got {self.every!r}")

    def due(self, epoch: int, epochs: int) -> bool:
        """Whether the monitor runs after ``epoch`` (1-based) of ``epochs``."""
        return epoch % self.every == 0 or epoch == epochs

    def accuracy(self, encoder) -> float:
        bank, queries = map(features_of(encoder), (self.train.images, self.test.images))
        predicted = knn_predict(
            bank,
            self.train.labels,
            queries,
            self.train.num_classes,
            k=self.k,
            temperature=self.temperature,
        )
        return float(np.mean(predicted == self.test.labels))


def proxy_scores(
    encoder, train: LabeledImages, test: LabeledImages, *, seed: int, epochs: int
) -> dict:
    """An encoder's scores on a labeled proxy, as the studies keep them: linear
    accuracy (:func:`~cpcfl_tf.pretraining.linear_eval.linear_eval`, ``epochs`` of it),
    weighted-kNN accuracy (:class:`KnnMonitor`) and the weights' fingerprint."""
    from cpcfl_tf.records.files import weights_fingerprint

    return {
        "linear_accuracy": linear_eval(encoder, train, test, seed=seed, epochs=epochs),
        "linear_epochs": epochs,
        "knn_accuracy": KnnMonitor(train, test).accuracy(encoder),
        "fingerprint": weights_fingerprint(encoder.get_weights()),
    }
