"""The one runner every experiment script configures.

A script lists :class:`RunSpec`s (method, pre-training, overrides); :meth:`Runner.run`
runs each through the simulator and writes one JSON per run (docs/run-record.md) into the
script's output folder:

* a finished run (its JSON exists with the same config) is skipped, ``--force`` redoes it;
  a JSON from a *different* config is refused, so one folder never mixes settings;
* an interrupted run leaves ``.<name>.ckpt.npz``; ``--resume`` continues it to exactly
  the result of an uninterrupted run (without ``--resume`` it is refused);
* starting encoders come from :mod:`cpcfl_tf.federated.starting` (one cache for all
  scripts); data and partitions are loaded once per (data config, seed).
"""
from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from cpcfl_tf.config import Config, config_record
from cpcfl_tf.environment import environment, reproduces, run_environment
from cpcfl_tf.errors import UserError
from cpcfl_tf.federated.starting import StartingEncoders
from cpcfl_tf.judge import Found, RecordIndex
from cpcfl_tf.methods import FEDAVG_ENCODER_RUN, METHODS, plugins_used
from cpcfl_tf.record import RunRecord, read_record, write_record
from cpcfl_tf.results import weights_fingerprint
from cpcfl_tf.ssl_methods import SSL_METHODS


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
    row: str | None = None
    """The table row it belongs to when several runs share one (e.g. ``cp-cfl-simclr`` for
    every trial's CP-CFL run); default: its name."""

    @property
    def key(self) -> str:
        return self.row or self.name

    def config(self, base: Config) -> Config:
        config = base.with_encoder(self.encoder) if self.encoder else base
        return config.with_overrides(
            seed=base.seed if self.seed is None else self.seed,
            federated={"method": self.method, "pretraining": self.pretraining, **self.federated},
            partition=dict(self.partition), data=dict(self.data), pretrain=dict(self.pretrain))


def _proxy_splits(text: str | None) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """``--knn-proxy DATASET:SPLIT,DATASET:SPLIT`` as two (dataset, split) pairs."""
    if text is None:
        return None
    parts = [p.strip().partition(":") for p in text.split(",")]
    if len(parts) != 2 or not all(sep and name and split for name, sep, split in parts):
        raise UserError(f"--knn-proxy takes TRAIN,TEST as DATASET:SPLIT,DATASET:SPLIT, e.g. "
                        f"fashion_mnist_idx:train[50000:],fashion_mnist_idx:test; got {text!r}")
    return tuple((name, split) for name, _, split in parts)


def read_selection(path: str | Path) -> dict[int, dict[str, dict]]:
    """The choices of an ``encoder_selection.json`` (experiments/encoder_selection.py):
    pre-training seed -> method -> its selected settings."""
    from cpcfl_tf.results import read_json

    path = Path(path)
    if not path.is_file():
        raise UserError(f"--encoders-from {path} is not a file; give the encoder_selection.json "
                        "that experiments/encoder_selection.py wrote")
    stored = read_json(path, fix="run experiments/encoder_selection.py again")
    if stored.get("experiment") != "encoder_selection" or "selected" not in stored:
        raise UserError(f"--encoders-from {path} is not an encoder selection; give the "
                        "encoder_selection.json that experiments/encoder_selection.py wrote")
    return {int(seed): {m: dict(c["settings"]) for m, c in methods.items()}
            for seed, methods in stored["selected"].items()}


