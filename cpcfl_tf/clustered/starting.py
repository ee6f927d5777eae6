"""Where a federated run's starting encoder comes from: ``federated.pretraining``.

============================  ===========================================================
``none``                      random initialisation (no encoder is passed on)
``simclr``, ``byol``,         the server's contrastive pre-training on *unlabeled* images
``simsiam``                   (:func:`cpcfl_tf.pretraining.pretrain.pretrained_encoder`)
``supervised``                the server's supervised pre-training on the labeled version
                              of the same split (tab:encoder_pretraining)
``fedavg``                    the global model's encoder after a FedAvg (None) run on the
                              same clients (IFCA (FedAvg))
``fed-simclr``, ...,          a federated self-supervised pre-training on the clients'
``fedema-byol``               unlabeled images (``partition.unlabeled``; :mod:`cpcfl_tf.
                              pretraining.federated_pretrain`)
============================  ===========================================================

Each is built once and kept in one cache (:func:`cpcfl_tf.records.files.cache_root`):
``pretrained/<method>-<encoder>-<hash>/`` for the server's pre-trainings and
``fedavg/<hash>.npz`` for FedAvg encoders, so no script, rerun or resumed run builds one
twice, and a script whose encoders are all cached reads no pre-training image.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cpcfl_tf.clustered import algorithm
from cpcfl_tf.clustered.clients import Clients
from cpcfl_tf.compat import pretrain_settings, without_added
from cpcfl_tf.methods.federated import FEDAVG_ENCODER_RUN
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.plan.identity import config_record
from cpcfl_tf.plan.resolve import Pretraining, RunPlan, resolve
from cpcfl_tf.records.files import (
    CACHE_FIX,
    building,
    cache_root,
    prepare_out_dir,
    read_weights,
    write_weights,
)
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.records.scalars import ScalarLog

if TYPE_CHECKING:  # the type only: the module imports TensorFlow, which a status line needs not
    from cpcfl_tf.pretraining.pretrain import PretrainResult

Weights = list[np.ndarray]


def fedavg_config(config: Config) -> Config:
    """The FedAvg (None) run whose encoder IFCA (FedAvg) with ``config`` starts from."""
    method, pretraining = FEDAVG_ENCODER_RUN
    return config.with_overrides(federated={"method": method, "pretraining": pretraining})


class StartingEncoders:
    """The starting encoders of one script's runs, each built at most once.

    The server pre-trains with the run's own seed (``config.seed``, unless ``pretrain.seed``
    names another: :attr:`~cpcfl_tf.plan.config.Config.pretrain_seed`): runs of different seeds
    (trials) sample the encoder as they sample the partition, initial weights and batch
    order; runs of one pre-training seed share one cached encoder.

    Parameters
    ----------
    clients
        ``clients(config)``: the run's clients (a FedAvg encoder is trained on them).
    unlabeled
        ``unlabeled(config)``: the server's unlabeled images, called only when a
        contrastive pre-training is not cached yet.
    knn
        ``knn(config)``: the kNN monitor of a pre-training trained here
        (:class:`~cpcfl_tf.pretraining.knn.KnnMonitor`), called only when one trains;
        None: no monitor.
    client_unlabeled
        ``client_unlabeled(config)``: each client's unlabeled images (a federated
        pre-training), called only when one trains.
    context
        Its ``verbose`` and ``distribute`` as for
        :func:`cpcfl_tf.pretraining.pretrain.pretrained_encoder`; with ``tensorboard``,
        each pre-training trained here logs its loss, embedding std and kNN accuracy per
        epoch under ``pretrain/<cache key>`` there.
    """

    def __init__(
        self,
        *,
        clients: Callable[[Config], Clients] | None = None,
        unlabeled: Callable[[Config], np.ndarray] | None = None,
        knn: Callable[[Config], object] | None = None,
        client_unlabeled: Callable[[Config], list[np.ndarray]] | None = None,
        context: RunContext = RunContext(),
    ):
        self.context, self._knn = context, knn
        self._clients, self._unlabeled = clients, unlabeled
        self._client_unlabeled = client_unlabeled
        self._fedavg: dict[str, Weights] = {}

    def __call__(self, run: RunPlan) -> Weights | None:
        """The encoder ``run`` starts from (``None``: random): its start's, got from this
        cache for the plan's pretraining."""
        return run.start.encoder(self, run)

    @staticmethod
    def pretraining_folder(pretraining: Pretraining) -> Path:
        """The cache folder of a pre-training: a federated one's, or the server's."""
        if pretraining.federated is not None:
            return StartingEncoders.federated_folder(pretraining)
        return StartingEncoders.pretrain_folder(pretraining)

    def pretraining_status(self, run: RunPlan, finished: str) -> str:
        """Where ``run``'s pre-training would come from now, from the file its finished
        run leaves in its folder (``finished``): cached, to resume, or to make."""
        pretraining = _needed(run)
        folder = self.pretraining_folder(pretraining)
        state = (
            "cached"
            if (folder / finished).exists()
            else "to resume"
            if (folder / "checkpoint.npz").exists()
            else pretraining.fresh
        )
        return f"{pretraining.name} encoder: {state} ({folder})"

    def pretraining_done(self, run: RunPlan, finished: str) -> bool:
        """Whether ``run``'s pre-training's folder holds ``finished``."""
        return (self.pretraining_folder(_needed(run)) / finished).exists()

    @staticmethod
    def pretrain_folder(pretraining: Pretraining) -> Path:
        """The cache folder of the server's pre-training (self-supervised or supervised)."""
        from cpcfl_tf.pretraining.pretrain import pretrain_folder

        return pretrain_folder(
            pretraining.pretrain, pretraining.data, pretraining.ssl, pretraining.seed
        )

    @staticmethod
    def federated_folder(pretraining: Pretraining) -> Path:
        """The cache folder of a federated pre-training."""
        from cpcfl_tf.pretraining.federated_pretrain import federated_folder

        return federated_folder(pretraining)

    def contrastive(self, run: RunPlan) -> PretrainResult:
        """``run``'s server self-supervised pre-training, cached, with its history."""
        from cpcfl_tf.pretraining.pretrain import pretrained_encoder

        pre, config = _needed(run), run.requested
        unlabeled, knn = self._unlabeled, self._knn
        images = None if unlabeled is None else (lambda: unlabeled(config))
        monitor = None if knn is None else (lambda: knn(config))
        if pre.ssl is None:
            raise ValueError(f"{pre.name} is not a self-supervised pre-training")
        return pretrained_encoder(
            pre.pretrain,
            pre.data,
            method=pre.ssl,
            seed=pre.seed,
            verbose=self.context.verbose,
            distribute=self.context.distribute,
            images=images,
            monitor=monitor,
            on_epoch=self._epoch_log(lambda: self.pretrain_folder(pre)),
        )

    def federated(self, run: RunPlan) -> PretrainResult:
        """``run``'s federated self-supervised pre-training, cached, with its history."""
        from cpcfl_tf.pretraining.federated_pretrain import federated_encoder

        client_unlabeled, knn = self._client_unlabeled, self._knn
        if client_unlabeled is None:
            raise ValueError("a federated pre-training needs the clients' unlabeled images")
        pre, config = _needed(run), run.requested
        monitor = None if knn is None else (lambda: knn(config))
        return federated_encoder(
            pre,
            lambda: client_unlabeled(config),
            verbose=self.context.verbose,
            monitor=monitor,
            on_round=self._epoch_log(lambda: self.federated_folder(pre)),
        )

    def _epoch_log(self, folder: Callable[[], Path]):
        """The TensorBoard logger of the epochs (a federated one's rounds) of the
        pre-training cached in ``folder()`` (asked only with ``--tensorboard``), under its
        name; None without a TensorBoard folder."""
        if not self.context.tensorboard:
            return None
        log = ScalarLog(Path(self.context.tensorboard) / "pretrain" / folder().name)
        names = ("loss", "embedding_std", "knn_accuracy")
        return lambda epoch, logs: log.write(epoch, {k: logs[k] for k in names if k in logs})

    def supervised(self, run: RunPlan) -> Weights:
        """Supervised pre-training on the labeled version of the run's pre-training split,
        with the contrastive pre-training's budget (``pretrain``'s epochs, batch size and
        learning rate: the paper does not give its own)."""
        from cpcfl_tf.clustered.centralized import supervised_encoder
        from cpcfl_tf.data import load_labeled
        from cpcfl_tf.pretraining.pretrain import image_source

        pretraining = _needed(run)
        data, pre, seed = pretraining.data, pretraining.pretrain, pretraining.seed
        out = self.pretrain_folder(pretraining)

        def train() -> Weights:
            if self.context.verbose:
                print(
                    f"supervised pre-training ({pre.encoder}) on {data.pretrain_dataset}:"
                    f"{data.pretrain_split} with its labels -> {out}",
                    flush=True,
                )
            labeled = load_labeled(
                data.pretrain_dataset,
                data.pretrain_split,
                image_size=data.image_size,
                data_dir=data.data_dir,
                manual_dir=data.manual_dir,
            )
            budget = run.requested.with_overrides(
                federated={"batch_size": pre.batch_size, "learning_rate": pre.learning_rate}
            )
            weights = supervised_encoder(
                resolve(budget, checked=True), labeled, epochs=pre.epochs, seed=seed
            )
            write_weights(out / "encoder.npz", weights)
            (out / "source.json").write_text(
                json.dumps(
                    {
                        "config": pretrain_settings(dataclasses.asdict(pre)),
                        **image_source(data),
                        "seed": seed,
                    },
                    indent=2,
                )
            )
            return weights

        return _cached_or_built(
            out,
            out / "encoder.npz",
            train,
            rebuild="pre-training it again",
            verbose=self.context.verbose,
        )

    def fedavg_ready(self, run: RunPlan) -> bool:
        """Whether the FedAvg encoder of ``run``'s requested config is kept here or
        cached."""
        key = _fedavg_key(run.requested)
        return key in self._fedavg or _fedavg_path(key).exists()

    def fedavg(self, run: RunPlan) -> Weights:
        """The encoder of the global model after the FedAvg (None) run on the clients and
        rounds of ``run``'s requested config; trained only if neither this script nor the
        cache has it."""
        config = run.requested
        key = _fedavg_key(config)
        if key not in self._fedavg:
            path = _fedavg_path(key)

            def train() -> Weights:
                if self._clients is None:
                    raise ValueError("a FedAvg starting encoder needs the clients' data")
                weights, _ = fedavg_encoder(config, self._clients(config), context=self.context)
                write_weights(path, weights, key=key)
                return weights

            self._fedavg[key] = _cached_or_built(
                path,
                path,
                train,
                key=key,
                rebuild="training FedAvg again",
                verbose=self.context.verbose,
            )
        return self._fedavg[key]

    def keep_fedavg(self, config: Config, weights: Weights) -> None:
        """Keep the encoder of a finished FedAvg (None) run (``config``) for IFCA (FedAvg)
        runs on the same clients, now or later."""
        key = _fedavg_key(config)
        self._fedavg[key] = weights
        write_weights(_fedavg_path(key), weights, key=key)


