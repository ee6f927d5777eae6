"""Data: image sources, the one preprocessing path, and the paper's client partition."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from cpcfl_tf.data.partition import Client, Partition, partition_clients
from cpcfl_tf.data.sources import (DATASETS, LabeledImages, get_spec, load_labeled,
                                   load_unlabeled)

if TYPE_CHECKING:
    from cpcfl_tf.config import Config, DataConfig

__all__ = ["DATASETS", "Client", "LabeledImages", "Partition", "get_spec", "load_labeled",
           "load_unlabeled", "partition_clients", "load_client_splits", "partition_for"]


def load_client_splits(data: "DataConfig", *, resize: bool = True
                       ) -> tuple[LabeledImages, LabeledImages]:
    """The labeled splits the clients' training and local test images are drawn from."""
    size = data.image_size if resize else None
    kwargs = dict(image_size=size, data_dir=data.data_dir, manual_dir=data.manual_dir)
    return (load_labeled(data.client_dataset, data.client_train_split, **kwargs),
            load_labeled(data.client_dataset, data.client_test_split, **kwargs))


def partition_for(config: "Config", train: LabeledImages, test: LabeledImages,
                  seed: int | None = None) -> Partition:
    """Draw ``config.partition`` over ``train``/``test`` with ``seed`` (default config.seed)."""
    return partition_clients(train.labels, test.labels, num_classes=train.num_classes,
                             seed=config.seed if seed is None else seed, source=train.source,
                             **dataclasses.asdict(config.partition))