class Runner:
    """Runs :class:`RunSpec`s of one experiment into one folder."""

    def __init__(self, experiment: str, base: Config, out: Path, *, resume: bool = False,
                 force: bool = False, verbose: int = 1, distribute: str = "default",
                 dry_run: bool = False, tensorboard: str | Path | None = None,
                 max_clients: int | None = None, diagnose: int = 0, knn_every: int = 0,
                 knn_proxy: str | None = None, selection: str | Path | None = None):
        from cpcfl_tf.results import CACHE_FIX, cache_root, prepare_out_dir

        self.experiment, self.base = experiment, base
        self.out = Path(out) if dry_run else prepare_out_dir(out)
        if not dry_run:  # every folder a run writes, checked before any data is read
            prepare_out_dir(cache_root(), fix=CACHE_FIX)
            if tensorboard:
                prepare_out_dir(tensorboard, fix="pass --tensorboard DIR with a writable "
                                "folder")
        self.resume, self.force, self.verbose = resume, force, verbose
        self.distribute = distribute
        """How the server pre-trains (``default`` or ``mirrored``); not part of any key."""
        self._splits: dict[str, tuple] = {}
        self._partitions: dict[str, tuple] = {}
        self._unlabeled: dict[str, np.ndarray] = {}
        self.knn_every, self.knn_proxy = knn_every, _proxy_splits(knn_proxy)
        """The kNN monitor of the pre-trainings done here: every this many epochs (0:
        off), on these ``(dataset, split)`` pairs (None: the linear evaluation's)."""
        self.selection = read_selection(selection) if selection else None
        """seed -> self-supervised method -> the settings ``--encoders-from`` starts its
        runs' encoders with (None: the config's)."""
        self.encoders = StartingEncoders(clients=self.clients,
                                         unlabeled=self.unlabeled, verbose=verbose,
                                         distribute=distribute, tensorboard=tensorboard,
                                         knn=self.knn_monitor if knn_every else None,
                                         client_unlabeled=self.client_unlabeled)
        """The runs' starting encoders, each built once (pre-trained with the run's seed)."""
        self.tensorboard = tensorboard
        """Folder of TensorBoard scalars (None: none written)."""
        self.max_clients = max_clients
        """At most this many clients per training step (None: all); not part of any key,
        as the result is the same."""
        self.diagnose = diagnose
        """Rounds of the selection diagnostic in the runs made now (0: none); not part of
        any key, as the result is the same (:mod:`cpcfl_tf.federated.diagnostics`)."""
        self.records: list[RunRecord] = []
        """Every record :meth:`run` returned, in order: what the script's report shows."""
        self.reuse: RecordIndex | None = None
        """Records made elsewhere (e.g. by other scripts of the results tree): a run this
        machine would make bit for bit the same (same config, starting encoder and
        :data:`~cpcfl_tf.environment.REPRODUCING` fields) is taken from there instead of
        being run again, and not copied."""
        self.reused: dict[str, Path] = {}
        """Run name -> the record taken from :attr:`reuse` for it."""
        self.paired: set[str] = set()
        """Of :attr:`reused`, runs of a method with a base method taken because they start
        from the encoder the folder's base run started from (:meth:`_twin_of_base`)."""
        self.named: set[str] = set()
        """Of :attr:`reused`, the runs taken (by :meth:`run` or a report's
        :meth:`finished`) because the folder's ``taken.json`` names them (:attr:`TAKEN`),
        not because this machine would make them bit for bit."""
        self.stood_in: dict[str, tuple[str, Path]] = {}
        """Run name -> its method and the record taken for it: the run of the method its
        method is until its restart rule fires (:attr:`~cpcfl_tf.methods.Method.restarts_of`),
        in which the rule never fired (:meth:`_unrestarted`)."""

    @staticmethod
    def check_options(args) -> None:
        """Refuse, in one line, a bad value of the options :meth:`for_script` reads
        (``--knn-proxy``, ``--encoders-from``) before a script does any work: the runner
        itself is built when a script first needs it."""
        _proxy_splits(getattr(args, "knn_proxy", None))
        if getattr(args, "encoders_from", None):
            read_selection(args.encoders_from)

    @classmethod
    def for_script(cls, experiment: str, base: Config, out: Path, args) -> "Runner":
        """The runner of a script, set by its :func:`experiment_parser` options."""
        return cls(experiment, base, out, resume=args.resume, force=args.force,
                   distribute=getattr(args, "distribute", "default"),
                   dry_run=getattr(args, "dry_run", False),
                   tensorboard=getattr(args, "tensorboard", None),
                   max_clients=getattr(args, "max_clients_per_step", None),
                   diagnose=getattr(args, "diagnose", 0),
                   knn_every=getattr(args, "knn_every", 0),
                   knn_proxy=getattr(args, "knn_proxy", None),
                   selection=getattr(args, "encoders_from", None))

    def config_of(self, spec: RunSpec) -> Config:
        """``spec``'s config on this runner's base, its starting encoder the one
        ``--encoders-from`` selected for its method and pre-training seed (the settings go
        into ``pretrain.options``, so the run record names them)."""
        config = spec.config(self.base)
        method = config.federated.pretraining
        if self.selection is None or method not in SSL_METHODS:
            return config
        chosen = self.selection.get(config.pretrain_seed, {})
        if method not in chosen:
            raise UserError(f"--encoders-from selected no {method} encoder for seed "
                            f"{config.pretrain_seed}; run experiments/encoder_selection.py "
                            f"with that seed and method, or leave the option out")
        return config.with_overrides(pretrain={"options": {
            **(config.pretrain.options or {}), method: chosen[method]}})

    # -- data ---------------------------------------------------------------
    def client_splits(self, data) -> tuple:
        """The clients' labeled training and test splits ``data`` names (loaded once per
        data config): what the partition draws from and the linear evaluation's proxy."""
        from cpcfl_tf.federated.clients import load_client_splits

        data_key = json.dumps(dataclasses.asdict(data), sort_keys=True)
        if data_key not in self._splits:
            self._splits[data_key] = load_client_splits(data)
        return self._splits[data_key]

    def partition(self, config: Config):
        """``(partition, train split, test split)`` of the run (loaded and drawn once per
        data config and seed)."""
        from cpcfl_tf.federated.clients import labeled_partition, partition_for

        key = json.dumps([dataclasses.asdict(config.data), labeled_partition(config),
                          config.seed], sort_keys=True)
        if key not in self._partitions:
            train, test = self.client_splits(config.data)
            self._partitions[key] = (partition_for(config, train, test), train, test)
        return self._partitions[key]

    def knn_monitor(self, config: Config):
        """The kNN monitor of ``config``'s pre-training: its labeled proxy is the linear
        evaluation's (the clients' training and test splits: the paper's proxy) unless
        ``--knn-proxy`` names others. The labels go to the monitor only."""
        from cpcfl_tf.contrastive.knn import KnnMonitor
        from cpcfl_tf.data import load_labeled

        data = config.data
        if self.knn_proxy is None:
            train, test = self.client_splits(data)
        else:
            train, test = (load_labeled(name, split, image_size=data.image_size,
                                        data_dir=data.data_dir, manual_dir=data.manual_dir)
                           for name, split in self.knn_proxy)
        return KnnMonitor(train, test, every=self.knn_every)

    def unlabeled(self, config: Config) -> np.ndarray:
        """The server's unlabeled pre-training images (loaded once per source)."""
        from cpcfl_tf.contrastive.pretrain import load_pretrain_images

        data = config.data
        key = json.dumps([data.pretrain_dataset, data.pretrain_split, data.image_size,
                          data.data_dir, data.manual_dir])
        if key not in self._unlabeled:
            self._unlabeled[key] = load_pretrain_images(config.data)
        return self._unlabeled[key]

    def client_unlabeled(self, config: Config) -> list[np.ndarray]:
        """Each client's unlabeled images (``partition.unlabeled``): the pre-training
        split dealt over the run's partition (for the groups deal by its labels, which go
        no further)."""
        from cpcfl_tf.data import load_labeled
        from cpcfl_tf.federated.clients import client_unlabeled

        partition, train, _ = self.partition(config)
        data = config.data
        if config.partition.unlabeled == "groups":
            pretrain = load_labeled(data.pretrain_dataset, data.pretrain_split,
                                    image_size=data.image_size, data_dir=data.data_dir,
                                    manual_dir=data.manual_dir)
        else:
            pretrain = self.unlabeled(config)
        return client_unlabeled(config, partition, train, pretrain)

    def clients(self, config: Config):
        """The run's clients, stacked for the simulator."""
        from cpcfl_tf.federated.clients import make_clients

        return make_clients(*self.partition(config))

    # -- runs ---------------------------------------------------------------
    def path(self, spec: RunSpec) -> Path:
        return self.out / f"{spec.name}.json"

    def checkpoint(self, spec: RunSpec) -> Path:
        """Where an unfinished run of ``spec`` keeps its last round."""
        return self.out / f".{spec.name}.ckpt.npz"

    def _scalars(self, spec: RunSpec, config: Config, clients, on_round):
        """``on_round`` that also logs the round to TensorBoard (when a folder is set)."""
        if not self.tensorboard:
            return on_round
        from cpcfl_tf.scalars import ScalarLog

        log = ScalarLog(Path(self.tensorboard) / self.experiment / spec.name)

        def logged(record: dict, state) -> None:
            log.write(record["round"], _round_scalars(record, clients.groups,
                                                      len(state.models)))
            if on_round:
                on_round(record, state)

        return logged

    def _decide(self, spec: RunSpec) -> tuple[str, RunRecord | None]:
        """The one skip / resume / refuse decision: ``("done", record)``, ``("resume",
        None)`` or ``("run", None)``; a one-line :class:`UserError` when the run must not
        go ahead (another config in its place, an interruption without ``--resume``, a
        damaged record). Reads, never writes."""
        config = self.config_of(spec)
        path, checkpoint = self.path(spec), self.checkpoint(spec)
        if path.exists() and not self.force:
            record = read_record(path)
            if not _same_config(record, config):
                raise UserError(f"{path} holds a run with a different config; pass --force to "
                                "redo it or --out another folder")
            return "done", record
        if checkpoint.exists() and not self.force:
            if not self.resume:
                raise UserError(f"{spec.name} was interrupted ({checkpoint}); pass --resume to "
                                "continue it or --force to start it over")
            return "resume", None
        return "run", None

    TAKEN = "taken.json"
    """The file in the output folder naming, per run, the record taken for it from
    :attr:`reuse` (:meth:`keep_taken`, called with the report:
    :meth:`~cpcfl_tf.script.Session.finish`)."""

    def finished(self, spec: RunSpec) -> RunRecord | None:
        """``spec``'s finished record in the output folder, or the one :meth:`run` would
        take from :attr:`reuse` (when its starting encoder needs no training: cached, or
        random), or else the one the folder's :attr:`TAKEN` names, so that a report reads
        the same runs on any machine and without the encoders cached; None where there is
        none (not run yet, or only begun); a one-line error for a record of another config.
        Reads, never writes."""
        action, record = self._decide(spec)
        if action != "run":
            return record if action == "done" else None
        unrestarted = self._unrestarted(spec)
        if unrestarted is not None:
            return self._stand_in(spec, unrestarted)
        twin = self._twin_of_base(spec)
        if twin is not None:
            return twin.record
        config = self.config_of(spec)
        candidates = self._candidates(spec)
        taken = (self._taken(spec, self.encoders(config), candidates)
                 if candidates and self.encoders.ready(config) else None)
        return taken if taken is not None else self._named(spec)

    @functools.cached_property
    def _taken_file(self) -> dict[str, str]:
        """The folder's :attr:`TAKEN` as it was when first read (empty if there is none);
        a one-line error if it is damaged."""
        from cpcfl_tf.results import read_file

        def load(path: Path) -> dict[str, str]:
            taken = json.loads(path.read_text())
            if not isinstance(taken, dict):
                raise ValueError("not a map of run names to records")
            return taken

        path = self.out / self.TAKEN
        return (read_file(path, load, fix="restore it (git checkout) or delete it")
                if path.exists() else {})

    def keep_taken(self) -> None:
        """Add the runs taken from :attr:`reuse` to the folder's :attr:`TAKEN`, so that a
        report elsewhere (:meth:`finished`) finds them."""
        from cpcfl_tf.results import write_json

        merged = {**self._taken_file, **{name: str(p) for name, p in self.reused.items()}}
        if merged != self._taken_file:
            write_json(self.out / self.TAKEN, dict(sorted(merged.items())))
            self._taken_file = merged

    def _named(self, spec: RunSpec) -> RunRecord | None:
        """The record the folder's :attr:`TAKEN` names for ``spec`` (noted in
        :attr:`reused` and :attr:`named`), if it is there and holds ``spec``'s config."""
        if self.force:
            return None
        path = self._taken_file.get(spec.name)
        if not path or not Path(path).is_file():
            return None
        record = read_record(Path(path))
        if not _same_config(record, self.config_of(spec)):
            return None
        self.reused[spec.name] = Path(path)
        # a restart variant's run named there was taken as its base run's (_twin_of_base)
        (self.paired if base_config(record.requested) else self.named).add(spec.name)
        return record

    @functools.cached_property
    def _folder(self) -> RecordIndex:
        """The records of the output folder, by config (kept current by :meth:`run`)."""
        return RecordIndex(self.out)

    def _unrestarted(self, spec: RunSpec) -> Found | None:
        """For a method with :attr:`~cpcfl_tf.methods.Method.restarts_of`: that method's
        finished run of ``spec``'s config (in the output folder, or taken from
        :attr:`reuse` by this runner) if its restart rule would never have fired in it; then
        ``spec``'s run is that run, bit for bit. None otherwise."""
        config = self.config_of(spec)
        base = base_config(config)
        if base is None or self.force:
            return None
        taken = [] if self.reuse is None else [f for f in self.reuse.every(base)
                                                if f.path in self.reused.values()]
        found = next((f for f in [*self._folder.every(base), *taken]
                      if _same_config(f.record, base)), None)
        return found if found is not None and stands_in(found.record, config) else None

    def _twin_of_base(self, spec: RunSpec) -> Found | None:
        """For a method with a base method whose run of ``spec``'s config is in the output
        folder (and fires the restart rule): a record of ``spec``'s config in
        :attr:`reuse` that starts from that run's encoder, from any machine, noted in
        :attr:`reused`. It is the restart run of the base run's sample of chance (the
        reliability study's runs 0-4 are the trials' configs: its CP-CFL+restart run of
        seed 2 is trial 3's). None otherwise."""
        config = self.config_of(spec)
        base = base_config(config)
        if base is None or self.reuse is None or self.force:
            return None
        made = next((f for f in self._folder.every(base) if _same_config(f.record, base)), None)
        encoder = made and made.record.environment.get("starting_encoder")
        found = next((f for f in self.reuse.every(config) if encoder
                      and f.record.environment.get("starting_encoder") == encoder
                      and _same_config(f.record, config)), None)
        if found is not None:
            self.reused[spec.name] = found.path
            self.paired.add(spec.name)
        return found

    def _taken_elsewhere(self, spec: RunSpec) -> RunRecord | None:
        """The record taken for ``spec`` that this machine does not make (its path noted
        in :attr:`reused`): its base run's restart twin (:meth:`_twin_of_base`), or the
        one the folder's :attr:`TAKEN` names (:meth:`_named`); None where there is
        neither."""
        twin = self._twin_of_base(spec)
        return twin.record if twin is not None else self._named(spec)

    def _base_to_make(self, spec: RunSpec) -> bool:
        """Whether ``spec``'s method has a base method (:func:`base_config`) whose run of
        the same config this runner has not got (in its folder, or taken): made first, it
        decides whether ``spec`` is run at all."""
        base = base_config(self.config_of(spec))
        if base is None or self.force:
            return False
        taken = [] if self.reuse is None else self.reuse.every(base)
        return not any(_same_config(f.record, base) for f in [*self._folder.every(base), *taken])

    def _stand_in(self, spec: RunSpec, found: Found) -> RunRecord:
        self.stood_in[spec.name] = (self.config_of(spec).federated.method, found.path)
        return found.record

    def _taken(self, spec: RunSpec, encoder, candidates: list[Found]) -> RunRecord | None:
        """The record among ``candidates`` (:meth:`_candidates`) that starts from
        ``encoder``, so that this machine would make it bit for bit for ``spec`` (same
        config, machine kind and starting encoder), noted in :attr:`reused`; None if there
        is none."""
        if not candidates:
            return None
        starting = weights_fingerprint(encoder)
        found = next((f for f in candidates
                      if f.record.environment.get("starting_encoder") == starting), None)
        if found is None:
            return None
        self.reused[spec.name] = found.path
        return found.record

    def status(self, spec: RunSpec) -> str:
        """What :meth:`run` would do with ``spec`` now (:meth:`planned`). Reads, never
        writes."""
        return self.planned(spec)[0]

    def planned(self, spec: RunSpec) -> tuple[str, str | None]:
        """What :meth:`run` would do with ``spec`` now: ``done``, ``to resume``, ``to run``,
        ``found: <path>``, its base method's run, or ``stops: <why>``; and where the
        starting encoder it needs would come from
        (:meth:`~cpcfl_tf.federated.starting.StartingEncoders.status`), None where it needs
        none (done, stops, or its base method's run). Reads, never writes."""
        try:
            action, _ = self._decide(spec)
        except UserError as err:
            return f"stops: {err}", None
        if action == "done":
            return "done", None
        unrestarted = self._unrestarted(spec) if action == "run" else None
        if unrestarted is not None:
            return f"its restart rule never fires in {unrestarted.path}: that run", None
        twin = self._twin_of_base(spec) if action == "run" else None
        if twin is not None:
            return f"found: {twin.path} (from its base method's run's encoder)", None
        if action == "run" and self._base_to_make(spec):
            return ("to run if its restart rule fires in its base method's run (made "
                    "first; else that run)"), self.encoders.status(self.config_of(spec))
        candidates = self._candidates(spec) if action == "run" else []
        status = (f"found: {candidates[0].path}" if candidates
                  else {"resume": "to resume", "run": "to run"}[action])
        return status, self.encoders.status(self.config_of(spec))

    def _candidates(self, spec: RunSpec) -> list[Found]:
        """Records of ``spec``'s config in :attr:`reuse` that this machine would make bit
        for bit, if their starting encoder is the one it starts from (checked in
        :meth:`run`)."""
        if self.reuse is None or self.force:
            return []
        config = self.config_of(spec)
        return [f for f in self.reuse.every(config) if f.path != self.path(spec)
                and reproduces(f.record.environment, self._here) and _same_config(f.record, config)]

    @functools.cached_property
    def _here(self) -> dict:
        """This machine's :func:`environment`, read once (a process's does not change)."""
        return environment()

    def run(self, spec: RunSpec, on_round: Callable[[dict, Any], None] | None = None
            ) -> RunRecord:
        """Run ``spec`` (or load its finished record) and return its record.

        ``on_round(round_record, state)`` is called after every round the run makes now
        (not for rounds of a finished run, nor those before a resumed checkpoint)."""
        from cpcfl_tf.federated.simulator import run_federated
        from cpcfl_tf.federated.starting import pool_encoder

        config = self.config_of(spec)
        path, checkpoint = self.path(spec), self.checkpoint(spec)
        action, record = self._decide(spec)
        if action == "done":
            checkpoint.unlink(missing_ok=True)  # left if a kill came right after the result
            if self.verbose:
                print(f"{spec.name}: done before, final accuracy "
                      f"{record.final.accuracy:.4f} ({path})")
            self.records.append(record)
            return record
        unrestarted = self._unrestarted(spec) if action == "run" else None
        if unrestarted is not None:
            if self.verbose:
                print(f"{spec.name}: its restart rule never fires in {unrestarted.path}, so it "
                      f"is that run, final accuracy {unrestarted.record.final.accuracy:.4f}")
            self.records.append(unrestarted.record)
            return self._stand_in(spec, unrestarted)
        taken = self._taken_elsewhere(spec) if action == "run" else None
        if taken is not None:
            if self.verbose:
                why = ("it starts from its base method's run's encoder"
                       if spec.name in self.paired else "the folder's taken.json names it")
                print(f"{spec.name}: the run of {self.reused[spec.name]} ({why}), final "
                      f"accuracy {taken.final.accuracy:.4f}")
            self.records.append(taken)
            return taken
        if action == "run":  # with --force, an old checkpoint starts over
            checkpoint.unlink(missing_ok=True)
        if self.verbose:
            fl = config.federated
            length = (f"{fl.rounds} rounds" if METHODS[fl.method].federated
                      else f"{fl.centralized_epochs or fl.rounds * fl.local_epochs} epochs")
            print(f"{spec.name}: {fl.method} ({fl.pretraining}), "
                  f"{config.partition.num_clients} clients, {length}")
        encoder = self.encoders(config)
        found = (self._taken(spec, encoder, self._candidates(spec)) if action == "run"
                 else None)
        if found is not None:
            if self.verbose:
                print(f"{spec.name}: the same run as {self.reused[spec.name]} (same config, "
                      f"machine kind and starting encoder), final accuracy "
                      f"{found.final.accuracy:.4f}")
            self.records.append(found)
            return found
        if not METHODS[config.federated.method].federated:
            from cpcfl_tf.federated.centralized import run_centralized

            record = run_centralized(config, self.clients(config), encoder)
        else:
            clients = self.clients(config)
            record, state = run_federated(config, clients, encoder_weights=encoder,
                                          checkpoint=checkpoint, verbose=self.verbose,
                                          on_round=self._scalars(spec, config, clients, on_round),
                                          max_clients=self.max_clients,
                                          diagnose=self.diagnose)
            if (config.federated.method, config.federated.pretraining) == FEDAVG_ENCODER_RUN:
                # IFCA (FedAvg) starts from this model's encoder: kept, also for later runs.
                self.encoders.keep_fedavg(config, pool_encoder(state))
        record = dataclasses.replace(record, experiment=self.experiment,
                                     environment=run_environment(encoder, plugins_used(
                                         config.federated.method,
                                         config.federated.pretraining)))
        write_record(path, record)
        if self.reuse is not None:
            self.reuse.add(path, record)
        if "_folder" in self.__dict__:
            self._folder.add(path, record)
        checkpoint.unlink(missing_ok=True)
        if self.verbose:
            print(f"{spec.name}: final accuracy {record.final.accuracy:.4f} -> {path}")
        self.records.append(record)
        return record


