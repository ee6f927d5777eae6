"""The one runner every experiment script configures.

A script lists :class:`RunSpec`s (method, pre-training, overrides); :meth:`Runner.run`
runs each through the simulator and writes one JSON per run (README, "The run
record") into the script's output folder:

* a finished run (its JSON exists with the same config) is skipped, ``--force`` redoes it;
  a JSON from a *different* config is refused, so one folder never mixes settings;
* an interrupted run leaves ``.<name>.ckpt.npz``; ``--resume`` continues it to exactly
  the result of an uninterrupted run (without ``--resume`` it is refused);
* pre-trained encoders come from the shared cache (:func:`pretrained_encoder`), data
  and partitions are loaded once per (data config, seed).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from cpcfl_tf.config import SECTIONS, Config, with_defaults
from cpcfl_tf.errors import UserError
from cpcfl_tf.experiment import environment


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One row of a paper table: what to run and how it is labelled."""

    name: str
    """File stem of its JSON, e.g. ``cp-cfl-simclr``."""
    method: str
    pretraining: str
    federated: dict[str, Any] = dataclasses.field(default_factory=dict)
    partition: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int | None = None
    """Data and training seed (default: the script's ``--seed``)."""
    encoder: str | None = None
    """Encoder other than the preset's (ResNet tables)."""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Data other than the preset's (the cross-dataset tables)."""
    pretrain: dict[str, Any] = dataclasses.field(default_factory=dict)

    def config(self, base: Config) -> Config:
        config = base.with_encoder(self.encoder) if self.encoder else base
        return config.with_overrides(
            seed=base.seed if self.seed is None else self.seed,
            federated={"method": self.method, "pretraining": self.pretraining, **self.federated},
            partition=dict(self.partition), data=dict(self.data), pretrain=dict(self.pretrain))


COMPARISON = {"fedavg-none": ("fedavg", "none", "FedAvg (None)"),
              "fedavg-simclr": ("fedavg", "simclr", "FedAvg (SimCLR)"),
              "ifca-none": ("ifca", "none", "IFCA (None)"),
              "ifca-fedavg": ("ifca", "fedavg", "IFCA (FedAvg)"),
              "cp-cfl-simclr": ("cp-cfl", "simclr", "CP-CFL (SimCLR)")}
"""The five rows (run name: method, pre-training, label) the paper compares in most tables."""
COMPARISON_LABELS = {name: label for name, (_, _, label) in COMPARISON.items()}
"""Run name -> the label the paper's tables use."""


def comparison_specs(prefix: str = "", **fields: Any) -> list[RunSpec]:
    """The five :data:`COMPARISON` rows as specs named ``prefix + name``, with ``fields``
    (other :class:`RunSpec` fields) shared by all."""
    return [RunSpec(prefix + name, method, pre, **fields)
            for name, (method, pre, _) in COMPARISON.items()]


