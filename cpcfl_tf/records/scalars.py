"""TensorBoard scalars of runs and pre-trainings (``--tensorboard DIR``).

Event files are written with TensorFlow's own ``tf.summary.write`` and the metadata of
TensorBoard's scalar plugin, so the kit needs no ``tensorboard`` package to write them
(TensorFlow 2.21's wheel does not bring it); to look at them: ``pip install tensorboard
&& tensorboard --logdir DIR``. :func:`read_scalars` reads them back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ScalarLog:
    """One run's (or one pre-training's) scalars, in their own folder."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self._writer: Any = None  # tf.summary's writer, made at the first write

    def write(self, step: int, values: Mapping[str, float | None]) -> None:
        """``values`` (name -> number) at ``step`` (a round, an epoch), flushed at once so
        a killed run keeps what it logged."""
        import tensorflow as tf

        if self._writer is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._writer = tf.summary.create_file_writer(str(self.folder))
        writer = self._writer
        metadata = tf.compat.v1.SummaryMetadata()
        metadata.plugin_data.plugin_name = "scalars"  # what tensorboard's scalar() writes
        with writer.as_default(step=step):
            for name, value in values.items():
                if value is None:  # a round without evaluation (federated.eval_every)
                    continue
                tf.summary.write(name, tf.constant(float(value), tf.float32), metadata=metadata)
        writer.flush()


def read_scalars(folder: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files of ``folder``: name -> [(step, value), ...]."""
    import tensorflow as tf

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(folder).glob("events.out.tfevents.*")):
        for raw in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(raw.numpy())
            for value in event.summary.value:
                number = (
                    float(tf.make_ndarray(value.tensor))
                    if value.HasField("tensor")
                    else value.simple_value
                )
                scalars.setdefault(value.tag, []).append((int(event.step), number))
    return scalars