def _round_scalars(record: dict, groups: np.ndarray, num_clusters: int) -> dict[str, float]:
    """What TensorBoard shows of a round: accuracy, ARI, and each cluster's size."""
    from cpcfl_tf.federated.algorithm import cluster_sizes
    from cpcfl_tf.federated.metrics import cluster_ari

    ids = np.asarray(record["cluster_ids"])
    sizes = cluster_sizes(ids, num_clusters)
    return {"accuracy": record["accuracy"], "ari": cluster_ari(groups, ids),
            **{f"cluster_size/{n}": int(c) for n, c in enumerate(sizes)}}


def base_config(config: Config) -> Config | None:
    """The config of the run ``config``'s run is until its restart rule fires (its
    method's :attr:`~cpcfl_tf.methods.Method.restarts_of`); None for other methods."""
    base = METHODS[config.federated.method].restarts_of
    return config.with_overrides(federated={"method": base}) if base else None


def stands_in(record: RunRecord, config: Config) -> bool:
    """Whether ``record`` is the run of ``config`` bit for bit: a run of its base config
    (:func:`base_config`) in which ``config``'s restart rule never fires (attempt 0 draws
    what the base draws). A property of the record, whatever machine made it."""
    from cpcfl_tf.federated.algorithm import would_restart

    base = base_config(config)
    return (base is not None and _same_config(record, base)
            and not would_restart(config.resolved().federated,
                                  [r.cluster_ids for r in record.rounds]))


def _same_config(record: RunRecord, config: Config) -> bool:
    """Whether ``record`` was run with ``config``: as requested and, for federated runs, as
    it resolved (what a method implies can change, e.g. FedAvg (SimCLR)'s Tc phase)."""
    if config_record(record.requested) != config_record(config):
        return False
    return (not METHODS[config.federated.method].federated
            or record.config.federated == config.resolved().federated)
