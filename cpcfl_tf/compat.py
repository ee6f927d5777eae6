"""Compatibility with what older versions of the kit wrote: the one place for it.

Three kinds of stored things outlive the code that wrote them: run records (committed
under ``results/`` and in users' folders), encoder and FedAvg cache entries (``$CPCFL_CACHE``)
and checkpoints of interrupted runs. A config field added later must not make them
unreadable or unfindable, nor change the bytes of a record rewritten with the same
settings. So a new field whose default runs as before goes in:

- :data:`ADDED_FIELDS`, left out of cache keys and checkpoint fingerprints at that value
  (:func:`without_added`), so that entries stored before the field are found again;
- :data:`UNSET_FIELDS`, left out of run records at that value, so that records written
  before it stay byte for byte (reading fills every missing field with its default:
  :func:`cpcfl_tf.config.with_defaults`).

Records in an older *layout* are rewritten once by ``python tools/migrate_records.py``.

When this can go: an entry here can be dropped in a release that declares the caches
and checkpoints of earlier versions void (users pre-train again) and rewrites the
committed records with ``tools/migrate_records.py``; until then, removing one silently
re-trains every cached encoder whose key would change.
"""
from __future__ import annotations

from typing import Any

ADDED_FIELDS: dict[str, dict[str, Any]] = {
    "partition": {"kind": "groups", "alpha": 1.0},
    "federated": {"jit_compile": False, "options": None, "eval_every": 1},
    "pretrain": {"seed": None},
}
"""Fields added after cache entries and checkpoints were first written, each with the
value that runs as before it existed."""

UNSET_FIELDS: dict[str, dict[str, Any]] = {"federated": {"options": None, "eval_every": 1},
                                           "pretrain": {"seed": None}}
"""Fields a run record leaves out while they are at this value (read back at their
defaults)."""


def without_added(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (a config as a dict, or some of its sections) without the
    :data:`ADDED_FIELDS` at their defaults: what cache keys and checkpoint fingerprints
    hash."""
    def section(name: str, values: dict[str, Any]) -> dict[str, Any]:
        added = ADDED_FIELDS.get(name, {})
        return {k: v for k, v in values.items() if k not in added or v != added[k]}
    return {k: section(k, v) if isinstance(v, dict) else v for k, v in record.items()}


def pretrain_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A ``PretrainConfig`` as a dict, as pre-training cache keys and summaries name it:
    without :data:`ADDED_FIELDS` at their defaults, and without ``seed`` (the seed a
    pre-training ran with is named beside its settings, whatever chose it)."""
    return {k: v for k, v in without_added({"pretrain": settings})["pretrain"].items()
            if k != "seed"}
