"""Augmentations for contrastive views, as Keras layers run inside ``train_step``.

Sec. "Experimental settings": horizontal flip, random cropping, colour jitter
(brightness, contrast, saturation, hue) and channel manipulation (random grayscale).
Every layer works on float images in [0, 1] (brightness deltas are on that scale, not
0-255), draws its randomness from a seeded ``keras.random.SeedGenerator`` (its state is
a layer variable, so checkpoints resume it), and is vectorised over the batch: one
``crop_and_resize`` and a few elementwise ops per batch, no per-image loop. Grayscale
inputs (three equal channels) pass through saturation and hue unchanged.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import keras
import tensorflow as tf

DEFAULT_STRENGTHS: dict[str, Any] = {
    "crop_scale": (0.2, 1.0),   # area fraction kept by the random resized crop
    "crop_ratio": (3 / 4, 4 / 3),
    "flip": True,
    "jitter_probability": 0.8,
    "brightness": 0.4,          # additive delta in [-0.4, 0.4] on the [0, 1] scale
    "contrast": 0.4,            # factor in [0.6, 1.4] around each image's mean
    "saturation": 0.4,
    "hue": 0.1,                 # rotation of up to 0.1 turn in YIQ space
    "grayscale_probability": 0.2,
}
"""SimCLR's strengths (Chen et al. 2020, as in keras-io's SimCLR example), used unchanged."""


def _uniform(gen: keras.random.SeedGenerator, batch, low, high):
    return keras.random.uniform((batch,), low, high, seed=gen)


def _apply_with_probability(gen, batch, probability, changed, original):
    keep = _uniform(gen, batch, 0.0, 1.0) < probability
    return tf.where(keep[:, None, None, None], changed, original)


def _luminance(x):
    return tf.reduce_sum(x * tf.constant([0.299, 0.587, 0.114], x.dtype), -1, keepdims=True)


class RandomResizedCrop(keras.layers.Layer):
    """Crop a random box (area fraction in ``scale``, aspect in ``ratio``), resize back."""

    def __init__(self, scale=(0.2, 1.0), ratio=(3 / 4, 4 / 3), seed=None, **kwargs):
        super().__init__(**kwargs)
        self.scale, self.ratio = tuple(scale), tuple(ratio)
        self.gen = keras.random.SeedGenerator(seed)

    def call(self, x, training=True):
        if not training:
            return x
        batch, size = tf.shape(x)[0], tf.shape(x)[1:3]
        area = _uniform(self.gen, batch, *self.scale)
        log_ratio = _uniform(self.gen, batch, math.log(self.ratio[0]), math.log(self.ratio[1]))
        ratio = tf.exp(log_ratio)
        h = tf.minimum(tf.sqrt(area / ratio), 1.0)
        w = tf.minimum(tf.sqrt(area * ratio), 1.0)
        y0 = _uniform(self.gen, batch, 0.0, 1.0) * (1.0 - h)
        x0 = _uniform(self.gen, batch, 0.0, 1.0) * (1.0 - w)
        boxes = tf.stack([y0, x0, y0 + h, x0 + w], axis=1)
        return tf.image.crop_and_resize(x, boxes, tf.range(batch), size)


class RandomFlip(keras.layers.Layer):
    """Mirror each image left-right with probability 1/2."""

    def __init__(self, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.gen = keras.random.SeedGenerator(seed)

    def call(self, x, training=True):
        if not training:
            return x
        return _apply_with_probability(self.gen, tf.shape(x)[0], 0.5, tf.reverse(x, [2]), x)


class ColorJitter(keras.layers.Layer):
    """Brightness, contrast, saturation and hue, in that order, with one probability."""

    def __init__(self, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, probability=0.8,
                 seed=None, **kwargs):
        super().__init__(**kwargs)
        self.brightness, self.contrast = brightness, contrast
        self.saturation, self.hue, self.probability = saturation, hue, probability
        self.gen = keras.random.SeedGenerator(seed)

    def call(self, x, training=True):
        if not training:
            return x
        batch = tf.shape(x)[0]

        def per_image(low, high):
            return _uniform(self.gen, batch, low, high)[:, None, None, None]

        y = x + per_image(-self.brightness, self.brightness)
        mean = tf.reduce_mean(y, axis=[1, 2, 3], keepdims=True)
        y = (y - mean) * per_image(1 - self.contrast, 1 + self.contrast) + mean
        gray = _luminance(y)
        y = gray + (y - gray) * per_image(1 - self.saturation, 1 + self.saturation)
        y = _rotate_hue(y, per_image(-self.hue, self.hue)[..., 0] * 2 * math.pi)
        y = tf.clip_by_value(y, 0.0, 1.0)
        return _apply_with_probability(self.gen, batch, self.probability, y, x)


_TO_YIQ = tf.constant([[0.299, 0.596, 0.211], [0.587, -0.274, -0.523], [0.114, -0.322, 0.312]])
_FROM_YIQ = tf.linalg.inv(_TO_YIQ)


def _rotate_hue(x, angle):
    """Rotate the chroma plane of YIQ by ``angle`` (shape (batch, 1, 1)) radians."""
    yiq = tf.tensordot(x, _TO_YIQ, 1)
    cos, sin = tf.cos(angle), tf.sin(angle)
    i = yiq[..., 1] * cos - yiq[..., 2] * sin
    q = yiq[..., 1] * sin + yiq[..., 2] * cos
    return tf.tensordot(tf.stack([yiq[..., 0], i, q], -1), _FROM_YIQ, 1)


class RandomGrayscale(keras.layers.Layer):
    """Replace the channels by their luminance with probability ``probability``."""

    def __init__(self, probability=0.2, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.probability = probability
        self.gen = keras.random.SeedGenerator(seed)

    def call(self, x, training=True):
        if not training:
            return x
        gray = tf.broadcast_to(_luminance(x), tf.shape(x))
        return _apply_with_probability(self.gen, tf.shape(x)[0], self.probability, gray, x)


def build_augmenter(strengths: Mapping[str, Any] | None = None, *, seed: int | None = None,
                    name: str = "augmenter") -> keras.Sequential:
    """The view generator ``Augment(.)`` of Algorithm "Contrastive encoder pre-training".

    Parameters
    ----------
    strengths
        Overrides of :data:`DEFAULT_STRENGTHS`; unknown keys are an error.
    seed
        Seeds the layers (each gets its own stream derived from it).
    """
    s = dict(DEFAULT_STRENGTHS)
    unknown = set(strengths or {}) - set(s)
    if unknown:
        from cpcfl_tf.errors import UserError

        raise UserError(f"unknown augmentation strength(s) {', '.join(sorted(unknown))}; "
                        f"known: {', '.join(s)}")
    s.update(strengths or {})
    seeds = [None if seed is None else seed * 8 + k for k in range(4)]
    stack = [RandomResizedCrop(s["crop_scale"], s["crop_ratio"], seed=seeds[0], name="crop")]
    if s["flip"]:
        stack.append(RandomFlip(seed=seeds[1], name="flip"))
    stack.append(ColorJitter(s["brightness"], s["contrast"], s["saturation"], s["hue"],
                             s["jitter_probability"], seed=seeds[2], name="jitter"))
    stack.append(RandomGrayscale(s["grayscale_probability"], seed=seeds[3], name="grayscale"))
    return keras.Sequential(stack, name=name)