class Runner:
    """Runs :class:`RunSpec`s of one experiment into one folder."""

    def __init__(self, experiment: str, base: Config, out: Path, *, resume: bool = False,
                 force: bool = False, verbose: int = 1, distribute: str = "default"):
        from cpcfl_tf.results import prepare_out_dir

        self.experiment, self.base, self.out = experiment, base, prepare_out_dir(out)
        self.resume, self.force, self.verbose = resume, force, verbose
        self.distribute = distribute
        """How the server pre-trains (``default`` or ``mirrored``); not part of any key."""
        self._splits: dict[str, tuple] = {}
        self._partitions: dict[str, tuple] = {}
        self._fedavg: dict[str, list] = {}
        self._unlabeled: dict[str, np.ndarray] = {}

    @classmethod
    def for_script(cls, experiment: str, base: Config, out: Path, args) -> "Runner":
        """The runner of a script, set by its :func:`experiment_parser` options."""
        return cls(experiment, base, out, resume=args.resume, force=args.force,
                   distribute=args.distribute)

    # -- data ---------------------------------------------------------------
    def partition(self, config: Config):
        """``(partition, train split, test split)`` of the run (loaded and drawn once per
        data config and seed)."""
        from cpcfl_tf.federated.clients import load_client_splits, partition_for

        data_key = json.dumps(dataclasses.asdict(config.data), sort_keys=True)
        key = json.dumps([data_key, dataclasses.asdict(config.partition), config.seed])
        if key not in self._partitions:
            if data_key not in self._splits:
                self._splits[data_key] = load_client_splits(config.data)
            train, test = self._splits[data_key]
            self._partitions[key] = (partition_for(config, train, test), train, test)
        return self._partitions[key]

    def unlabeled(self, config: Config) -> np.ndarray:
        """The server's unlabeled pre-training images (loaded once per source)."""
        from cpcfl_tf.contrastive.pretrain import load_pretrain_images

        data = config.data
        key = json.dumps([data.pretrain_dataset, data.pretrain_split, data.image_size,
                          data.data_dir, data.manual_dir])
        if key not in self._unlabeled:
            self._unlabeled[key] = load_pretrain_images(config.data)
        return self._unlabeled[key]

    def clients(self, config: Config):
        """The run's clients, stacked for the simulator."""
        from cpcfl_tf.federated.clients import make_clients

        return make_clients(*self.partition(config))

    def encoder_weights(self, config: Config):
        """The starting encoder the run's pre-training names (None: random)."""
        pre = config.federated.pretraining
        if pre == "none":
            return None
        if pre == "fedavg":  # the global model of a FedAvg run on the same clients
            fedavg = config.with_overrides(federated={"method": "fedavg", "pretraining": "none"})
            key = json.dumps(_config_record(fedavg), sort_keys=True)
            if key not in self._fedavg:
                self._fedavg[key] = _load_fedavg_encoder(key)
            if self._fedavg[key] is None:
                from cpcfl_tf.federated.simulator import fedavg_encoder

                self._fedavg[key], _ = fedavg_encoder(config, self.clients(config),
                                                      verbose=self.verbose)
                _save_fedavg_encoder(key, self._fedavg[key])
            return self._fedavg[key]
        # The server pre-trains once, with the script's seed: a run's own seed
        # (trials.py) redraws the clients, not the server's encoder.
        if pre == "supervised":
            from cpcfl_tf.federated.centralized import pretrained_supervised

            return pretrained_supervised(config, seed=self.base.seed, verbose=self.verbose)
        return self.pretrained(config, pre).encoder.get_weights()

    def pretrained(self, config: Config, method: str | None = None):
        """The cached contrastive pre-training of ``config`` (method: its pre-training)."""
        from cpcfl_tf.contrastive.pretrain import pretrained_encoder

        return pretrained_encoder(config.pretrain, config.data,
                                  method=method or config.federated.pretraining,
                                  seed=self.base.seed, verbose=self.verbose,
                                  distribute=self.distribute, images=self.unlabeled(config))

    # -- runs ---------------------------------------------------------------
    def path(self, spec: RunSpec) -> Path:
        return self.out / f"{spec.name}.json"

    def run(self, spec: RunSpec, on_round: Callable[[dict, Any], None] | None = None) -> dict:
        """Run ``spec`` (or load its finished JSON) and return its record.

        ``on_round(record, state)`` is called after every round the run makes now (not for
        rounds of a finished run, nor those before a resumed checkpoint)."""
        from cpcfl_tf.federated.simulator import global_encoder, run_federated
        from cpcfl_tf.results import read_json, write_json

        config = spec.config(self.base)
        path, checkpoint = self.path(spec), self.out / f".{spec.name}.ckpt.npz"
        wanted = _config_record(config)
        if path.exists() and not self.force:
            record = read_json(path, fix="delete it to run it again, or restore it (e.g. "
                                          "git checkout)")
            if not _same_config(record, config):
                raise UserError(f"{path} holds a run with a different config; pass --force to "
                                "redo it or --out another folder")
            checkpoint.unlink(missing_ok=True)  # left if a kill came right after the result
            if self.verbose:
                print(f"{spec.name}: done before, final accuracy "
                      f"{record['final']['accuracy']:.4f} ({path})")
            return record
        if checkpoint.exists() and self.force:
            checkpoint.unlink()
        if checkpoint.exists() and not self.resume:
            raise UserError(f"{spec.name} was interrupted ({checkpoint}); pass --resume to "
                            "continue it or --force to start it over")
        if self.verbose:
            fl = config.federated
            length = (f"{fl.centralized_epochs or fl.rounds * fl.local_epochs} epochs"
                      if fl.method == "centralized" else f"{fl.rounds} rounds")
            print(f"{spec.name}: {fl.method} ({fl.pretraining}), "
                  f"{config.partition.num_clients} clients, {length}")
        if config.federated.method == "centralized":
            from cpcfl_tf.federated.centralized import run_centralized

            result, state = run_centralized(config, self.clients(config),
                                            self.encoder_weights(config)), None
        else:
            result, state = run_federated(config, self.clients(config),
                                          encoder_weights=self.encoder_weights(config),
                                          checkpoint=checkpoint, verbose=self.verbose,
                                          on_round=on_round)
        if config.federated.method == "fedavg" and config.federated.pretraining == "none":
            # IFCA (FedAvg) starts from this model's encoder: kept, also for later runs.
            key = json.dumps(wanted, sort_keys=True)
            self._fedavg[key] = global_encoder(state)
            _save_fedavg_encoder(key, self._fedavg[key])
        record = {"experiment": self.experiment, "preset": config.preset,
                  "method": config.federated.method, "pretraining": config.federated.pretraining,
                  **result, "environment": environment()}
        record["config"]["requested"] = wanted
        write_json(path, record)
        checkpoint.unlink(missing_ok=True)
        if self.verbose:
            print(f"{spec.name}: final accuracy {record['final']['accuracy']:.4f} -> {path}")
        return record


