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
  :func:`cpcfl_tf.plan.sections.with_defaults`).

Records in an older *layout* are rewritten once by ``python tools/migrate_records.py``.

When this can go: an entry here can be dropped in a release that declares the caches
and checkpoints of earlier versions void (users pre-train again) and rewrites the
committed records with ``tools/migrate_records.py``; until then, removing one silently
re-trains every cached encoder whose key would change.
"""

from __future__ import annotations

from typing import Any

ADDED_FIELDS: dict[str, dict[str, Any]] = {
    "partition": {"kind": "groups", "alpha": 1.0, "unlabeled": "server"},
    "federated": {
        "jit_compile": False,
        "options": None,
        "eval_every": 1,
        "aggregation": "mean",
        "trim_fraction": 0.2,
        "update_norm": None,
        "frozen_features": False,
    },
    "pretrain": {"seed": None, "options": None, "lr_schedule": "constant", "warmup_epochs": 0},
}
"""Fields added after cache entries and checkpoints were first written, each with the
value that runs as before it existed."""

UNSET_FIELDS: dict[str, dict[str, Any]] = {
    "partition": {"unlabeled": "server"},
    "federated": {
        "options": None,
        "eval_every": 1,
        "aggregation": "mean",
        "trim_fraction": 0.2,
        "update_norm": None,
        "frozen_features": False,
    },
    "pretrain": {"seed": None, "options": None, "lr_schedule": "constant", "warmup_epochs": 0},
}
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


def changed_behaviour(federated: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint fingerprint adds for a setting whose behaviour changed since
    checkpoints were written with it, so that such a checkpoint is refused ("belongs to a
    different run") instead of resumed under the new behaviour: ``trimmed-mean`` cuts at
    least one member of three or more from each end (it cut ``int(0.2 * n)``, none of
    3 or 4, before). Empty at every default."""
    if federated.get("aggregation") == "trimmed-mean":
        return {"trimmed_mean_cut": "at least one of three"}
    return {}


LEGACY_PRETRAIN: dict[str, tuple[Any, tuple[str, ...]]] = {
    "temperature": (0.1, ("simclr",)),
    "target_decay": (0.9, ("byol",)),
    "projector_dim": (None, ("simclr", "byol", "simsiam")),
    "predictor_dim": (64, ("byol", "simsiam")),
}
"""Settings of SimCLR, BYOL and SimSiam that the pre-training section stored as flat
fields (after ``learning_rate``) before the methods' settings moved to
``pretrain.options``: field -> (its default, the methods whose setting it is). Records,
cache keys and checkpoint fingerprints still spell them so: :func:`stored_pretrain` writes
this layout, :func:`read_pretrain` reads it back."""
_LEGACY_AFTER = "learning_rate"

ADDED_SETTINGS: dict[str, dict[str, Any]] = {"byol": {"target_schedule": "constant"}}
"""Settings a method of the paper gained after records named its settings, with the value
that runs as before: a record names them only when set otherwise (a method added later
has all of its settings named from the start)."""


KEYED_DEFAULTS: dict[str, dict[str, Any]] = {
    "simclr": {"temperature": 0.1, "projector_dim": None},
    "byol": {"target_decay": 0.9, "projector_dim": None, "predictor_dim": 64},
    "simsiam": {"projector_dim": None, "predictor_dim": 64},
    "vicreg": {
        "sim_weight": 25.0,
        "var_weight": 25.0,
        "cov_weight": 1.0,
        "gamma": 1.0,
        "epsilon": 1e-4,
        "projector_dim": None,
    },
}
"""Each self-supervised method's settings as the cache keys and checkpoint fingerprints
of its pre-trainings assume them: a key names only the settings whose value differs from
these (:func:`cpcfl_tf.pretraining.pretrain.keyed_settings`). So a registry default
changed later is named in every key made after it, and an encoder cached under the old
default is never taken for the new one. A setting added later to a method listed here goes in
:data:`ADDED_SETTINGS` with the value that runs as before (records and keys then leave it
out at that value; a test checks every setting of these methods is in one of the two). A
method not listed (added later, or a plugin's) has every setting named in its keys."""


def _legacy_value(options: dict, field: str, method: str | None) -> Any:
    """The flat field's value: ``method``'s own if it has the setting, else the value all
    its methods agree on, else the default."""
    default, owners = LEGACY_PRETRAIN[field]

    def value(m: str) -> Any:
        return options.get(m, {}).get(field, default)

    if method in owners:
        return value(method)
    values = [value(m) for m in owners]
    return values[0] if all(v == values[0] for v in values) else default


