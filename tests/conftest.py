"""Shared fixtures. The Fashion-MNIST tests read the real Debian files on purpose:
CI installs them (.ci/run), and a missing file must fail loudly, not skip."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from cpcfl_tf.data.sources import load_labeled  # noqa: E402


@pytest.fixture(scope="session")
def fmnist_clients():
    """The quick preset's client splits: Fashion-MNIST train[50000:] and test."""
    return (load_labeled("fashion_mnist_idx", "train[50000:]"),
            load_labeled("fashion_mnist_idx", "test"))