def _config_record(config: Config) -> dict:
    """The part of a config that decides a run's result (not where data is read from)."""
    record = dataclasses.asdict(config)
    record["data"] = {k: v for k, v in record["data"].items() if k not in ("data_dir", "manual_dir")}
    return json.loads(json.dumps(record))


def _fedavg_encoder_path(key: str) -> Path:
    """Where the encoder of the FedAvg (None) run with config ``key`` is cached: IFCA
    (FedAvg) starts from it, so resuming or rerunning IFCA (FedAvg) never trains FedAvg
    again."""
    import hashlib

    from cpcfl_tf.contrastive.pretrain import cache_root

    return cache_root() / "fedavg" / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz"


def _load_fedavg_encoder(key: str) -> list[np.ndarray] | None:
    from cpcfl_tf.results import read_cache_entry

    path = _fedavg_encoder_path(key)
    if not path.exists():
        return None

    def load(p: Path) -> list[np.ndarray]:
        with np.load(p) as stored:
            if str(stored["__key__"]) != key:
                raise KeyError("another FedAvg run")
            return [stored[f"w{i}"] for i in range(len(stored.files) - 1)]

    return read_cache_entry(path, load, rebuild="training FedAvg again")


def _save_fedavg_encoder(key: str, weights: list[np.ndarray]) -> None:
    from cpcfl_tf.results import write_atomic

    path = _fedavg_encoder_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)

    def save(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, __key__=np.array(key), **{f"w{i}": w for i, w in enumerate(weights)})

    write_atomic(path, save)


def _same_config(record: dict, config: Config) -> bool:
    """Whether ``record`` was run with ``config``: as requested and, for federated runs, as
    it resolved (what a method implies can change, e.g. FedAvg (SimCLR)'s Tc phase).
    Fields added to the config after the record was written count at their defaults."""
    stored = record.get("config", {})
    requested = stored.get("requested")
    if not isinstance(requested, dict) or set(requested) != set(SECTIONS) | {"preset", "seed"}:
        return False
    def filled(record: dict) -> dict:
        return {k: with_defaults(k, v) if k in SECTIONS else v for k, v in record.items()}

    if filled(requested) != filled(_config_record(config)):
        return False
    if config.federated.method == "centralized":
        return True
    ran = json.loads(json.dumps(dataclasses.asdict(config.federated.resolved())))
    return with_defaults("federated", stored.get("federated", {})) == ran


def accuracy_at(record: dict, round_: int) -> float:
    """Mean client accuracy after ``round_`` finished rounds."""
    return next(r["accuracy"] for r in record["rounds"] if r["round"] == round_)


def last_cluster_change(record: dict) -> int:
    """The round after which no client changed its cluster again (1 if none ever did)."""
    ids = [r["cluster_ids"] for r in record["rounds"]]
    return max([1] + [k + 1 for k in range(1, len(ids)) if ids[k] != ids[k - 1]])


def reporting_rounds(rounds: int) -> list[int]:
    """The paper reports T = 25/50/75/100 of 100 rounds: the quarters of the run."""
    return [int(np.ceil(rounds * q / 4)) for q in (1, 2, 3, 4)]


def mean_sd(values) -> tuple[float, float]:
    """Mean and standard deviation (ddof = 0, as the paper's trial tables compute it)."""
    values = np.asarray(values, np.float64)
    return float(values.mean()), float(values.std())


def trial_table(records: dict[str, list[dict]], labels: dict[str, str], value, *,
                percent: bool, paper: dict[str, tuple] | None = None) -> list[str]:
    """Markdown rows "label | trial 1 .. k | mean ± SD [| paper mean ± SD]" for the runs of
    each name in ``records`` (one record per trial), ``value(record) -> float``. With a
    single trial the mean ± SD column is left out (its SD would be a meaningless 0); the
    paper's column is headed "paper" alone when its figures are single runs (SD None)."""
    scale, fmt = (100.0, "{:.2f}") if percent else (1.0, "{:.4f}")
    trials = max(len(r) for r in records.values())
    summary = trials > 1
    paper_head = "" if not paper else " paper mean ± SD |" if any(
        sd is not None for _, sd in paper.values()) else " paper |"
    lines = ["| method | " + " | ".join(f"trial {k + 1}" for k in range(trials))
             + (" | mean ± SD" if summary else "") + " |" + paper_head,
             "|---|" + "---|" * (trials + summary) + ("---|" if paper else "")]
    for name, runs in records.items():
        values = [scale * value(r) for r in runs]
        row = (f"| {labels[name]} | " + " | ".join(fmt.format(v) for v in values)
               + " | " * (trials - len(values)))
        if summary:
            mean, sd = mean_sd(values)
            row += f" | {fmt.format(mean)} ± {fmt.format(sd)}"
        row += " |"
        if paper:
            mean, sd = paper[name]
            spread = f" ± {fmt.format(sd)}" if sd is not None else ""
            row += f" {fmt.format(mean)}{spread} |"
        lines.append(row)
    return lines