def stored_pretrain(
    section: dict[str, Any],
    method: str | None = None,
    resolved: dict[str, Any] | None = None,
    *,
    others: bool = True,
) -> dict[str, Any]:
    """A ``PretrainConfig`` as a dict (``dataclasses.asdict``) in the layout records and
    keys have always used: the :data:`LEGACY_PRETRAIN` fields flat after
    ``learning_rate``, with ``method``'s values (the run's or the key's method), and
    ``options`` holding only what they cannot say. ``resolved``, when given, is every
    setting of ``method`` with its value (a run record names them all; a key only those
    set away from their defaults). ``others=False`` leaves out the entries that only
    keep the other methods' values apart from the flat ones (a key names one method)."""
    options = {m: dict(v) for m, v in (section.get("options") or {}).items()}
    legacy = {f: _legacy_value(options, f, method) for f in LEGACY_PRETRAIN}
    rest: dict[str, dict[str, Any]] = {}
    if resolved is not None and method is not None:
        added = ADDED_SETTINGS.get(method, {})
        resolved = {k: v for k, v in resolved.items() if k not in added or v != added[k]}
    wanted = {**options, **({method: resolved} if resolved else {})}
    for m, values in wanted.items():
        for field, value in values.items():
            said = (
                field in LEGACY_PRETRAIN
                and m in LEGACY_PRETRAIN[field][1]
                and value == legacy[field]
            )
            if not said:
                rest.setdefault(m, {})[field] = value
    for field, (default, owners) in LEGACY_PRETRAIN.items():  # owners the flat value misdescribes
        for m in owners if others else ():
            value = options.get(m, {}).get(field, default)
            if value != legacy[field]:
                rest.setdefault(m, {})[field] = value
    out: dict[str, Any] = {}
    for key, value in section.items():
        out[key] = (
            {m: dict(sorted(v.items())) for m, v in sorted(rest.items())} or None
            if key == "options"
            else value
        )
        if key == _LEGACY_AFTER:
            out.update(legacy)
    return out


_FEDERATED_ENCODER_AFTER = "learning_rate"
"""The encoder is one setting, ``pretrain.encoder`` (both stages build it); the federated
section had a copy of its own, after this field. Records, cache keys and checkpoint
fingerprints still name it there: :func:`stored_federated` writes it,
:func:`read_federated` takes it out."""


def stored_federated(section: dict[str, Any], encoder: str) -> dict[str, Any]:
    """A federated section as records and keys have always spelled it: ``encoder`` (the
    run's ``pretrain.encoder``) after ``learning_rate``."""
    out: dict[str, Any] = {}
    for key, value in section.items():
        if key != "encoder":
            out[key] = value
        if key == _FEDERATED_ENCODER_AFTER:
            out["encoder"] = encoder
    return out


def read_federated(stored: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A stored federated section as ``FederatedConfig`` fields, and the encoder it names
    (None: it names none)."""
    return {k: v for k, v in stored.items() if k != "encoder"}, stored.get("encoder")


def read_pretrain(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored pre-training section (:func:`stored_pretrain`'s layout, or an older one
    without ``options``) as ``PretrainConfig`` fields: each flat legacy field's value
    becomes its methods' setting, ``options`` over them."""
    fields = {k: v for k, v in stored.items() if k not in LEGACY_PRETRAIN}
    options: dict[str, dict[str, Any]] = {}
    for field, (default, owners) in LEGACY_PRETRAIN.items():
        if field in stored and stored[field] != default:
            for m in owners:
                options.setdefault(m, {})[field] = stored[field]
    for m, values in (stored.get("options") or {}).items():
        options.setdefault(m, {}).update(values)
    fields["options"] = options or None
    return fields


def pretrain_settings(settings: dict[str, Any], method: str | None = None) -> dict[str, Any]:
    """A ``PretrainConfig`` as a dict, as pre-training cache keys and summaries name it:
    the stored layout with ``method``'s settings (:func:`stored_pretrain`; another
    method's options left out), without :data:`ADDED_FIELDS` at their defaults, and
    without ``seed`` (the seed a pre-training ran with is named beside its settings,
    whatever chose it)."""
    if method is not None:
        options = settings.get("options") or {}
        settings = {
            **settings,
            "options": ({method: options[method]} if method in options else None),
        }
    layout = stored_pretrain(settings, method, others=method is None)
    return {k: v for k, v in without_added({"pretrain": layout})["pretrain"].items() if k != "seed"}