def _needed(run: RunPlan) -> Pretraining:
    """``run``'s pre-training, which a start that asks for one has."""
    if run.pretraining is None:
        raise ValueError(f"{run.start.name} pre-trains nothing")
    return run.pretraining


def fedavg_encoder(
    config: Config,
    clients: Clients,
    *,
    checkpoint: str | Path | None = None,
    context: RunContext = RunContext(),
) -> tuple[Weights, RunRecord]:
    """IFCA(FedAvg)'s starting encoder: the encoder of the global model of a FedAvg run
    (random initialisation, the same clients and rounds). Returns it and that run's record.
    """
    from cpcfl_tf.clustered.simulator import run_federated  # TensorFlow: only when it runs

    record, state = run_federated(
        resolve(fedavg_config(config)), clients, checkpoint=checkpoint, context=context
    )
    return pool_encoder(state), record


def pool_encoder(state: algorithm.ServerState) -> Weights:
    """The encoder part of a one-model (FedAvg) pool."""
    return state.models[0][: state.num_encoder]


def _cached_or_built(
    entry: Path,
    file: Path,
    build: Callable[[], Weights],
    *,
    key: str | None = None,
    rebuild: str,
    verbose: int,
) -> Weights:
    """The weights cache entry ``entry`` (a folder, or ``file`` itself) keeps in ``file``,
    or, when it has none, ``build()``'s, built in one process at a time
    (:func:`~cpcfl_tf.records.files.building`). A process that waited reads the file again only
    if another one wrote it meanwhile (its time or size changed), so a damaged one is
    said once."""
    seen = _stamp(file)
    cached = read_weights(file, key=key, rebuild=rebuild)
    if cached is not None:
        return cached
    prepare_out_dir(file.parent, fix=CACHE_FIX)
    with building(entry, say=print if verbose else None):
        if _stamp(file) != seen:
            cached = read_weights(file, key=key, rebuild=rebuild)
        return build() if cached is None else cached


