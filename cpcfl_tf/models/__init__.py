"""Models: encoders theta_f, classifier heads theta_c, projectors and predictors."""

from cpcfl_tf.models.encoders import ENCODER_DIMS, build_encoder
from cpcfl_tf.models.heads import (
    HEAD_WIDTHS,
    build_classifier,
    build_classifier_head,
    build_predictor,
    build_projector,
)

__all__ = [
    "ENCODER_DIMS",
    "HEAD_WIDTHS",
    "build_encoder",
    "build_classifier",
    "build_classifier_head",
    "build_predictor",
    "build_projector",
]
