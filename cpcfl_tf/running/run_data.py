"""The data a runner's runs read, each piece loaded once: the clients' labeled splits per
data config, the partition per (data config, seed), the server's unlabeled images per
source, the clients' unlabeled deal, and the kNN monitor's proxy."""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from cpcfl_tf.data.specs import LabeledImages
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.context import RunContext


class DataCache:
    """Loads each piece of a runner's data once (see the module's docstring)."""

    def __init__(self, context: RunContext = RunContext()):
        self.context = context
        """Its kNN monitor's period and proxy (``knn_every``, ``knn_proxy``)."""
        self._splits: dict[str, tuple] = {}
        self._partitions: dict[str, tuple] = {}
        self._unlabeled: dict[str, np.ndarray] = {}

    def client_splits(self, data) -> tuple:
        """The clients' labeled training and test splits ``data`` names (loaded once per
        data config): what the partition draws from and the linear evaluation's proxy."""
        from cpcfl_tf.clustered.clients import load_client_splits

        data_key = json.dumps(dataclasses.asdict(data), sort_keys=True)
        if data_key not in self._splits:
            self._splits[data_key] = load_client_splits(data)
        return self._splits[data_key]

    def partition(self, config: Config):
        """``(partition, train split, test split)`` of the run (loaded and drawn once per
        data config and seed)."""
        from cpcfl_tf.clustered.clients import labeled_partition, partition_for

        key = json.dumps(
            [dataclasses.asdict(config.data), labeled_partition(config), config.seed],
            sort_keys=True,
        )
        if key not in self._partitions:
            train, test = self.client_splits(config.data)
            self._partitions[key] = (partition_for(config, train, test), train, test)
        return self._partitions[key]

    def knn_monitor(self, config: Config):
        """The kNN monitor of ``config``'s pre-training: its labeled proxy is the linear
        evaluation's (the clients' training and test splits: the paper's proxy) unless
        ``--knn-proxy`` names others. The labels go to the monitor only."""
        from cpcfl_tf.data import load_labeled
        from cpcfl_tf.pretraining.knn import KnnMonitor

        data = config.data
        proxy = self.context.knn_proxy
        if proxy is None:
            train, test = self.client_splits(data)
        else:
            train, test = (
                load_labeled(
                    name,
                    split,
                    image_size=data.image_size,
                    data_dir=data.data_dir,
                    manual_dir=data.manual_dir,
                )
                for name, split in proxy
            )
        return KnnMonitor(train, test, every=self.context.knn_every)

    def unlabeled(self, config: Config) -> np.ndarray:
        """The server's unlabeled pre-training images (loaded once per source)."""
        from cpcfl_tf.pretraining.pretrain import load_pretrain_images

        data = config.data
        key = json.dumps(
            [
                data.pretrain_dataset,
                data.pretrain_split,
                data.image_size,
                data.data_dir,
                data.manual_dir,
            ]
        )
        if key not in self._unlabeled:
            self._unlabeled[key] = load_pretrain_images(config.data)
        return self._unlabeled[key]

    def client_unlabeled(self, config: Config) -> list[np.ndarray]:
        """Each client's unlabeled images (``partition.unlabeled``): the pre-training
        split dealt over the run's partition (for the groups deal by its labels, which go
        no further)."""
        from cpcfl_tf.clustered.clients import client_unlabeled
        from cpcfl_tf.data import load_labeled

        partition, train, _ = self.partition(config)
        data = config.data
        pretrain: LabeledImages | np.ndarray
        if config.partition.unlabeled == "groups":
            pretrain = load_labeled(
                data.pretrain_dataset,
                data.pretrain_split,
                image_size=data.image_size,
                data_dir=data.data_dir,
                manual_dir=data.manual_dir,
            )
        else:
            pretrain = self.unlabeled(config)
        return client_unlabeled(config, partition, train, pretrain)

    def clients(self, config: Config):
        """The run's clients, stacked for the simulator."""
        from cpcfl_tf.clustered.clients import make_clients

        return make_clients(*self.partition(config))
