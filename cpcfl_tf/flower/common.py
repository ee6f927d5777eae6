"""What the ServerApp and the ClientApp agree on: the run config and record layout.

Flower passes settings as a flat run config with kebab-case keys (``[tool.flwr.app.config]``
in ``app/pyproject.toml``, overridden by ``flwr run --run-config``); :func:`run_config`
turns them into the kit's validated :class:`~cpcfl_tf.plan.config.Config`, so both sides build
the same partition, models and batch orders as the simulator would.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import numpy as np

from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.federated import METHODS
from cpcfl_tf.methods.starts import START
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.overrides import parse_settings
from cpcfl_tf.plan.presets import get_preset

DEFAULTS: dict[str, Any] = {
    "preset": "smoke",
    "method": "cp-cfl",
    "pretraining": "simclr",
    "num-clusters": 2,
    "rounds": 3,
    "head-rounds": 1,
    "num-clients": 3,
    "seed": 0,
    "out": "",
    "round-timeout": 300.0,
    "min-nodes": 0,
    "max-examples": 0,
    "set": "",
    "class-names": "",
    "node-data": "partition",
}
"""Run config keys and their defaults (``min-nodes`` 0: wait for ``num-clients``; ``set``:
any other setting, as the scripts' ``--set``, e.g. ``"federated.local_epochs=1
federated.jit_compile=true"``; split as a shell would, so a value with spaces is quoted;
``class-names``: comma-separated names of the class subfolders of nodes that bring their
own data, default the class indices ``0,1,...`` of the run's client dataset;
``max-examples``: the most examples of any kind a node may report in the roster, 0: no
bound beyond its own report; ``node-data``: how the operator started the nodes,
``partition`` (each with ``partition-id`` and ``num-partitions`` = ``num-clients``, a
client of the run's seeded partition) or ``own`` (each with a ``data-path`` of its own):
the roster takes that word, never a node's)."""

NODE_DATA = ("partition", "own")


def own_data(values: Mapping[str, Any]) -> bool:
    """Whether the run config says its nodes bring their own data (``node-data`` own)."""
    said = str({**DEFAULTS, **dict(values)}["node-data"])
    if said not in NODE_DATA:
        raise UserError(
            f"run config node-data {said!r}: choose partition (nodes started with "
            "partition-id) or own (nodes started with a data-path)"
        )
    return said == "own"


def run_config(values: Mapping[str, Any]) -> Config:
    """The run's :class:`Config` from Flower's run config (missing keys: :data:`DEFAULTS`)."""
    v = {**DEFAULTS, **dict(values)}
    own_data(v)
    try:
        items = shlex.split(str(v["set"]))
    except ValueError as e:  # e.g. an unclosed quote
        raise UserError(
            f"run config set: {e}; write it as the shell would, e.g. "
            "set=\"data.client_dataset='folder:/my images'\""
        ) from None
    settings = parse_settings(items)
    # One config from the named keys and `set` together (set wins), so that a setting
    # the other depends on (e.g. partition.disjoint for many clients) is seen at once.
    named = {
        "partition": {"num_clients": int(v["num-clients"])},
        "federated": {
            "method": str(v["method"]),
            "pretraining": v["pretraining"],
            "num_clusters": int(v["num-clusters"]),
            "rounds": int(v["rounds"]),
            "head_rounds": int(v["head-rounds"]),
        },
    }
    for section, fields in settings.items():
        named[section] = {**named.get(section, {}), **fields}
    config = get_preset(str(v["preset"])).with_overrides(seed=int(v["seed"]), **named)
    fl = config.federated
    if not METHODS[fl.method].federated:
        raise UserError(
            f"method {fl.method!r} is a centralized baseline, not a federation; "
            "run it in the simulator (experiments/datasets.py)"
        )
    if not METHODS[fl.method].communicates:
        raise UserError(
            f"method {fl.method!r} trains each client alone and sends nothing: "
            "there is no federation to run; run it in the simulator"
        )
    if not METHODS[fl.method].rule.on_flower:
        # The nodes would need the starting encoder before training to answer.
        raise UserError(
            f"method {fl.method!r} is not available on Flower yet (its clients "
            "answer from the starting encoder's features before training); run "
            "it in the simulator"
        )
    if not START[fl.pretraining].on_flower:
        # IFCA (FedAvg) starts from a FedAvg (None) run's encoder: a federation of its own.
        usable = ", ".join(name for name, start in START.items() if start.on_flower)
        raise UserError(
            f"pre-training {fl.pretraining!r} is not available on Flower; use one "
            f"of {usable}, or the simulator"
        )
    if fl.optimizer_state != "fresh":
        # A ClientApp starts afresh for every message: no Adam state survives a round, so
        # a node would silently train unlike the simulator.
        raise UserError(
            "federated.optimizer_state 'client' is not available on Flower; "
            "use optimizer_state fresh or the simulator (experiments/"
            "local_optimizer.py)"
        )
    return config


def class_names(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The run's classes as nodes with their own data name their class subfolders:
    ``class-names`` of the run config, or the client dataset's class indices."""
    given = [n.strip() for n in str(values.get("class-names", "")).split(",") if n.strip()]
    if given:
        if len(set(given)) != len(given):
            raise UserError(f"run config class-names repeats a name: {','.join(given)}")
        return tuple(given)
    from cpcfl_tf.data.folders import class_folder_names
    from cpcfl_tf.data.sources import get_spec

    return class_folder_names(get_spec(run_config(values).data.client_dataset).num_classes)


MODEL_KEY = "model-"
"""A cluster model's array record is ``model-<cluster id>`` (:func:`model_key`)."""


def model_key(n: int) -> str:
    return f"{MODEL_KEY}{n}"


def models_to_records(models: dict[int, list[np.ndarray]]) -> dict:
    """Cluster models as a message's array records, keyed by cluster id
    (:func:`model_key`): the pool, or the one model a node is sent."""
    return {model_key(n): to_record(weights) for n, weights in models.items()}


def models_from_records(records) -> dict[int, list[np.ndarray]]:
    """The cluster models a message's array records carry, by cluster id."""
    return {
        int(key[len(MODEL_KEY) :]): from_record(r)
        for key, r in records.items()
        if key.startswith(MODEL_KEY)
    }


def to_record(weights: list[np.ndarray]):
    from flwr.app import ArrayRecord

    return ArrayRecord(numpy_ndarrays=[np.asarray(w) for w in weights])


def from_record(record) -> list[np.ndarray]:
    return record.to_numpy_ndarrays()
