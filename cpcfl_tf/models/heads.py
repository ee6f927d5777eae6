"""Heads: classifier heads theta_c (fig:head_structure), projectors theta_g, predictors theta_q.

Classifier heads (Sec. "Learning capacity of the classifier head"): ``c`` is one
Dense(num_classes, softmax); ``c-1``/``c-2``/``c-3`` put 1/2/3 ReLU Dense layers of
widths 256, 128, 64 before it. ``c-3`` on the CNN's 256-d output has 107,594 parameters
(the paper's ~0.1 M).
"""

from __future__ import annotations

import keras
from keras import layers

from cpcfl_tf.errors import UserError
from cpcfl_tf.models.layers import batch_norm
from cpcfl_tf.plan.choices import HEAD_WIDTHS


def build_classifier_head(
    name: str, input_dim: int, num_classes: int, *, model_name: str = "head"
) -> keras.Model:
    """Classifier head ``name`` (``c``, ``c-1``, ``c-2``, ``c-3``) from ``input_dim`` features."""
    if name not in HEAD_WIDTHS:
        raise UserError(f"unknown classifier head {name!r}; choose one of {', '.join(HEAD_WIDTHS)}")
    if input_dim < 1 or num_classes < 2:
        raise UserError(
            f"a classifier head needs input_dim >= 1 and num_classes >= 2, got "
            f"{input_dim} and {num_classes}"
        )
    inputs = keras.Input((input_dim,), name="features")
    x = inputs
    for i, width in enumerate(HEAD_WIDTHS[name]):
        x = layers.Dense(width, activation="relu", name=f"hidden{i + 1}")(x)
    outputs = layers.Dense(num_classes, activation="softmax", name="probs")(x)
    return keras.Model(inputs, outputs, name=model_name)


def build_projector(
    kind: str,
    input_dim: int,
    *,
    width: int | None = None,
    output_dim: int | None = None,
    model_name: str = "projector",
) -> keras.Model:
    """Projection head theta_g.

    ``kind="simclr"``: Dense(width, ReLU) -> Dense(output_dim), 256/256 by default (the
    ResNet-50 setting uses 1024 -> 2048). ``kind="bn"`` (BYOL, SimSiam): Dense(width) BN
    ReLU -> Dense(output_dim) BN, 512/512 by default.
    """
    inputs = keras.Input((input_dim,), name="features")
    if kind == "simclr":
        width, output_dim = width or 256, output_dim or width or 256
        x = layers.Dense(width, activation="relu", name="dense1")(inputs)
        outputs = layers.Dense(output_dim, name="dense2")(x)
    elif kind == "bn":
        width, output_dim = width or 512, output_dim or width or 512
        x = layers.Dense(width, use_bias=False, name="dense1")(inputs)
        x = batch_norm(name="bn1")(x)
        x = layers.ReLU(name="relu1")(x)
        x = layers.Dense(output_dim, use_bias=False, name="dense2")(x)
        outputs = batch_norm(name="bn2")(x)
    else:
        raise UserError(f"unknown projector kind {kind!r}; choose simclr or bn")
    return keras.Model(inputs, outputs, name=model_name)


def build_predictor(
    input_dim: int, *, bottleneck: int = 64, model_name: str = "predictor"
) -> keras.Model:
    """Predictor theta_q of BYOL/SimSiam: Dense(bottleneck) BN ReLU -> Dense(input_dim)."""
    inputs = keras.Input((input_dim,), name="projection")
    x = layers.Dense(bottleneck, use_bias=False, name="dense1")(inputs)
    x = batch_norm(name="bn1")(x)
    x = layers.ReLU(name="relu1")(x)
    outputs = layers.Dense(input_dim, name="dense2")(x)
    return keras.Model(inputs, outputs, name=model_name)


def build_classifier(
    encoder: keras.Model, head: keras.Model, *, model_name: str = "classifier"
) -> keras.Model:
    """theta = (theta_f, theta_c): ``encoder`` then ``head``, kept as two named sub-models.

    ``model.get_layer("encoder")`` and ``model.get_layer("head")`` give the two weight
    groups, so the simulator can freeze, swap or average the encoder as one unit.
    """
    inputs = keras.Input(encoder.input_shape[1:], name="images")
    return keras.Model(inputs, head(encoder(inputs)), name=model_name)
