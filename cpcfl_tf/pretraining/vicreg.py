"""VICReg (Bardes, Ponce and LeCun, "VICReg: Variance-Invariance-Covariance
Regularization for Self-Supervised Learning", ICLR 2022), beyond the CP-CFL paper.

Both views go through one encoder and one expander; the loss pulls the two embeddings of
an image together (invariance), keeps every dimension's standard deviation over the batch
near gamma (variance) and decorrelates the dimensions (covariance). No negatives, no
predictor, no stop-gradient, no target network. Settings and their sources: the registry
entry in :mod:`cpcfl_tf.methods.ssl`.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers

from cpcfl_tf.models.layers import batch_norm
from cpcfl_tf.pretraining.losses import whole_batch
from cpcfl_tf.pretraining.model import ContrastiveModel, Parts


def variance_term(z: tf.Tensor, gamma: float = 1.0, epsilon: float = 1e-4) -> tf.Tensor:
    """v(Z) (VICReg, Eq. 1-2): mean over dimensions of max(0, gamma - sqrt(Var + eps)),
    with the unbiased variance over the batch."""
    n = tf.cast(tf.shape(z)[0], z.dtype)
    centred = z - tf.reduce_mean(z, 0)
    variance = tf.reduce_sum(tf.square(centred), 0) / (n - 1.0)
    return tf.reduce_mean(tf.nn.relu(gamma - tf.sqrt(variance + epsilon)))


def covariance_term(z: tf.Tensor) -> tf.Tensor:
    """c(Z) (VICReg, Eq. 3-4): the squared off-diagonal entries of the covariance matrix
    over the batch, summed and divided by the dimension d."""
    n = tf.cast(tf.shape(z)[0], z.dtype)
    d = tf.cast(tf.shape(z)[1], z.dtype)
    centred = z - tf.reduce_mean(z, 0)
    cov = tf.matmul(centred, centred, transpose_a=True) / (n - 1.0)
    off = tf.reduce_sum(tf.square(cov)) - tf.reduce_sum(tf.square(tf.linalg.diag_part(cov)))
    return off / d


def invariance_term(z1: tf.Tensor, z2: tf.Tensor) -> tf.Tensor:
    """s(Z, Z') (VICReg, Eq. 5), as the authors' code computes it: the mean squared
    difference over images *and* dimensions (the equation sums over dimensions; the
    weights 25/25/1 were set with the code's mean: docs/choices.md)."""
    return tf.reduce_mean(tf.square(z1 - z2))


def vicreg_loss(
    z1: tf.Tensor,
    z2: tf.Tensor,
    *,
    sim_weight: float = 25.0,
    var_weight: float = 25.0,
    cov_weight: float = 1.0,
    gamma: float = 1.0,
    epsilon: float = 1e-4,
) -> tf.Tensor:
    """VICReg's loss (Eq. 6): ``lambda s + mu (v(Z) + v(Z')) / 2 + nu (c(Z) + c(Z'))``.

    The variance terms of the two branches are averaged, as in the authors' code (the
    equation adds them; docs/choices.md). Computed in float32. Under a multi-replica
    strategy the variance and covariance are the whole batch's (:func:`whole_batch`, as
    the authors' code gathers them over GPUs), the invariance this replica's images'
    mean: the mean over replicas is the single-device loss.
    """
    z1, z2 = tf.cast(z1, tf.float32), tf.cast(z2, tf.float32)
    all1, all2 = whole_batch(z1), whole_batch(z2)
    variance = (variance_term(all1, gamma, epsilon) + variance_term(all2, gamma, epsilon)) / 2.0
    covariance = covariance_term(all1) + covariance_term(all2)
    return sim_weight * invariance_term(z1, z2) + var_weight * variance + cov_weight * covariance


def build_expander(input_dim: int, width: int, *, model_name: str = "projector") -> keras.Model:
    """VICReg's expander (Sec. 4.3): Dense-BN-ReLU, Dense-BN-ReLU, Dense, all ``width``."""
    inputs = keras.Input((input_dim,), name="features")
    x = inputs
    for i in (1, 2):
        x = layers.Dense(width, name=f"dense{i}")(x)
        x = batch_norm(name=f"bn{i}")(x)
        x = layers.ReLU(name=f"relu{i}")(x)
    outputs = layers.Dense(width, name="dense3")(x)
    return keras.Model(inputs, outputs, name=model_name)


class VICReg(ContrastiveModel):
    """Shared encoder + expander, the variance-invariance-covariance loss."""

    def __init__(self, encoder, augmenter, projector, weights: dict, **kwargs):
        super().__init__(encoder, augmenter, **kwargs)
        self.projector = projector
        self.loss_settings = dict(weights)

    @property
    def online_parts(self):
        return [self.encoder, self.projector]

    def contrastive_loss(self, view1, view2):
        # One pass per view, as in the authors' code: BatchNormalization normalises each
        # view with its own batch statistics.
        z1, z2 = (
            self.projector(self.encoder(v, training=True), training=True) for v in (view1, view2)
        )
        return vicreg_loss(z1, z2, **self.loss_settings), z1


def build(parts: Parts, settings: dict) -> VICReg:
    width = settings["projector_dim"] or 4 * parts.dim
    weights = {
        k: settings[k] for k in ("sim_weight", "var_weight", "cov_weight", "gamma", "epsilon")
    }
    return VICReg(
        parts.encoder, parts.augmenter, build_expander(parts.dim, width), weights, name="vicreg"
    )
