"""The machine and software a result came from, and the one switch of TensorFlow's
behaviour the kit sets per process (op determinism on a GPU).

Every run record's ``environment`` comes from :func:`run_environment`: versions, device,
CPU kind (AVX-512 or not decides the last bits of a run), the CPU's identity within that
kind and the BLAS kernels numpy picked for it (two VMs that both say "AMD EPYC
(avx512f)" gave other bits downstream: their OpenBLAS took other kernels) and the
fingerprint of the starting encoder, so two records can be told to share a machine and
a pre-training.
"""

from __future__ import annotations

import hashlib
import os
import platform
from pathlib import Path

from cpcfl_tf.records.files import weights_fingerprint

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
    return {
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "device": device,
        "cpu": cpu_model(),
        "cpu_id": cpu_id(),
        "blas": blas_kernels(),
        "onednn": onednn_enabled(),
        "python": platform.python_version(),
        "deterministic_ops": _DETERMINISTIC_OPS,
    }


REPRODUCING = (
    "tensorflow",
    "keras",
    "device",
    "cpu",
    "cpu_id",
    "blas",
    "onednn",
    "deterministic_ops",
)
"""The fields of :func:`environment` a run's last bits depend on besides its config and
starting encoder: where all of them are the same, the run comes out bit for bit the same
(docs/experiments.md, "Bit for bit")."""


def reproduces(recorded: dict, here: dict | None = None) -> bool:
    """Whether this machine (``here``, default :func:`environment`) would make the run
    whose record has environment ``recorded`` bit for bit, given its config and starting
    encoder. Records without a field (older ones) never do."""
    here = environment() if here is None else here
    return all(k in recorded and recorded[k] == here.get(k) for k in REPRODUCING)


def machine(recorded: dict) -> str | None:
    """The machine a record ran on, as far as it says: its CPU kind, and its CPU's
    identity where recorded (records before ``cpu_id`` existed are told apart by kind
    only). Runs are one sample of chance only if they share this."""
    cpu, ident = recorded.get("cpu"), recorded.get("cpu_id")
    return None if cpu is None else (f"{cpu} [{ident}]" if ident else cpu)


def run_environment(encoder_weights, plugins: dict[str, str] | None = None) -> dict:
    """The ``environment`` of a run record: :func:`environment` and the fingerprint of
    the weights the run started from (``None`` for random init), so two runs can be
    told to share a pre-training or not; and, for a run that uses entries of installed
    plugins, which (``plugins``: ``"kind name" -> "package version"``)."""
    return {
        **environment(),
        "starting_encoder": weights_fingerprint(encoder_weights),
        **({"plugins": dict(plugins)} if plugins else {}),
    }


def onednn_enabled() -> bool | None:
    """Whether TensorFlow runs its oneDNN CPU kernels (see ``cpcfl_tf/__init__.py``);
    ``None`` where this TensorFlow cannot say."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


def _first_cpu() -> dict[str, str] | None:
    """The first CPU's fields in Linux's ``/proc/cpuinfo`` (None where it is not there)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_model() -> str:
    """The CPU's model name and widest vector extension: float kernels (and so the last
    bits of a run) differ between CPUs with and without AVX-512, so records say which."""
    fields = _first_cpu()
    if fields is None:
        return platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    widest = next((f for f in ("avx512f", "avx2", "avx") if f in flags), "no avx")
    return f"{fields.get('model name', platform.machine())} ({widest})"


def cpu_id() -> str | None:
    """What tells two CPUs of one :func:`cpu_model` apart: family, model and stepping,
    the cache sizes (oneDNN blocks its kernels by them) and a hash of every feature flag.
    Two AVX-512 EPYC VMs, both "AMD EPYC (avx512f)", pre-trained the same encoder bit for
    bit but trained other bits from it (docs/experiments.md, "Bit for bit"). ``None``
    where Linux's ``/proc/cpuinfo`` is not there to ask."""
    fields = _first_cpu()
    if fields is None:
        return None
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        letter = {"Data": "d", "Instruction": "i"}.get(kind, "")
        caches.append(f"L{level}{letter} {size}")
    flags = hashlib.sha256(" ".join(sorted(fields.get("flags", "").split())).encode())
    return (
        f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')} "
        f"stepping {fields.get('stepping', '?')}; {', '.join(caches) or 'caches unknown'}; "
        f"flags {flags.hexdigest()[:8]}"
    )


def blas_kernels() -> str | None:
    """The BLAS library numpy calls and the kernel set it picked for this CPU (OpenBLAS
    picks by CPU model, ``OPENBLAS_CORETYPE`` overrides it). The server's weighted
    average is a float64 matrix-vector product there, so the kernel set decides its last
    bits: an AVX-512 EPYC whose OpenBLAS took its Haswell kernels trained other bits than
    the committed records' SkylakeX kernels, and the same bits with
    ``OPENBLAS_CORETYPE=SkylakeX`` (docs/experiments.md, "Bit for bit"). ``None`` where
    threadpoolctl cannot say."""
    import numpy  # noqa: F401  (loads numpy's BLAS, which threadpoolctl then finds)

    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return None
    info = next((i for i in blas if "numpy" in str(i.get("filepath", ""))), blas[0])
    return " ".join(
        str(x)
        for x in (info.get("internal_api"), info.get("version"), info.get("architecture"))
        if x
    )
