"""Timing of compiled steps, shared by experiments/pretraining_cost.py,
benchmarks/benchmark_pretraining.py and benchmarks/speed_study.py: one warm-up, median
of the rest."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from cpcfl_tf.data.images import to_float
from cpcfl_tf.methods.ssl import SSLMethod
from cpcfl_tf.plan.sections import PretrainConfig
from cpcfl_tf.pretraining.pretrain import build_contrastive_model


def _timed(step: Callable[..., object], inputs: tuple) -> float:
    started = time.perf_counter()
    first = tf.nest.flatten(step(*inputs))[0]
    # A step has finished when its call returns (eager calls are synchronous); reading one
    # output makes sure. Reading them all would time copies of large outputs as well.
    if hasattr(first, "numpy"):
        first.numpy()
    return time.perf_counter() - started


def median_seconds(step: Callable[..., object], *inputs, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``step(*inputs)`` over ``repeats`` calls after ``warmup`` calls."""
    return compare_seconds({"step": step}, *inputs, repeats=repeats, warmup=warmup)["step"]


def compare_seconds(
    steps: dict[str, Callable[..., object]], *inputs, repeats: int, warmup: int = 1
) -> dict[str, float]:
    """Median seconds of each ``step(*inputs)``, measured in alternation so drift hits
    all alike."""
    for step in steps.values():
        for _ in range(warmup):
            _timed(step, inputs)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            times[name].append(_timed(step, inputs))
    return {name: statistics.median(t) for name, t in times.items()}


def random_images(batch_size: int, image_size: int, seed: int = 0) -> tf.Tensor:
    """STL-10-shaped stand-in data: uint8 noise (speed does not depend on content)."""
    rng = np.random.default_rng(seed)
    return tf.constant(rng.integers(0, 256, (batch_size, image_size, image_size, 3), np.uint8))


def contrastive_step(config: PretrainConfig, image_size: int, seed: int, method: SSLMethod):
    """The compiled ``train_step`` of ``method`` (an entry of
    :data:`~cpcfl_tf.methods.ssl.SSL_METHODS`), as pre-training runs it."""
    model = build_contrastive_model(config, (image_size, image_size, 3), method=method, seed=seed)
    return model.make_step(config.jit_compile)


def bare_encoder_step(config: PretrainConfig, image_size: int, seed: int = 0):
    """Encoder forward + backward + Adam update on the 2B images a contrastive step sees,
    with no augmentation, projector or contrastive loss: the floor a step cannot beat."""
    from cpcfl_tf.models import build_encoder
    from cpcfl_tf.models.seeding import seeded

    with seeded(seed):
        encoder = build_encoder(config.encoder, (image_size, image_size, 3))
    optimizer = keras.optimizers.Adam(config.learning_rate)
    optimizer.build(encoder.trainable_variables)

    def step(images):
        x = to_float(images)
        x = tf.concat([x, x], 0)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(encoder(x, training=True)))
        grads = tape.gradient(loss, encoder.trainable_variables)
        optimizer.apply_gradients(zip(grads, encoder.trainable_variables))
        return loss

    return tf.function(step, jit_compile=config.jit_compile)
