"""Encoders theta_f: the paper's CNN, ResNet-18 and ResNet-50 (functional Keras models).

All take float32 images in [0, 1] of shape ``input_shape`` and return a flat vector:
256-d (CNN), 512-d (ResNet-18) or 2048-d (ResNet-50).
"""

from __future__ import annotations

import keras
from keras import layers

from cpcfl_tf.errors import UserError
from cpcfl_tf.models.layers import batch_norm
from cpcfl_tf.plan.choices import ENCODER_DIMS

_MIN_SIZE = {"cnn": 31, "resnet18": 32, "resnet50": 32}


def build_encoder(
    name: str, input_shape: tuple[int, int, int], *, model_name: str = "encoder"
) -> keras.Model:
    """Build encoder ``name`` (``cnn``, ``resnet18`` or ``resnet50``) for ``input_shape``.

    Parameters
    ----------
    name
        Architecture. ``cnn`` is the paper's default (Sec. "Experimental settings").
    input_shape
        ``(height, width, channels)``; the CNN needs at least 31 pixels a side.
    model_name
        Keras name of the returned model (the classifier finds its encoder by it).
    """
    if name not in ENCODER_DIMS:
        raise UserError(f"unknown encoder {name!r}; choose one of {', '.join(ENCODER_DIMS)}")
    height, width = input_shape[:2]
    if min(height, width) < _MIN_SIZE[name]:
        raise UserError(
            f"the {name} encoder needs inputs of at least {_MIN_SIZE[name]}x"
            f"{_MIN_SIZE[name]} pixels, got {height}x{width}; use image_size >= 32"
        )
    return {"cnn": _cnn, "resnet18": _resnet18, "resnet50": _resnet50}[name](
        tuple(input_shape), model_name
    )


def _cnn(input_shape, model_name):
    # 4 x Conv2D(3x3, stride 2, valid, ReLU) with 64/128/192/256 filters, Flatten,
    # Dense(256, ReLU): 2,378,304 parameters at 96x96x3 (paper: ~2.4 M).
    inputs = keras.Input(input_shape, name="images")
    x = inputs
    for i, filters in enumerate((64, 128, 192, 256)):
        x = layers.Conv2D(
            filters, 3, strides=2, padding="valid", activation="relu", name=f"conv{i + 1}"
        )(x)
    x = layers.Flatten(name="flatten")(x)
    outputs = layers.Dense(256, activation="relu", name="dense")(x)
    return keras.Model(inputs, outputs, name=model_name)


def _resnet18(input_shape, model_name):
    # The standard ImageNet ResNet-18 (7x7/2 stem, 3x3/2 max-pool, basic blocks [2,2,2,2]
    # with BN, global average pooling): 0.668 GFLOPs at 96x96, the paper's 0.67.
    inputs = keras.Input(input_shape, name="images")
    x = layers.ZeroPadding2D(3, name="stem_pad")(inputs)
    x = layers.Conv2D(64, 7, strides=2, use_bias=False, name="stem_conv")(x)
    x = batch_norm(epsilon=1e-5, name="stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    x = layers.ZeroPadding2D(1, name="pool_pad")(x)
    x = layers.MaxPooling2D(3, strides=2, name="stem_pool")(x)
    for stage, filters in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, filters, stride, f"stage{stage + 1}_block{block + 1}")
    outputs = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    return keras.Model(inputs, outputs, name=model_name)


def _basic_block(x, filters, stride, name):
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = layers.Conv2D(
            filters, 1, strides=stride, use_bias=False, name=f"{name}_down_conv"
        )(x)
        shortcut = batch_norm(epsilon=1e-5, name=f"{name}_down_bn")(shortcut)
    y = layers.ZeroPadding2D(1, name=f"{name}_pad1")(x)
    y = layers.Conv2D(filters, 3, strides=stride, use_bias=False, name=f"{name}_conv1")(y)
    y = batch_norm(epsilon=1e-5, name=f"{name}_bn1")(y)
    y = layers.ReLU(name=f"{name}_relu1")(y)
    y = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv2")(y)
    y = batch_norm(epsilon=1e-5, name=f"{name}_bn2")(y)
    y = layers.Add(name=f"{name}_add")([shortcut, y])
    return layers.ReLU(name=f"{name}_out")(y)


def _resnet50(input_shape, model_name):
    base = keras.applications.ResNet50(
        weights=None, include_top=False, input_shape=input_shape, pooling="avg"
    )
    # Re-wrap so the model carries the kit's name and input name like the others.
    inputs = keras.Input(input_shape, name="images")
    return keras.Model(inputs, base(inputs), name=model_name)
