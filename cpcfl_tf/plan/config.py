"""One configuration object, validated on construction.

``Config`` is the request: it groups the settings of a run into sections (data,
partition, pre-training, federated). Every section checks itself in ``__post_init__``
and raises :class:`~cpcfl_tf.errors.UserError` with one line that names the fix, so a
bad value stops a script before anything is loaded or written. ``dataclasses.replace``
re-runs the checks, so overrides are validated the same way. Building a config reads no
data: what needs a dataset's facts (its splits, their sizes, whether they hold labels)
is checked when the config is resolved into the run's plan,
:func:`cpcfl_tf.plan.resolve.resolve`.

The four presets are :mod:`cpcfl_tf.plan.presets`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cpcfl_tf.compat import UNSET_FIELDS, read_federated, stored_federated
from cpcfl_tf.errors import require
from cpcfl_tf.methods.starts import START
from cpcfl_tf.plan.sections import (
    SECTIONS,
    DataConfig,
    FederatedConfig,
    PartitionConfig,
    PretrainConfig,
    read_section,
    with_defaults,
)


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything a run needs; :meth:`to_dict` is what result files record."""

    preset: str
    data: DataConfig
    partition: PartitionConfig
    pretrain: PretrainConfig
    federated: FederatedConfig
    seed: int = 0

    def __post_init__(self) -> None:
        require(
            isinstance(self.seed, int) and self.seed >= 0,
            f"seed must be a non-negative integer, got {self.seed!r}",
        )
        _repeated_encoder(getattr(self.federated, "encoder", None), self.pretrain.encoder)
        START[self.federated.pretraining].check(self)  # where its images are, its settings

    @property
    def pretrain_seed(self) -> int:
        """The seed the server pre-trains this run's encoder with: ``pretrain.seed``, by
        default the run's own seed."""
        return self.seed if self.pretrain.seed is None else self.pretrain.seed

    def to_dict(self) -> dict[str, Any]:
        """The config as records store it (what :meth:`from_dict` reads): every field but
        :data:`cpcfl_tf.compat.UNSET_FIELDS` at their defaults, the pre-training section
        in its stored layout (:meth:`~cpcfl_tf.methods.starts.Start.recorded_pretrain`)."""
        record = dataclasses.asdict(self)
        record["pretrain"] = START[self.federated.pretraining].recorded_pretrain(self)
        record["federated"] = stored_federated(record["federated"], self.pretrain.encoder)
        for section, unset in UNSET_FIELDS.items():
            record[section] = {
                k: v for k, v in record[section].items() if k not in unset or v != unset[k]
            }
        return record

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        """The config :meth:`to_dict` gave (fields added to a section since then at their
        defaults), validated like any other."""
        extra = set(data) - set(SECTIONS) - {"preset", "seed"}
        require(not extra, f"unknown config section(s) {', '.join(sorted(extra))}")
        config = cls(
            preset=data["preset"],
            seed=data["seed"],
            **{
                name: SECTIONS[name](**with_defaults(name, read_section(name, data[name])))
                for name in SECTIONS
            },
        )
        _repeated_encoder(read_federated(data["federated"])[1], config.pretrain.encoder)
        return config

    def with_overrides(self, seed: int | None = None, **sections: dict[str, Any]) -> Config:
        """Copy with fields replaced per section, e.g. ``partition={"num_clients": 30}``,
        and with ``seed``, the run's seed (None: this one's)."""
        changes: dict[str, Any] = {} if seed is None else {"seed": seed}
        for name, fields in sections.items():
            require(
                name in ("data", "partition", "pretrain", "federated"),
                f"unknown config section {name!r}",
            )
            if name == "federated" and "encoder" in fields:  # may repeat pretrain's only
                _repeated_encoder(
                    fields["encoder"],
                    sections.get("pretrain", {}).get("encoder", self.pretrain.encoder),
                )
                fields = {k: v for k, v in fields.items() if k != "encoder"}
            section = _requested(getattr(self, name))
            known = {f.name for f in dataclasses.fields(section)}
            unknown = set(fields) - known
            require(
                not unknown,
                f"unknown field(s) {', '.join(sorted(unknown))} in {name}; "
                f"known: {', '.join(sorted(known))}",
            )
            changes[name] = dataclasses.replace(section, **fields)
        if "pretrain" in changes and changes["pretrain"].encoder != self.pretrain.encoder:
            # a plan's federated section builds the old encoder: requested again
            changes["federated"] = _requested(changes.get("federated", self.federated))
        return dataclasses.replace(self, **changes)


def _repeated_encoder(named: str | None, encoder: str) -> None:
    """``federated.encoder`` (a plan's, a record's, an old command line's) may only repeat
    ``pretrain.encoder``, the one setting."""
    require(
        named is None or named == encoder,
        f"federated.encoder {named} is not pretrain.encoder {encoder}: the encoder is one "
        f"setting of both stages, set pretrain.encoder={named}",
    )


def _requested(section):
    """A section in its requested form (a plan's resolved one as the values it holds)."""
    kind = next(k for k in SECTIONS.values() if isinstance(section, k))
    if type(section) is kind:
        return section
    return kind(**{f.name: getattr(section, f.name) for f in dataclasses.fields(kind)})
