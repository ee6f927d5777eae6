"""The machine and software a result came from, and the one switch of TensorFlow's
behaviour the kit sets per process (op determinism on a GPU).

Every run record's ``environment`` comes from :func:`run_environment`: versions, device,
CPU kind (AVX-512 or not decides the last bits of a run) and the fingerprint of the
starting encoder, so two records can be told to share a machine kind and pre-training.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

from cpcfl_tf.results import weights_fingerprint


_DETERMINISTIC_OPS = False


def set_determinism(deterministic: bool, gpus: list | None = None) -> bool:
    """Turn on TensorFlow's op determinism where it matters: on a GPU, several kernels
    (reductions, convolution algorithms picked at run time) differ from run to run
    otherwise. A CPU's kernels are deterministic already, and turning it on there could
    change the last bits of results recorded without it, so it stays off. Returns
    whether it is on (recorded in every result's ``environment``)."""
    global _DETERMINISTIC_OPS
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU") if gpus is None else gpus
    if deterministic and gpus and not _DETERMINISTIC_OPS:
        tf.config.experimental.enable_op_determinism()
        _DETERMINISTIC_OPS = True
    return _DETERMINISTIC_OPS


def environment() -> dict:
    """Versions and device, for the ``environment`` field of every result file."""
    import keras
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        device = f"gpu: {details.get('device_name', gpus[0].name)}"
    else:
        device = f"cpu: {os.cpu_count()} cores ({platform.processor() or platform.machine()})"
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "device": device,
            "cpu": cpu_model(), "onednn": onednn_enabled(),
            "python": platform.python_version(), "deterministic_ops": _DETERMINISTIC_OPS}


REPRODUCING = ("tensorflow", "keras", "device", "cpu", "onednn", "deterministic_ops")
"""The fields of :func:`environment` a run's last bits depend on besides its config and
starting encoder: where all of them are the same, the run comes out bit for bit the same
(docs/experiments.md, "Bit for bit")."""


def reproduces(recorded: dict, here: dict | None = None) -> bool:
    """Whether this machine (``here``, default :func:`environment`) would make the run
    whose record has environment ``recorded`` bit for bit, given its config and starting
    encoder. Records without a field (older ones) never do."""
    here = environment() if here is None else here
    return all(k in recorded and recorded[k] == here.get(k) for k in REPRODUCING)


def run_environment(encoder_weights) -> dict:
    """The ``environment`` of a run record: :func:`environment` and the fingerprint of
    the weights the run started from (``None`` for random init), so two runs can be
    told to share a pre-training or not."""
    return {**environment(), "starting_encoder": weights_fingerprint(encoder_weights)}


def onednn_enabled() -> bool | None:
    """Whether TensorFlow runs its oneDNN CPU kernels (see ``cpcfl_tf/__init__.py``);
    ``None`` where this TensorFlow cannot say."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


def cpu_model() -> str:
    """The CPU's model name and widest vector extension: float kernels (and so the last
    bits of a run) differ between CPUs with and without AVX-512, so records say which."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), platform.machine())
    flags = next((set(line.split(":", 1)[1].split()) for line in info.splitlines()
                  if line.startswith("flags")), set())
    widest = next((f for f in ("avx512f", "avx2", "avx") if f in flags), "no avx")
    return f"{name} ({widest})"
