"""The one runner every experiment script configures.

A script lists :class:`RunSpec`s (method, pre-training, overrides); :meth:`Runner.run`
runs each through the simulator and writes one JSON per run (docs/run-record.md) into the
script's output folder:

* a finished run (its JSON exists with the same config) is skipped, ``--force`` redoes it;
  a JSON from a *different* config is refused, so one folder never mixes settings;
* an interrupted run leaves ``.<name>.ckpt.npz``; ``--resume`` continues it to exactly
  the result of an uninterrupted run (without ``--resume`` it is refused);
* starting encoders come from :mod:`cpcfl_tf.clustered.starting` (one cache for all
  scripts); data and partitions are loaded once per (data config, seed)
  (:class:`~cpcfl_tf.running.run_data.DataCache`); records found elsewhere in the tree come from
  :class:`~cpcfl_tf.records.store.RecordStore`.

Each run is decided once (:meth:`Runner.decide`: :mod:`cpcfl_tf.running.taking`), then done.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cpcfl_tf.clustered.starting import StartingEncoders
from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.federated import plugins_used
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.plan.presets import with_encoder
from cpcfl_tf.plan.resolve import RunPlan, data_key, resolve
from cpcfl_tf.records.environment import run_environment
from cpcfl_tf.records.files import weights_fingerprint
from cpcfl_tf.records.record import RunRecord, write_record
from cpcfl_tf.records.store import Found, RecordStore
from cpcfl_tf.running.run_data import DataCache
from cpcfl_tf.running.taking import Decision, RunDecision, Taking


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

    def seed_or(self, default: int) -> int:
        """Its seed: :attr:`seed`, or ``default`` (the script's ``--seed``) when unset."""
        return default if self.seed is None else self.seed

    def config(self, base: Config) -> Config:
        config = with_encoder(base, self.encoder) if self.encoder else base
        return config.with_overrides(
            seed=self.seed_or(base.seed),
            federated={"method": self.method, "pretraining": self.pretraining, **self.federated},
            partition=dict(self.partition),
            data=dict(self.data),
            pretrain=dict(self.pretrain),
        )


class Runner:
    """Runs :class:`RunSpec`s of one experiment into one folder."""

    def __init__(
        self, experiment: str, base: Config, out: Path, context: RunContext = RunContext()
    ):
        from cpcfl_tf.records.files import CACHE_FIX, cache_root, prepare_out_dir

        self.experiment, self.base, self.context = experiment, base, context
        self.out = Path(out) if context.dry_run else prepare_out_dir(out)
        if not context.dry_run:  # every folder a run writes, checked before any data is read
            prepare_out_dir(cache_root(), fix=CACHE_FIX)
            if context.tensorboard:
                prepare_out_dir(
                    context.tensorboard, fix="pass --tensorboard DIR with a writable folder"
                )
        self.data = DataCache(context)
        self.store = RecordStore(self.out, context.force)
        self.taking = Taking(self.store, force=context.force, resume=context.resume)
        """Whether each run is taken or made (:mod:`cpcfl_tf.running.taking`)."""
        self.encoders = StartingEncoders(
            clients=self.data.clients,
            unlabeled=self.data.unlabeled,
            knn=self.data.knn_monitor if context.knn_every else None,
            client_unlabeled=self.data.client_unlabeled,
            context=context,
        )
        """The runs' starting encoders, each built once (pre-trained with the run's seed)."""
        self.records: list[RunRecord] = []
        """Every record :meth:`run` returned, in order: what the script's report shows."""
        self._plans: dict[str, RunPlan] = {}
        """Each spec's plan (:meth:`plan_of`), by the spec."""
        self._checked: set[str] = {data_key(base)} if context.data_checked else set()
        """The data the runs' configs read, checked already (the script may have checked
        the base's: ``context.data_checked``), by :func:`~cpcfl_tf.plan.resolve.data_key`."""

    def config_of(self, spec: RunSpec) -> Config:
        """``spec``'s config on this runner's base, its starting encoder the one
        ``--encoders-from`` selected for its method and pre-training seed (the settings go
        into ``pretrain.options``, so the run record names them)."""
        return selected(spec.config(self.base), self.context.selection)

    def plan_of(self, spec: RunSpec) -> RunPlan:
        """``spec``'s plan (:func:`~cpcfl_tf.plan.resolve.resolve` of :meth:`config_of`), made
        once: a config its data cannot hold is refused here, in one line."""
        key = repr(spec)
        if key not in self._plans:
            config = self.config_of(spec)
            data = data_key(config)
            self._plans[key] = resolve(config, checked=data in self._checked)
            self._checked.add(data)  # each piece of data is checked once
        return self._plans[key]

    def path(self, spec: RunSpec) -> Path:
        return self.out / f"{spec.name}.json"

    def checkpoint(self, spec: RunSpec) -> Path:
        """Where an unfinished run of ``spec`` keeps its last round."""
        return self.out / f".{spec.name}.ckpt.npz"

    # -- deciding -----------------------------------------------------------
    def decide(self, spec: RunSpec) -> RunDecision:
        """The one decision about ``spec`` (:meth:`~cpcfl_tf.running.taking.Taking.decide`)."""
        return self.taking.decide(
            spec.name, self.plan_of(spec), self.path(spec), self.checkpoint(spec)
        )

    def planned(self, spec: RunSpec) -> tuple[str, str | None]:
        """What :meth:`run` would do with ``spec`` now (:meth:`RunDecision.describe`), and where
        the starting encoder it needs would come from
        (:meth:`~cpcfl_tf.methods.starts.Start.status`), None where it
        needs none. Reads, never writes."""
        try:
            decision = self.decide(spec)
        except UserError as err:
            return RunDecision(Decision.STOPS, why=str(err)).describe(), None
        needs = decision.decision in (Decision.RUN, Decision.RESUME, Decision.BASE_FIRST)
        return (decision.describe(), self._encoder_status(spec) if needs else None)

    def _encoder_status(self, spec: RunSpec) -> str:
        """Where ``spec``'s starting encoder would come from now (nothing is built)."""
        run = self.plan_of(spec)
        return run.start.status(self.encoders, run)

    def finished(self, spec: RunSpec) -> RunRecord | None:
        """``spec``'s finished record: in the output folder, or taken (a stand-in, a twin,
        the one ``taken.json`` names, or one this machine would make when its starting
        encoder needs no training), so that a report reads the same runs on any machine;
        None where there is none, as for a run interrupted (its checkpoint is there).
        Reads, never writes; what it finds joins
        :attr:`records`, as :meth:`run`'s records do (the report's notes read them)."""
        if self.checkpoint(spec).exists() and not self.path(spec).exists():
            return None  # interrupted, to be resumed: not finished, and left as it is
        run = self.plan_of(spec)
        config = run.requested
        decision = self.decide(spec)
        found: Found | None
        if decision.found is not None:
            found = self._took(spec, config, decision, decision.found)
        elif decision.candidates and run.start.ready(self.encoders, run):
            found = self.store.take(
                spec.name, list(decision.candidates), weights_fingerprint(self.encoders(run))
            )
        else:
            found = None
        if found is None:
            return None
        self.records.append(found.record)
        return found.record

    def _took(self, spec: RunSpec, config: Config, decision: RunDecision, found: Found) -> Found:
        """``decision``'s record (``found``), a stand-in noted as one."""
        if decision.decision is Decision.STAND_IN:
            self.store.stand_in(spec.name, config.federated.method, found)
        return found

    # -- running ------------------------------------------------------------
    def run(self, spec: RunSpec, on_round: Callable[[dict, Any], None] | None = None) -> RunRecord:
        """Run ``spec`` (or take its record, :meth:`decide`) and return its record.

        ``on_round(round_record, state)`` is called after every round the run makes now
        (not for rounds of a finished run, nor those before a resumed checkpoint)."""
        run = self.plan_of(spec)
        config = run.requested
        decision = self.decide(spec)
        if decision.decision is not Decision.RESUME:
            # left by a kill right after the record was written; with --force, an old
            # checkpoint starts over
            self.checkpoint(spec).unlink(missing_ok=True)
        if decision.found is not None:
            found = self._took(spec, config, decision, decision.found)
            if self.context.verbose:
                print(_taken_line(spec, decision, found, self.store.paired))
            self.records.append(found.record)
            return found.record
        if self.context.verbose:
            fl = config.federated
            length = (
                f"{fl.rounds} rounds"
                if run.method.federated
                else f"{fl.centralized_epochs or fl.rounds * fl.local_epochs} epochs"
            )
            print(
                f"{spec.name}: {fl.method} ({fl.pretraining}), "
                f"{config.partition.num_clients} clients, {length}"
            )
        encoder = self.encoders(run)
        same = self.store.take(spec.name, list(decision.candidates), weights_fingerprint(encoder))
        if same is not None:
            if self.context.verbose:
                print(
                    f"{spec.name}: the same run as {same.path} (same config, machine kind "
                    f"and starting encoder), final accuracy {same.record.final.accuracy:.4f}"
                )
            self.records.append(same.record)
            return same.record
        record = self._make(spec, run, encoder, on_round)
        self.records.append(record)
        return record

    def _make(self, spec: RunSpec, run: RunPlan, encoder, on_round) -> RunRecord:
        """Run ``spec`` (its plan ``run``) here, resuming its checkpoint, and write its
        record."""
        from cpcfl_tf.clustered.simulator import run_federated
        from cpcfl_tf.clustered.starting import pool_encoder

        path, checkpoint = self.path(spec), self.checkpoint(spec)
        config = run.requested
        if not run.method.federated:
            from cpcfl_tf.clustered.centralized import run_centralized

            record = run_centralized(run, self.data.clients(config), encoder)
        else:
            clients = self.data.clients(config)
            logged = _with_scalars(
                self.context.tensorboard, self.experiment, spec, clients, on_round
            )
            record, state = run_federated(
                run,
                clients,
                encoder_weights=encoder,
                checkpoint=checkpoint,
                on_round=logged,
                context=self.context,
            )
            if run.gives is not None:
                # IFCA (FedAvg) starts from this model's encoder: kept, also for later runs.
                self.encoders.keep_fedavg(config, pool_encoder(state))
        record = dataclasses.replace(
            record,
            experiment=self.experiment,
            environment=run_environment(
                encoder, plugins_used(config.federated.method, config.federated.pretraining)
            ),
        )
        write_record(path, record)
        self.store.add(path, record)
        checkpoint.unlink(missing_ok=True)
        if self.context.verbose:
            print(f"{spec.name}: final accuracy {record.final.accuracy:.4f} -> {path}")
        return record


def selected(config: Config, selection: dict[int, dict[str, dict]] | None) -> Config:
    """``config`` starting from the encoder ``selection``
    (:func:`~cpcfl_tf.running.cli.read_selection`, ``--encoders-from``) chose
    for its method and pre-training seed (the settings go into ``pretrain.options``)."""
    from cpcfl_tf.methods.starts import START

    method, start = config.federated.pretraining, START[config.federated.pretraining]
    if selection is None or not start.ssl_method or start.federated is not None:
        return config  # the selection chooses the server's self-supervised encoders only
    chosen = selection.get(config.pretrain_seed, {})
    if method not in chosen:
        raise UserError(
            f"--encoders-from selected no {method} encoder for seed "
            f"{config.pretrain_seed}; run experiments/encoder_selection.py "
            f"with that seed and method, or leave the option out"
        )
    return config.with_overrides(
        pretrain={"options": {**(config.pretrain.options or {}), method: chosen[method]}}
    )


def _with_scalars(tensorboard, experiment: str, spec: RunSpec, clients, on_round):
    """``on_round`` that also logs the round to TensorBoard (when a folder is set)."""
    if not tensorboard:
        return on_round
    from cpcfl_tf.records.scalars import ScalarLog

    log = ScalarLog(Path(tensorboard) / experiment / spec.name)

    def logged(record: dict, state) -> None:
        log.write(record["round"], _round_scalars(record, clients.groups, len(state.models)))
        if on_round:
            on_round(record, state)

    return logged


def _taken_line(spec: RunSpec, decision: RunDecision, found: Found, paired: set[str]) -> str:
    """The line of a run taken (``found``), not made."""
    record, path = found.record, found.path
    if decision.decision is Decision.DONE:
        return f"{spec.name}: done before, final accuracy {record.final.accuracy:.4f} ({path})"
    if decision.decision is Decision.STAND_IN:
        return (
            f"{spec.name}: its restart rule never fires in {path}, so it is that run, "
            f"final accuracy {record.final.accuracy:.4f}"
        )
    why = (
        "it starts from its base method's run's encoder"
        if spec.name in paired
        else "the folder's taken.json names it"
    )
    return f"{spec.name}: the run of {path} ({why}), final accuracy {record.final.accuracy:.4f}"


def _round_scalars(record: dict, groups: np.ndarray, num_clusters: int) -> dict[str, float]:
    """What TensorBoard shows of a round: accuracy, ARI, and each cluster's size."""
    from cpcfl_tf.clustered.metrics import cluster_ari
    from cpcfl_tf.clustered.restarts import cluster_sizes

    ids = np.asarray(record["cluster_ids"])
    sizes = cluster_sizes(ids, num_clusters)
    return {
        "accuracy": record["accuracy"],
        "ari": cluster_ari(groups, ids),
        **{f"cluster_size/{n}": int(c) for n, c in enumerate(sizes)},
    }
