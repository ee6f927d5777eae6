"""Layers the model factories share."""

from __future__ import annotations

from keras import layers


def batch_norm(**kwargs) -> layers.BatchNormalization:
    """BatchNormalization that, when built under a multi-replica ``tf.distribute``
    strategy, normalises with the statistics of the *global* batch (as a single device
    would); elsewhere the plain layer, so single-device numerics never change."""
    import tensorflow as tf

    synchronized = (
        tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1
    )
    return layers.BatchNormalization(synchronized=synchronized, **kwargs)
