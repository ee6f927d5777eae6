"""Augmentations for contrastive views, as Keras layers run inside ``train_step``.

Sec. "Experimental settings": horizontal flip, random cropping, colour jitter
(brightness, contrast, saturation, hue) and channel manipulation (random grayscale).
Both layers work on float images in [0, 1] (brightness deltas are on that scale, not
0-255), draw their randomness from a seeded ``keras.random.SeedGenerator`` (its state is
a layer variable, so checkpoints resume it), and are vectorised over the batch: one
``crop_and_resize`` and one fused colour pass per batch, no per-image loop. Grayscale
inputs (three equal channels) pass through saturation and hue unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

DEFAULT_STRENGTHS: dict[str, Any] = {
    "crop_scale": (0.2, 1.0),  # area fraction kept by the random resized crop
    "crop_ratio": (3 / 4, 4 / 3),
    "flip": True,
    "jitter_probability": 0.8,
    "brightness": 0.4,  # additive delta in [-0.4, 0.4] on the [0, 1] scale
    "contrast": 0.4,  # factor in [0.6, 1.4] around each image's mean
    "saturation": 0.4,
    "hue": 0.1,  # rotation of up to 0.1 turn in YIQ space
    "grayscale_probability": 0.2,
}
"""SimCLR's strengths (Chen et al. 2020, as in keras-io's SimCLR example), used unchanged."""


def _uniform(gen: keras.random.SeedGenerator, batch, low, high):
    return keras.random.uniform((batch,), low, high, seed=gen)


def _happens(gen, batch, probability):
    return _uniform(gen, batch, 0.0, 1.0) < probability


_LUMA = (0.299, 0.587, 0.114)
_TO_YIQ = tf.constant([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_FROM_YIQ = tf.linalg.inv(_TO_YIQ)


class RandomResizedCropFlip(keras.layers.Layer):
    """Random resized crop and horizontal flip, in one ``crop_and_resize`` per batch.

    The box keeps an area fraction in ``scale`` with aspect ratio in ``ratio``; a
    flipped image simply gets its box's left and right edges swapped, which
    ``crop_and_resize`` samples mirrored (so the flip costs nothing extra).
    """

    def __init__(self, scale=(0.2, 1.0), ratio=(3 / 4, 4 / 3), flip=True, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.scale, self.ratio, self.flip = tuple(scale), tuple(ratio), flip
        self.gen = keras.random.SeedGenerator(seed)

    def call(self, x, training=True):
        if not training:
            return x
        batch, size = tf.shape(x)[0], tf.shape(x)[1:3]
        area = _uniform(self.gen, batch, *self.scale)
        ratio = tf.exp(_uniform(self.gen, batch, math.log(self.ratio[0]), math.log(self.ratio[1])))
        h = tf.minimum(tf.sqrt(area / ratio), 1.0)
        w = tf.minimum(tf.sqrt(area * ratio), 1.0)
        y0 = _uniform(self.gen, batch, 0.0, 1.0) * (1.0 - h)
        x0 = _uniform(self.gen, batch, 0.0, 1.0) * (1.0 - w)
        left, right = x0, x0 + w
        if self.flip:
            mirrored = _happens(self.gen, batch, 0.5)
            left, right = tf.where(mirrored, right, left), tf.where(mirrored, left, right)
        boxes = tf.stack([y0, left, y0 + h, right], axis=1)
        return tf.image.crop_and_resize(x, boxes, tf.range(batch), size)


class ColorAugment(keras.layers.Layer):
    """Colour jitter (with probability ``jitter_probability``) then random grayscale.

    Brightness (additive, on the [0, 1] scale) and contrast (around each image's mean)
    make one affine map per image; saturation, hue (a rotation in YIQ space) and
    grayscale are each a 3x3 linear map of the channels, so they compose into one
    matrix per image. The whole layer is then a single pass over the pixels, with one
    clip to [0, 1] at the end. Gray inputs have no chroma, so saturation and hue leave
    them gray.
    """

    def __init__(
        self,
        brightness=0.4,
        contrast=0.4,
        saturation=0.4,
        hue=0.1,
        jitter_probability=0.8,
        grayscale_probability=0.2,
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.brightness, self.contrast = brightness, contrast
        self.saturation, self.hue = saturation, hue
        self.jitter_probability = jitter_probability
        self.grayscale_probability = grayscale_probability
        self.gen = keras.random.SeedGenerator(seed)

    def call(self, x, training=True):
        if not training:
            return x
        batch = tf.shape(x)[0]
        jitter = tf.cast(_happens(self.gen, batch, self.jitter_probability), x.dtype)

        def factor(strength, centre):  # identity where this image is not jittered
            return centre + jitter * (
                _uniform(self.gen, batch, centre - strength, centre + strength) - centre
            )

        brightness, contrast = factor(self.brightness, 0.0), factor(self.contrast, 1.0)
        saturation, angle = factor(self.saturation, 1.0), factor(self.hue, 0.0) * 2 * math.pi
        gray = tf.cast(_happens(self.gen, batch, self.grayscale_probability), x.dtype)

        eye = tf.eye(3, dtype=x.dtype)[None]
        to_luma = tf.broadcast_to(tf.constant([_LUMA] * 3, x.dtype)[None], (batch, 3, 3))
        s = saturation[:, None, None]
        mix = s * eye + (1.0 - s) * to_luma  # saturation
        cos, sin, one, zero = (
            tf.cos(angle),
            tf.sin(angle),
            tf.ones_like(angle),
            tf.zeros_like(angle),
        )
        rotate = tf.reshape(
            tf.stack([one, zero, zero, zero, cos, -sin, zero, sin, cos], 1), (batch, 3, 3)
        )
        mix = tf.linalg.matmul(_FROM_YIQ @ rotate @ _TO_YIQ, mix)  # then hue
        g = gray[:, None, None]
        mix = tf.linalg.matmul(g * to_luma + (1.0 - g) * eye, mix)  # then grayscale
        # contrast c and brightness b: y = c * (x - mean) + mean + b, per image
        mean = tf.reduce_mean(x, axis=[1, 2, 3])
        scale = contrast[:, None, None] * mix
        offset = (
            tf.linalg.matvec(mix, tf.ones((batch, 3), x.dtype))
            * ((1.0 - contrast) * mean + brightness)[:, None]
        )
        y = tf.einsum("bhwc,bdc->bhwd", x, scale) + offset[:, None, None, :]
        return tf.clip_by_value(y, 0.0, 1.0)


def build_augmenter(
    strengths: Mapping[str, Any] | None = None, *, seed: int | None = None, name: str = "augmenter"
) -> keras.Sequential:
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

        raise UserError(
            f"unknown augmentation strength(s) {', '.join(sorted(unknown))}; known: {', '.join(s)}"
        )
    s.update(strengths or {})
    seeds = [None if seed is None else seed * 8 + k for k in range(2)]
    # float32 whatever the model's dtype policy: views are made before the encoder casts.
    return keras.Sequential(
        [
            RandomResizedCropFlip(
                s["crop_scale"],
                s["crop_ratio"],
                s["flip"],
                seed=seeds[0],
                name="crop_flip",
                dtype="float32",
            ),
            ColorAugment(
                s["brightness"],
                s["contrast"],
                s["saturation"],
                s["hue"],
                s["jitter_probability"],
                s["grayscale_probability"],
                seed=seeds[1],
                name="color",
                dtype="float32",
            ),
        ],
        name=name,
    )
