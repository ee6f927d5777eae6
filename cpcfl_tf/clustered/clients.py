"""The clients of a run: the labeled splits a config names, the paper's partition drawn
over them, and each client's images stacked for the simulator.

This is where a :class:`~cpcfl_tf.plan.config.Config` meets the data layer (``cpcfl_tf.data``
knows nothing of configs). Every driver builds its clients here: the simulator, the
runner, and each Flower node (which keeps only its own row).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cpcfl_tf.data import LabeledImages, Partition, load_labeled, partition_clients
from cpcfl_tf.errors import UserError
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.sections import DataConfig


@dataclasses.dataclass(frozen=True)
class ClientArrays:
    """Equal-sized client datasets stacked: ``images (K, n, h, w, 3)`` uint8, ``labels (K, n)``."""

    images: np.ndarray
    labels: np.ndarray

    @property
    def num_clients(self) -> int:
        return self.labels.shape[0]

    @property
    def size(self) -> int:
        return self.labels.shape[1]

    def subset(self, clients: np.ndarray) -> ClientArrays:
        return ClientArrays(self.images[clients], self.labels[clients])


@dataclasses.dataclass(frozen=True)
class Clients:
    """The clients of a run: stacked local data, true groups, and the JSON description."""

    train: ClientArrays
    test: ClientArrays
    groups: np.ndarray
    num_classes: int
    records: list[dict]

    @property
    def sizes(self) -> np.ndarray:
        return np.full(self.train.num_clients, self.train.size, np.float64)


def load_client_splits(
    data: DataConfig, *, resize: bool = True
) -> tuple[LabeledImages, LabeledImages]:
    """The labeled splits the clients' training and local test images are drawn from."""
    size = data.image_size if resize else None

    def split(name: str) -> LabeledImages:
        return load_labeled(
            data.client_dataset,
            name,
            image_size=size,
            data_dir=data.data_dir,
            manual_dir=data.manual_dir,
        )

    return split(data.client_train_split), split(data.client_test_split)


def partition_for(
    config: Config, train: LabeledImages, test: LabeledImages, seed: int | None = None
) -> Partition:
    """Draw ``config.partition`` over ``train``/``test`` with ``seed`` (default config.seed)."""
    return partition_clients(
        train.labels,
        test.labels,
        num_classes=train.num_classes,
        seed=config.seed if seed is None else seed,
        source=train.source,
        test_source=test.source,
        **labeled_partition(config),
    )


def labeled_partition(config: Config) -> dict:
    """``config.partition``'s fields that draw the clients' labeled partition (where the
    unlabeled images are does not change it)."""
    fields = dataclasses.asdict(config.partition)
    fields.pop("unlabeled")
    return fields


def make_clients(partition: Partition, train: LabeledImages, test: LabeledImages) -> Clients:
    """Stack each client's rows of the (preprocessed) splits; all clients are equal-sized."""
    sizes = {len(c.train_index) for c in partition.clients}
    test_sizes = {len(c.test_index) for c in partition.clients}
    if len(sizes) != 1 or len(test_sizes) != 1:
        raise UserError("the simulator needs clients of equal size (the paper's protocol)")
    rows = np.stack([c.train_index for c in partition.clients])
    test_rows = np.stack([c.test_index for c in partition.clients])
    images, test_images = train.images[rows], test.images[test_rows]
    for u, client in enumerate(partition.clients):
        if client.rotation:  # a rotated partition: the client sees its images turned
            images[u] = np.rot90(images[u], client.rotation, axes=(1, 2))
            test_images[u] = np.rot90(test_images[u], client.rotation, axes=(1, 2))
    return Clients(
        ClientArrays(images, train.labels[rows]),
        ClientArrays(test_images, test.labels[test_rows]),
        partition.groups,
        train.num_classes,
        partition.describe(train.labels, test.labels),
    )


def clients_for(config: Config) -> Clients:
    """Load the splits ``config.data`` names and draw its partition: the run's clients."""
    train, test = load_client_splits(config.data)
    return make_clients(partition_for(config, train, test), train, test)


def client_unlabeled(
    config: Config, partition: Partition, train: LabeledImages, pretrain: LabeledImages | np.ndarray
) -> list[np.ndarray]:
    """Each client's unlabeled images under ``config.partition.unlabeled``
    (:mod:`cpcfl_tf.data.unlabeled`): ``pretrain`` is the pre-training split, with its
    labels for the ``groups`` deal (which they deal, and which go no further); ``train``
    the clients' labeled split, whose class counts per client the ``groups`` deal follows
    (a rotated client's unlabeled images are turned as its labeled ones)."""
    from cpcfl_tf.data.unlabeled import deal_unlabeled
    from cpcfl_tf.plan.resolve import federated_settings

    kind = config.partition.unlabeled
    images = pretrain.images if isinstance(pretrain, LabeledImages) else pretrain
    source = f"{config.data.pretrain_dataset}:{config.data.pretrain_split}"
    settings = federated_settings(config)
    if settings is None:
        raise ValueError("the clients' unlabeled images are a federated pre-training's")
    batch = settings["batch_size"]
    if kind == "groups":
        if not isinstance(pretrain, LabeledImages):
            raise ValueError("the groups deal needs the pre-training split's labels")
        weights = np.stack(
            [
                np.bincount(train.labels[c.train_index], minlength=train.num_classes)
                for c in partition.clients
            ]
        )
        rows = deal_unlabeled(
            kind,
            len(images),
            len(partition.clients),
            seed=config.seed,
            batch_size=batch,
            labels=pretrain.labels,
            weights=weights,
            source=source,
        )
    else:
        rows = deal_unlabeled(
            kind,
            len(images),
            len(partition.clients),
            seed=config.seed,
            batch_size=batch,
            source=source,
        )
    dealt = []
    for client, r in zip(partition.clients, rows):
        part = images[r]
        dealt.append(
            np.rot90(part, client.rotation, axes=(1, 2)).copy()
            if kind == "groups" and client.rotation
            else part
        )
    return dealt


def unlabeled_for(config: Config) -> list[np.ndarray]:
    """Load what the deal needs and deal it: every client's unlabeled images (a Flower
    node with a partition id keeps its own; the runner caches the pieces instead)."""
    from cpcfl_tf.pretraining.pretrain import load_pretrain_images

    train, test = load_client_splits(config.data)
    data = config.data
    pretrain = (
        load_labeled(
            data.pretrain_dataset,
            data.pretrain_split,
            image_size=data.image_size,
            data_dir=data.data_dir,
            manual_dir=data.manual_dir,
        )
        if config.partition.unlabeled == "groups"
        else load_pretrain_images(data)
    )
    return client_unlabeled(config, partition_for(config, train, test), train, pretrain)
