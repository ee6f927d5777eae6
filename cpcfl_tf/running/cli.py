"""The command line every experiment script shares: its options, how they become a
validated config and a checked output folder, and small argparse types.

:class:`cpcfl_tf.running.script.Script` builds each script's parser with :func:`experiment_parser`
and resolves the preset and output folder with :func:`setup`; scripts run through
:func:`cpcfl_tf.errors.run_cli` (bad input: one line on stderr, exit 2, nothing written).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from cpcfl_tf.errors import ArgumentParser, UserError
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.plan.overrides import parse_settings
from cpcfl_tf.plan.presets import PRESETS, get_preset
from cpcfl_tf.records.environment import set_determinism


def experiment_parser(
    name: str,
    description: str,
    *,
    folder: str = "experiments",
    default_preset: str = "paper",
    distribute: bool = True,
    runs: bool = True,
) -> ArgumentParser:
    """The options every script of ``experiments/``, ``benchmarks/`` and ``tools/`` takes
    (docs/experiments.md); ``folder`` is the script's, for its usage line. ``runs``: the
    script is made of runs, so it also takes what plans and shapes runs (``--dry-run``,
    ``--max-clients-per-step``, ``--diagnose``, ``--tensorboard``); measurements leave them
    out."""
    parser = ArgumentParser(prog=f"python {folder}/{name}.py", description=description)
    parser.add_argument(
        "--preset",
        default=default_preset,
        choices=list(PRESETS),
        help=f"paper: STL-10 on a GPU with internet; quick, standard: offline "
        f"Fashion-MNIST on a CPU; smoke: seconds, for tests (default: "
        f"{default_preset})",
    )
    parser.add_argument("--out", help=f"output folder (default: results/<preset>/{name})")
    parser.add_argument("--seed", type=int, default=0, help="seed of data and training (default 0)")
    parser.add_argument(
        "--resume", action="store_true", help="continue interrupted runs from their last checkpoint"
    )
    parser.add_argument(
        "--force", action="store_true", help="redo finished runs instead of skipping them"
    )
    if distribute:  # benchmarks time one device and leave it out
        parser.add_argument(
            "--distribute",
            default="default",
            choices=["default", "mirrored"],
            help="pre-training on one device (default) or split over all "
            "GPUs with tf.distribute.MirroredStrategy (mirrored)",
        )
        parser.add_argument(
            "--knn-every",
            type=positive_int,
            default=0,
            metavar="K",
            help="every K epochs of a pre-training done here, the encoder's "
            "weighted kNN accuracy (k=200) on the proxy: on the progress "
            "line, in its history and TensorBoard (default 0: off; the "
            "encoder's bits are the same either way)",
        )
        parser.add_argument(
            "--encoders-from",
            metavar="FILE",
            help="start every run from the encoder that "
            "experiments/encoder_selection.py selected (FILE: its "
            "encoder_selection.json) for the run's method and seed; the "
            "settings go into the record's pretrain.options",
        )
        parser.add_argument(
            "--knn-proxy",
            metavar="TRAIN,TEST",
            help="the kNN monitor's labeled proxy as DATASET:SPLIT,DATASET:SPLIT "
            "(default: the linear evaluation's, the clients' training and "
            "test splits)",
        )
    if runs:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="print the settings that differ from the preset and what each "
            "run would do (done, to resume, to run; encoders cached or to "
            "pre-train), touching nothing",
        )
        parser.add_argument(
            "--max-clients-per-step",
            type=positive_int,
            metavar="N",
            help="train at most N clients in one step: bounds memory when "
            "there are many clients; results are the same",
        )
        parser.add_argument(
            "--diagnose",
            type=positive_int,
            default=0,
            metavar="K",
            help="record the selection diagnostic: in the first K rounds the "
            "clients choose by loss, each one's loss on every pool model "
            "and its margin (docs/experiments.md); runs made now only, "
            "results the same (default 0: off)",
        )
        parser.add_argument(
            "--tensorboard",
            metavar="DIR",
            help="write TensorBoard scalars: per round of every run accuracy, "
            "ARI and cluster sizes (DIR/<script>/<run>), per epoch of every "
            "pre-training done here its loss (DIR/pretrain/<encoder>)",
        )
    parser.add_argument(
        "--set",
        action="extend",
        nargs="+",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="change a setting of the preset, e.g. --set federated.rounds=200 "
        "pretrain.epochs=50 partition.num_clients=120 (repeatable; "
        "sections data, partition, pretrain, federated; applies to "
        "every run, so a setting a script's runs set themselves, e.g. "
        "the method of a table's row, is refused: pick rows with "
        "--methods)",
    )
    parser.add_argument("--data-dir", help="tfds data dir, or the folder of the IDX files")
    parser.add_argument("--manual-dir", help="tfds manual-download folder")
    parser.add_argument(
        "--nondeterministic",
        action="store_true",
        help="on a GPU, let TensorFlow use faster kernels whose results vary "
        "from run to run (default: deterministic ops; CPU runs are "
        "deterministic either way)",
    )
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
                f"subset of {','.join(choices)}"
            )
        return names

    return parse


def settings_changed(config: Config) -> list[str]:
    """``SECTION.FIELD=VALUE`` for every setting of ``config`` that differs from its
    preset's (what ``--set`` and ``--seed`` changed)."""
    changed = [f"seed={config.seed}"] if config.seed != get_preset(config.preset).seed else []
    return changed + [
        f"{section}.{field}={getattr(getattr(config, section), field)}"
        for section, field in changed_fields(config)
    ]


