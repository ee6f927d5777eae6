"""Data: image sources, the one preprocessing path, and the paper's client partition.

This layer knows nothing of the kit's configuration: it takes dataset names, splits and
numbers. :mod:`cpcfl_tf.clustered.clients` turns a config into clients.
"""

from cpcfl_tf.data.partition import Client, Partition, partition_clients
from cpcfl_tf.data.sources import DATASETS, get_spec, load_labeled, load_unlabeled
from cpcfl_tf.data.specs import LabeledImages

__all__ = [
    "DATASETS",
    "Client",
    "LabeledImages",
    "Partition",
    "get_spec",
    "load_labeled",
    "load_unlabeled",
    "partition_clients",
]
