"""The pre-training -> client data pairs of the cross-dataset tables
(tab:different_datasets, and the heads ablation that reuses them), per preset."""

from __future__ import annotations

import dataclasses
from typing import Any

from cpcfl_tf.plan.config import Config


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
        return [
            DatasetPair("stl10-stl10", "STL-10 -> STL-10", "STL-10 -> STL-10", True),
            DatasetPair(
                "stl10-cifar10",
                "STL-10 -> CIFAR-10",
                "STL-10 -> CIFAR-10",
                True,
                _clients_from("cifar10"),
            ),
            DatasetPair(
                "stl10-mnist", "STL-10 -> MNIST", "STL-10 -> MNIST", False, _clients_from("mnist")
            ),
            DatasetPair(
                "emnist-mnist",
                "EMNIST -> MNIST",
                "EMNIST -> MNIST",
                True,
                {"pretrain_dataset": "emnist", "pretrain_split": "train", **_clients_from("mnist")},
            ),
        ]
    if config.preset == "smoke":
        return [
            DatasetPair("digits-digits", "digits -> digits", "STL-10 -> STL-10", True),
            DatasetPair(
                "digits-fmnist",
                "digits -> Fashion-MNIST",
                "STL-10 -> MNIST",
                False,
                _clients_from("fashion_mnist_idx", "train[50000:]"),
            ),
        ]
    # digits has 1,297 training and 500 test images: at most 15 clients of 50 fit, with
    # 20 local test images each (test_fraction 0.4).
    return [
        DatasetPair("fmnist-fmnist", "Fashion-MNIST -> Fashion-MNIST", "STL-10 -> STL-10", True),
        DatasetPair(
            "fmnist-digits",
            "Fashion-MNIST -> digits",
            "STL-10 -> MNIST",
            False,
            _clients_from("digits"),
            {"num_clients": min(15, config.partition.num_clients), "test_fraction": 0.4},
        ),
    ]
