"""The values a setting may take, where they are the kit's own lists: the encoders and
the width of what they give, the classifier heads, the precisions, schedules and local
optimizers; and the two checks the sections make of a value.

The methods' names are their registries' (:mod:`cpcfl_tf.methods`)."""

from __future__ import annotations

import math

from cpcfl_tf.errors import require

ENCODER_DIMS = {"cnn": 256, "resnet18": 512, "resnet50": 2048}
"""The encoders and the width of their output (Sec. "Experimental settings", "ResNet-18
encoder", app. "ResNet-50 encoder"); :mod:`cpcfl_tf.models` builds them."""
HEAD_WIDTHS = {"c": (), "c-1": (256,), "c-2": (256, 128), "c-3": (256, 128, 64)}
"""Hidden widths of the classifier heads (fig:head_structure)."""
ENCODERS = tuple(ENCODER_DIMS)
HEADS = tuple(HEAD_WIDTHS)
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
LR_SCHEDULES = ("constant", "cosine")
LOCAL_OPTIMIZERS = ("adam", "sgd")
OPTIMIZER_STATES = ("fresh", "client")
MIN_IMAGE_SIZE = 32
"""The CNN encoder's four valid stride-2 convolutions need at least 31 pixels."""


def require_positive(section: str, **values: float) -> None:
    for name, value in values.items():
        require(
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value > 0
            and math.isfinite(value),
            f"{section}.{name} must be a positive finite number, got {value!r}",
        )


def require_choice(section: str, name: str, value: str, choices: tuple[str, ...]) -> None:
    require(
        value in choices, f"unknown {section}.{name} {value!r}; choose one of {', '.join(choices)}"
    )