def _stamp(path: Path) -> tuple | None:
    """When and how large ``path`` was written (None: it is not there)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _fedavg_key(config: Config) -> str:
    return json.dumps(without_added(config_record(fedavg_config(config))), sort_keys=True)


def _fedavg_path(key: str):
    return cache_root() / "fedavg" / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz"


def cache_entries(root: str | Path | None = None) -> dict[str, Path]:
    """Every finished starting encoder in the cache (``root``, default
    :func:`~cpcfl_tf.records.files.cache_root`) by the fingerprint of its weights, the
    ``environment.starting_encoder`` of the records of runs that started from it: the
    server's pre-trainings (``pretrained/<name>/``) and FedAvg encoders
    (``fedavg/<hash>.npz``). Unfinished and damaged entries are left out."""
    from cpcfl_tf.records.files import weights_fingerprint

    root = cache_root() if root is None else Path(root)
    found: dict[str, Path] = {}
    for path in sorted([*root.glob("pretrained/*/"), *root.glob("fedavg/*.npz")]):
        weights = entry_weights(path)
        fingerprint = weights_fingerprint(weights)
        if fingerprint is not None:
            found.setdefault(fingerprint, path)
    return found


def entry_weights(path: str | Path) -> Weights | None:
    """The encoder weights one cache entry holds (a pre-training's folder or a FedAvg
    encoder's file), as a run starting from it receives them; ``None`` when the entry is
    unfinished or damaged (one warning line)."""
    path = Path(path)
    again = "pre-training it again"
    if path.suffix == ".npz":
        return read_weights(path, rebuild="training FedAvg again")
    if (path / "encoder.npz").exists():  # supervised (StartingEncoders.supervised)
        return read_weights(path / "encoder.npz", rebuild=again)
    if (path / "pretrain.json").exists() and (path / "encoder.keras").exists():
        import keras

        from cpcfl_tf.records.files import read_cache_entry

        model = read_cache_entry(path / "encoder.keras", keras.models.load_model, rebuild=again)
        return None if model is None else model.get_weights()
    return None
