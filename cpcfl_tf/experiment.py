"""What every experiment script shares: its command line, output folder and environment.

:class:`cpcfl_tf.script.Script` builds each script's parser with :func:`experiment_parser`
and resolves the preset and output folder with :func:`setup`; scripts run through
:func:`cpcfl_tf.errors.run_cli` (bad input: one line on stderr, exit 2, nothing written).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
from pathlib import Path
from typing import Any, Callable, Sequence

from cpcfl_tf.config import PRESETS, Config, get_preset, parse_settings
from cpcfl_tf.errors import ArgumentParser
from cpcfl_tf.results import weights_fingerprint


def experiment_parser(name: str, description: str, *, default_preset: str = "paper",
                      distribute: bool = True, dry_run: bool = True) -> ArgumentParser:
    """The options every experiment script takes (docs/run-record.md)."""
    parser = ArgumentParser(prog=f"python experiments/{name}.py", description=description)
    parser.add_argument("--preset", default=default_preset, choices=list(PRESETS),
                        help=f"paper: STL-10 on a GPU with internet; quick, standard: offline "
                             f"Fashion-MNIST on a CPU; smoke: seconds, for tests (default: "
                             f"{default_preset})")
    parser.add_argument("--out", help=f"output folder (default: results/<preset>/{name})")
    parser.add_argument("--seed", type=int, default=0, help="seed of data and training (default 0)")
    parser.add_argument("--resume", action="store_true",
                        help="continue interrupted runs from their last checkpoint")
    parser.add_argument("--force", action="store_true",
                        help="redo finished runs instead of skipping them")
    if distribute:  # benchmarks time one device and leave it out
        parser.add_argument("--distribute", default="default", choices=["default", "mirrored"],
                            help="pre-training on one device (default) or split over all "
                                 "GPUs with tf.distribute.MirroredStrategy (mirrored)")
    if dry_run:  # scripts made of runs; measurements have nothing to plan
        parser.add_argument("--dry-run", action="store_true",
                            help="print the settings that differ from the preset and what each "
                                 "run would do (done, to resume, to run; encoders cached or to "
                                 "pre-train), touching nothing")
    if dry_run:
        parser.add_argument("--max-clients-per-step", type=positive_int, metavar="N",
                            help="train at most N clients in one step: bounds memory when "
                                 "there are many clients; results are the same")
        parser.add_argument("--tensorboard", metavar="DIR",
                            help="write TensorBoard scalars: per round of every run accuracy, "
                                 "ARI and cluster sizes (DIR/<script>/<run>), per epoch of every "
                                 "pre-training done here its loss (DIR/pretrain/<encoder>)")
    parser.add_argument("--set", action="extend", nargs="+", default=[],
                        metavar="SECTION.FIELD=VALUE",
                        help="change a setting of the preset, e.g. --set federated.rounds=200 "
                             "pretrain.epochs=50 partition.num_clients=120 (repeatable; "
                             "sections data, partition, pretrain, federated; each run still "
                             "sets the method, pre-training and whatever its table varies)")
    parser.add_argument("--data-dir", help="tfds data dir, or the folder of the IDX files")
    parser.add_argument("--manual-dir", help="tfds manual-download folder")
    parser.add_argument("--nondeterministic", action="store_true",
                        help="on a GPU, let TensorFlow use faster kernels whose results vary "
                             "from run to run (default: deterministic ops; CPU runs are "
                             "deterministic either way)")
    return parser


def positive_int(text: str) -> int:
    """An argparse ``type``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes an integer >= 1, got {text!r}")
    return value


