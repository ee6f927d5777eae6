"""How this machine makes a script's runs, besides what each run is: the command line's
options that change no result (:class:`RunContext`), built once
(:func:`cpcfl_tf.running.script.run_context`) and passed as one argument to the runner,
the encoder cache and the simulator, each of which reads the options it uses.

Nothing here is part of a run's config, key, checkpoint fingerprint or record: a run made
with any context has the bits it has without one (``--max-clients-per-step`` chunks
independent clients, ``--diagnose`` and ``--knn-every`` observe, ``--tensorboard`` logs).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What a script's runs are made with, from its command line (the defaults: a run
    printing its progress, made from scratch, on one device, nothing observed)."""

    verbose: int = 1
    """1: a line per round and epoch; 0: silent."""
    resume: bool = False
    """Continue interrupted runs from their checkpoints (``--resume``)."""
    force: bool = False
    """Make finished runs again (``--force``)."""
    dry_run: bool = False
    """Say what each run would do, touching nothing (``--dry-run``)."""
    distribute: str = "default"
    """The server's pre-training on one device, or ``mirrored`` over the GPUs
    (``--distribute``)."""
    max_clients: int | None = None
    """At most this many clients in one training step (``--max-clients-per-step``; None:
    every client of the round)."""
    diagnose: int = 0
    """Rounds of the selection diagnostic in the runs made now (``--diagnose``;
    :mod:`cpcfl_tf.clustered.diagnostics`)."""
    tensorboard: Path | None = None
    """Folder of TensorBoard scalars (``--tensorboard``; None: none written)."""
    knn_every: int = 0
    """Every this many epochs of a pre-training made here, the kNN monitor
    (``--knn-every``; 0: off)."""
    knn_proxy: tuple[tuple[str, str], tuple[str, str]] | None = None
    """The kNN monitor's labeled ``(dataset, split)`` pair (``--knn-proxy``; None: the
    linear evaluation's)."""
    selection: dict[int, dict[str, dict[str, Any]]] | None = None
    """Seed -> self-supervised method -> the settings ``--encoders-from`` starts its runs'
    encoders with (None: the config's)."""
    data_checked: bool = False
    """The script checked its base config's data already (not checked again)."""
