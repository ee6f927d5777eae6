"""Contrastive losses (Sec. "Contrastive encoder pre-training techniques").

Plain functions of their inputs. The stop-gradient and the symmetric sum over the two
views belong to the train steps in :mod:`cpcfl_tf.methods.ssl`.

All of them compute in float32, also when the model runs in mixed precision.
"""

from __future__ import annotations

import tensorflow as tf


def _f32(*tensors):
    return [tf.cast(t, tf.float32) for t in tensors]


def cosine(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """Row-wise cosine similarity, Eq. (cosine_similarity)."""
    a, b = _f32(a, b)
    return tf.reduce_sum(tf.math.l2_normalize(a, -1) * tf.math.l2_normalize(b, -1), -1)


def nt_xent(z_i: tf.Tensor, z_j: tf.Tensor, temperature: float = 0.1) -> tf.Tensor:
    """SimCLR's loss, Eq. (simclr), averaged over all 2B anchors.

    Row k of ``z_i`` and row k of ``z_j`` are the two views of image k. Every other of
    the 2B projections is a negative; the anchor itself is excluded from the denominator.
    """
    z = tf.math.l2_normalize(tf.concat(_f32(z_i, z_j), 0), -1)
    n = tf.shape(z_i)[0]
    logits = tf.matmul(z, z, transpose_b=True) / temperature
    logits = logits - 1e9 * tf.eye(2 * n, dtype=logits.dtype)  # drop i' = i
    positives = tf.concat([tf.range(n, 2 * n), tf.range(0, n)], 0)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(positives, logits))


def nt_xent_across_replicas(z_i: tf.Tensor, z_j: tf.Tensor, temperature: float = 0.1) -> tf.Tensor:
    """:func:`nt_xent` of the *global* batch, computed on one replica's share of it.

    Under a ``tf.distribute`` strategy every replica holds B/R images; their projections
    are gathered so each local anchor sees all 2B - 2 negatives, as on one device. The
    result is the mean over this replica's 2B/R anchors; the mean over replicas (equal
    shares) is the single-device loss. Outside a multi-replica context it is
    :func:`nt_xent`.
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return nt_xent(z_i, z_j, temperature)
    z_i, z_j = _f32(z_i, z_j)
    n = tf.shape(z_i)[0]
    total = n * context.num_replicas_in_sync
    first = n * context.replica_id_in_sync_group  # this replica's rows in the global batch
    candidates = tf.math.l2_normalize(
        tf.concat([context.all_gather(z_i, 0), context.all_gather(z_j, 0)], 0), -1
    )
    anchors = tf.math.l2_normalize(tf.concat([z_i, z_j], 0), -1)
    rows = tf.concat([first + tf.range(n), total + first + tf.range(n)], 0)
    logits = tf.matmul(anchors, candidates, transpose_b=True) / temperature
    logits -= 1e9 * tf.one_hot(rows, 2 * total, dtype=logits.dtype)  # drop i' = i
    positives = tf.concat([total + first + tf.range(n), first + tf.range(n)], 0)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(positives, logits))


def whole_batch(z: tf.Tensor) -> tf.Tensor:
    """``z``'s rows of every replica, in order, under a multi-replica ``tf.distribute``
    strategy (each replica holds B/R of them): what a loss built on the batch's
    statistics (VICReg's variance and covariance) needs to equal its single-device
    value. Outside a multi-replica context it is ``z``. Gradients flow back to each
    replica's own rows (the gather's gradient is summed over replicas)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return z
    return context.all_gather(z, 0)


def byol_loss(p: tf.Tensor, z: tf.Tensor) -> tf.Tensor:
    """BYOL's loss, Eq. (byol): mean of ``||p/|p| - z/|z|||^2 = 2 - 2 cos(p, z)``."""
    return tf.reduce_mean(2.0 - 2.0 * cosine(p, z))


def simsiam_loss(p: tf.Tensor, z: tf.Tensor) -> tf.Tensor:
    """SimSiam's loss, Eq. (simsiam): mean of ``-cos(p, z)``."""
    return -tf.reduce_mean(cosine(p, z))


def embedding_std(z: tf.Tensor) -> tf.Tensor:
    """Collapse monitor: per-dimension std of the L2-normalised embeddings, averaged.

    About ``1/sqrt(d)`` for well-spread embeddings of dimension d, 0 at total collapse
    (SimSiam paper, Sec. 4.1).
    """
    return tf.reduce_mean(tf.math.reduce_std(tf.math.l2_normalize(_f32(z)[0], -1), axis=0))
