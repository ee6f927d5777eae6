"""What identifies a run: its requested config as a record keeps it (without where the
data is read from), as data (:func:`config_record`) and as a key (:func:`config_key`),
each made once per config (a results tree's records are found by them, thousands of
times in one report)."""

from __future__ import annotations

import json
from typing import Any

from cpcfl_tf.plan.config import Config


def config_record(config: Config) -> dict[str, Any]:
    """The part of ``config`` that decides a run's result (not where data is read from),
    as JSON-ready data: what a run record keeps as ``requested``."""
    return json.loads(_once(config, "record", lambda: json.dumps(_recorded(config))))


def config_key(config: Config) -> str:
    """What identifies a run: its requested config, without where data is read from."""
    return _once(config, "key", lambda: json.dumps(config_record(config), sort_keys=True))


def _recorded(config: Config) -> dict[str, Any]:
    record = config.to_dict()
    record["data"] = {
        k: v for k, v in record["data"].items() if k not in ("data_dir", "manual_dir")
    }
    return record


def _once(config: Config, what: str, make) -> str:
    """``make()``, kept on ``config`` (frozen, so its text never goes stale: a changed
    config is a new object) the way :func:`functools.cached_property` keeps a value."""
    kept = config.__dict__.setdefault("_identity", {})
    if what not in kept:
        kept[what] = make()
    return kept[what]