def name_list(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse ``type`` for ``NAME[,NAME...]`` (every script's lists are
    comma-separated), each name one of ``choices``."""
    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown) or 'empty list'}; give a comma-separated "
                f"subset of {','.join(choices)}")
        return names

    return parse


def settings_changed(config: Config) -> list[str]:
    """``SECTION.FIELD=VALUE`` for every setting of ``config`` that differs from its
    preset's (what ``--set`` and ``--seed`` changed)."""
    preset = get_preset(config.preset)
    changed = [f"seed={config.seed}"] if config.seed != preset.seed else []
    for section in ("data", "partition", "pretrain", "federated"):
        ours, theirs = getattr(config, section), getattr(preset, section)
        changed += [f"{section}.{f.name}={getattr(ours, f.name)}"
                    for f in dataclasses.fields(ours)
                    if getattr(ours, f.name) != getattr(theirs, f.name)]
    return changed


def resolve_config(args: argparse.Namespace) -> Config:
    """The preset with ``--set``, ``--seed`` and the data folders applied, validated (no
    file touched, TensorFlow not imported)."""
    settings = parse_settings(getattr(args, "set", []))
    data = settings.get("data", {})
    return get_preset(args.preset).with_overrides(**{
        **settings, "seed": args.seed,
        "data": {**data, "data_dir": args.data_dir or data.get("data_dir"),
                 "manual_dir": args.manual_dir or data.get("manual_dir")}})


def setup(args: argparse.Namespace, name: str) -> tuple[Config, Path]:
    """The validated config (:func:`resolve_config`) and the checked output folder."""
    from cpcfl_tf.results import prepare_out_dir

    config = resolve_config(args)
    out = Path(args.out or Path("results") / config.preset / name)
    if not getattr(args, "dry_run", False):  # a dry run creates nothing
        out = prepare_out_dir(out)
        set_determinism(not args.nondeterministic)
    return config, out


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


def run_environment(encoder_weights) -> dict:
    """The ``environment`` of a run record: :func:`environment` and the fingerprint of
    the weights the run started from (``None`` for random init), so two runs can be
    told to share a pre-training or not."""
    return {**environment(), "starting_encoder": weights_fingerprint(encoder_weights)}


def preloaded_allocator() -> str | None:
    """``tcmalloc`` or ``jemalloc`` when one is mapped into this process (``LD_PRELOAD``),
    ``None`` for glibc's malloc or where ``/proc`` cannot say."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    return next((name for name in ("tcmalloc", "jemalloc") if f"lib{name}" in maps), None)


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


def print_metrics(record: dict, keys: tuple[str, ...], digits: int = 4) -> None:
    """Print ``key: value`` lines for the keys ``record`` has (what benchmarks report)."""
    for key in keys:
        if key in record:
            print(f"{key}: {record[key]:.{digits}f}")


@dataclasses.dataclass(frozen=True)
class DatasetPair:
    """Pre-training data -> client data, one column of the cross-dataset tables."""

    key: str
    label: str
    paper: str
    """The paper's pair this one stands for."""
    related: bool
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Overrides of the preset's DataConfig."""
    partition: dict[str, Any] = dataclasses.field(default_factory=dict)


def _clients_from(dataset: str, train: str = "train", test: str = "test") -> dict[str, str]:
    return {"client_dataset": dataset, "client_train_split": train, "client_test_split": test}


def dataset_pairs(config: Config) -> list[DatasetPair]:
    """The pre-training -> client data pairs of tab:different_datasets for ``config``'s
    preset. ``paper`` has the paper's four; offline presets map them onto what exists
    here: a related pair (the preset's own) and an unrelated one (clothes -> digits)."""
    if config.preset == "paper":
        return [DatasetPair("stl10-stl10", "STL-10 -> STL-10", "STL-10 -> STL-10", True),
                DatasetPair("stl10-cifar10", "STL-10 -> CIFAR-10", "STL-10 -> CIFAR-10", True,
                            _clients_from("cifar10")),
                DatasetPair("stl10-mnist", "STL-10 -> MNIST", "STL-10 -> MNIST", False,
                            _clients_from("mnist")),
                DatasetPair("emnist-mnist", "EMNIST -> MNIST", "EMNIST -> MNIST", True,
                            {"pretrain_dataset": "emnist", "pretrain_split": "train",
                             **_clients_from("mnist")})]
    if config.preset == "smoke":
        return [DatasetPair("digits-digits", "digits -> digits", "STL-10 -> STL-10", True),
                DatasetPair("digits-fmnist", "digits -> Fashion-MNIST", "STL-10 -> MNIST",
                            False, _clients_from("fashion_mnist_idx", "train[50000:]"))]
    # digits has 1,297 training and 500 test images: at most 15 clients of 50 fit, with
    # 20 local test images each (test_fraction 0.4).
    return [DatasetPair("fmnist-fmnist", "Fashion-MNIST -> Fashion-MNIST", "STL-10 -> STL-10",
                        True),
            DatasetPair("fmnist-digits", "Fashion-MNIST -> digits", "STL-10 -> MNIST", False,
                        _clients_from("digits"),
                        {"num_clients": min(15, config.partition.num_clients),
                         "test_fraction": 0.4})]
