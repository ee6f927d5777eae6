"""Shared fixtures. The Fashion-MNIST tests read the real Debian files on purpose:
CI installs them (.ci/run), and a missing file must fail loudly, not skip."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from cpcfl_tf.data.sources import load_labeled  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def encoder_cache(tmp_path_factory):
    """One encoder cache for the whole suite, so the smoke SimCLR encoder and FedAvg
    encoders are built once (never ./cache). Tests about building or damaging cache
    entries point CPCFL_CACHE at a folder of their own."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.getbasetemp() / "encoder-cache"
        patch.setenv("CPCFL_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="session")
def fmnist_clients():
    """The quick preset's client splits: Fashion-MNIST train[50000:] and test."""
    return (load_labeled("fashion_mnist_idx", "train[50000:]"),
            load_labeled("fashion_mnist_idx", "test"))
