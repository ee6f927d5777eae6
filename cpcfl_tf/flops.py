"""FLOPs the way keras-flops counts them, working on TF 2.21 + Keras 3.

keras-flops 0.1.2 does not import on TF >= 2.16: it registers FLOP counters for
``AddV2``, ``Max`` and ``FusedBatchNormV3``, and TF now ships its own ``AddV2`` counter,
so the second registration raises ``KeyError``. A failed import has already registered
``FusedBatchNormV3``, so a retry fails too. :func:`import_keras_flops` drops TF's
duplicates first (keras-flops' counters for them count the same thing) and is safe to
call twice. Its ``get_flops`` then fails on Keras 3 (``[batch] + inp.shape[1:]`` with
tuple shapes), so :func:`count_flops` does the same counting itself: TF's profiler on
the frozen inference graph at the given batch size, 2 FLOPs per multiply-add.
"""

from __future__ import annotations

import sys
import types

_KERAS_FLOPS_OPS = ("AddV2", "Max", "FusedBatchNormV3")


def import_keras_flops() -> types.ModuleType:
    """Import ``keras_flops`` on TF 2.21, registering its FLOP counters once."""
    if "keras_flops" in sys.modules and hasattr(sys.modules["keras_flops"], "get_flops"):
        return sys.modules["keras_flops"]
    from tensorflow.python.framework import ops

    registry = ops._stats_registry._registry  # pylint: disable=protected-access
    for op in _KERAS_FLOPS_OPS:
        registry.pop(f"{op},flops", None)
    for name in [m for m in sys.modules if m == "keras_flops" or m.startswith("keras_flops.")]:
        del sys.modules[name]  # a half-done earlier import
    import keras_flops

    return keras_flops


def count_flops(model, batch_size: int = 1) -> int:
    """Float operations of one inference pass of ``model`` on ``batch_size`` inputs.

    Counted by TF's profiler on the frozen graph, as keras-flops does (the paper's
    table: CNN 0.17 G, ResNet-18 0.67 G, ResNet-50 1.42 G at 96x96x3).
    """
    import tensorflow as tf

    import_keras_flops()
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")  # the profiler warns that it is a TF1 API, on every call
    try:
        return _profile(model, batch_size)
    finally:
        logger.setLevel(level)


def _profile(model, batch_size: int) -> int:
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2_as_graph,
    )

    specs = [tf.TensorSpec((batch_size, *tuple(t.shape)[1:]), t.dtype) for t in model.inputs]
    concrete = tf.function(
        lambda *x: model(list(x) if len(x) > 1 else x[0], training=False)
    ).get_concrete_function(*specs)
    frozen, _ = convert_variables_to_constants_v2_as_graph(concrete)
    options = (
        tf.compat.v1.profiler.ProfileOptionBuilder(
            tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
        )
        .with_empty_output()
        .build()
    )
    profile = tf.compat.v1.profiler.profile(
        graph=frozen.graph, run_meta=tf.compat.v1.RunMetadata(), cmd="scope", options=options
    )
    return int(profile.total_float_ops)