def changed_fields(config: Config) -> list[tuple[str, str]]:
    """``(section, field)`` of every setting of ``config`` that differs from its preset's
    (what ``--set`` and the data folders changed; not the seed)."""
    preset = get_preset(config.preset)
    return [
        (section, f.name)
        for section in ("data", "partition", "pretrain", "federated")
        for f in dataclasses.fields(getattr(config, section))
        if getattr(getattr(config, section), f.name) != getattr(getattr(preset, section), f.name)
    ]


def resolve_config(args: argparse.Namespace) -> Config:
    """The preset with ``--set``, ``--seed`` and the data folders applied, validated (no
    file touched, TensorFlow not imported); or, where the script was given a stored run's
    config (``args.config``: ``experiments/run.py --from``), that config with the data
    folders given here."""
    given = getattr(args, "config", None)
    if given is not None:
        folders = {
            k: v for k, v in (("data_dir", args.data_dir), ("manual_dir", args.manual_dir)) if v
        }
        return given.with_overrides(data=folders) if folders else given
    settings = parse_settings(getattr(args, "set", []))
    data = settings.get("data", {})
    return get_preset(args.preset).with_overrides(
        **{
            **settings,
            "seed": args.seed,
            "data": {
                **data,
                "data_dir": args.data_dir or data.get("data_dir"),
                "manual_dir": args.manual_dir or data.get("manual_dir"),
            },
        }
    )


def setup(
    args: argparse.Namespace,
    name: str,
    *,
    check_sources: bool = True,
    context: RunContext = RunContext(),
) -> tuple[Config, Path]:
    """The validated config (:func:`resolve_config`), checked against its data
    (:func:`~cpcfl_tf.plan.resolve.check_data`) before the output folder is checked (made;
    not on a dry run of ``context``). Unless the script only lists or reports, or serves a
    stand-in (``check_sources`` False), it also checks that the clients' data, and the kNN
    monitor's proxy if ``context`` runs the monitor, can be read or fetched here
    (:func:`~cpcfl_tf.plan.resolve.check_client_sources`)."""
    from cpcfl_tf.plan.resolve import check_client_sources, check_data
    from cpcfl_tf.records.files import prepare_out_dir

    config = resolve_config(args)
    check_data(config)
    if check_sources and not (context.dry_run or getattr(args, "report", False)):
        # --knn-proxy's data only where the kNN monitor runs (--knn-every) and reads it
        check_client_sources(config, also=(context.knn_proxy or ()) if context.knn_every else ())
    out = Path(args.out or Path("results") / config.preset / name)
    if not context.dry_run:  # a dry run creates nothing
        out = prepare_out_dir(out)
        set_determinism(not args.nondeterministic)
    return config, out


def print_metrics(record: dict, keys: tuple[str, ...], digits: int = 4) -> None:
    """Print ``key: value`` lines for the keys ``record`` has (what benchmarks report)."""
    for key in keys:
        if key in record:
            print(f"{key}: {record[key]:.{digits}f}")


def proxy_splits(text: str | None) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """``--knn-proxy DATASET:SPLIT,DATASET:SPLIT`` as two (dataset, split) pairs."""
    if text is None:
        return None
    from cpcfl_tf.data.sources import get_spec, parse_split

    parts = [p.strip().partition(":") for p in text.split(",")]
    if len(parts) != 2 or not all(sep and name and split for name, sep, split in parts):
        raise UserError(
            f"--knn-proxy takes TRAIN,TEST as DATASET:SPLIT,DATASET:SPLIT, e.g. "
            f"fashion_mnist_idx:train[50000:],fashion_mnist_idx:test; got {text!r}"
        )
    for name, _, split in parts:  # the names and splits exist and hold labels
        if parse_split(name, split).base in get_spec(name).unlabeled_splits:
            raise UserError(
                f"--knn-proxy {name}:{split} has no labels; name labeled splits "
                "(the kNN monitor scores with labels)"
            )
    (train, _, train_split), (test, _, test_split) = parts
    return (train, train_split), (test, test_split)


def read_selection(path: str | Path) -> dict[int, dict[str, dict]]:
    """The choices of an ``encoder_selection.json`` (experiments/encoder_selection.py):
    pre-training seed -> method -> its selected settings."""
    from cpcfl_tf.records.files import read_json

    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"--encoders-from {path} is not a file; give the encoder_selection.json "
            "that experiments/encoder_selection.py wrote"
        )
    stored = read_json(path, fix="run experiments/encoder_selection.py again")
    if stored.get("experiment") != "encoder_selection" or "selected" not in stored:
        raise UserError(
            f"--encoders-from {path} is not an encoder selection; give the "
            "encoder_selection.json that experiments/encoder_selection.py wrote"
        )
    return {
        int(seed): {m: dict(c["settings"]) for m, c in methods.items()}
        for seed, methods in stored["selected"].items()
    }
