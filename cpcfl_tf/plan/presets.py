"""The four presets: named, complete :class:`~cpcfl_tf.plan.config.Config` s a script starts from.

Presets (docs/presets-and-data.md):

========== ============================================= ===== ============ ===========
preset     data                                          input C / T / Tc   pre-training
========== ============================================= ===== ============ ===========
smoke      scikit-learn digits                           32    9 / 4 / 1    1 epoch
quick      Fashion-MNIST (Debian files)                  32    15 / 40 / 10 few epochs
standard   same as quick                                 32    60 / 100 / 10 more epochs
paper      STL-10 through tfds, the paper's settings     96    60 / 100 / 10 300 epochs
========== ============================================= ===== ============ ===========
"""

from __future__ import annotations

import dataclasses

from cpcfl_tf.errors import UserError
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.sections import DataConfig, FederatedConfig, PartitionConfig, PretrainConfig


def pretrain_config_for(pretrain: PretrainConfig, encoder: str) -> PretrainConfig:
    """``pretrain`` for ``encoder``: ResNets use half the CNN's batch and 5/3 of its epochs
    (Sec. "ResNet-18 encoder": batch 250 and 500 epochs where the CNN has 500 and 300)."""
    if encoder == "cnn":
        return dataclasses.replace(pretrain, encoder=encoder)
    return dataclasses.replace(
        pretrain,
        encoder=encoder,
        batch_size=max(1, pretrain.batch_size // 2),
        epochs=max(1, round(pretrain.epochs * 5 / 3)),
    )


def with_encoder(config: Config, encoder: str) -> Config:
    """``config`` with ``encoder`` (both stages build it) and the pre-training budget
    :func:`pretrain_config_for` gives it."""
    return config.with_overrides(
        pretrain=dataclasses.asdict(pretrain_config_for(config.pretrain, encoder))
    )


def _smoke() -> Config:
    return Config(
        preset="smoke",
        # Pre-training and client images are disjoint parts of digits' training split.
        data=DataConfig("digits", "train[:697]", "digits", "train[697:]", "test", image_size=32),
        partition=PartitionConfig(num_clients=9, class_counts=(8, 8, 2, 2)),
        pretrain=PretrainConfig(epochs=1, batch_size=128),
        federated=FederatedConfig(rounds=4, head_rounds=1, local_epochs=1),
    )


def _quick() -> Config:
    return Config(
        preset="quick",
        # 50,000 unlabeled images for the server, clients from the other 10,000.
        data=DataConfig(
            "fashion_mnist_idx",
            "train[:50000]",
            "fashion_mnist_idx",
            "train[50000:]",
            "test",
            image_size=32,
        ),
        # The paper's own 15-client setting uses T = 40 (Sec. "Number of clients").
        partition=PartitionConfig(num_clients=15),
        pretrain=PretrainConfig(epochs=5),
        federated=FederatedConfig(rounds=40, head_rounds=10),
    )


def _standard() -> Config:
    quick = _quick()
    return dataclasses.replace(
        quick,
        preset="standard",
        partition=PartitionConfig(num_clients=60),
        pretrain=dataclasses.replace(quick.pretrain, epochs=20),
        federated=FederatedConfig(rounds=100, head_rounds=10),
    )


def _paper() -> Config:
    # All defaults are the paper's: STL-10, 96x96, 60 clients in 3 groups, N = 3,
    # T = 100, Tc = 10, E = 3, batch 32, Adam 1e-3; 300 epochs of batch 500 pre-training.
    return Config(
        preset="paper",
        data=DataConfig(),
        partition=PartitionConfig(),
        pretrain=PretrainConfig(),
        federated=FederatedConfig(),
    )


PRESETS = {"smoke": _smoke, "quick": _quick, "standard": _standard, "paper": _paper}


def get_preset(name: str) -> Config:
    """Return a fresh :class:`Config` for preset ``name``."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
