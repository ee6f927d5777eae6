"""Methods from a researcher's own installed package, through Python entry points.

A package adds to the kit's registries without editing it by declaring entry points
(in its ``pyproject.toml``, ``[project.entry-points."cpcfl_tf.ssl_methods"]`` etc.), one
per entry, named as the entry's ``name``:

- ``cpcfl_tf.ssl_methods``: a :class:`~cpcfl_tf.methods.ssl.SSLMethod` (a
  self-supervised method of the server's pre-training; its ``module`` has
  ``build(parts, settings)``);
- ``cpcfl_tf.federated_ssl``: a :class:`~cpcfl_tf.methods.ssl.FederatedSSL` (a
  federated pre-training; its ``module`` has the hooks ``pretraining/fedavg_ssl.py`` has);
- ``cpcfl_tf.rules``: a :class:`~cpcfl_tf.methods.rules.Rule` instance or class (how a
  clustered-FL method puts its clients in clusters);
- ``cpcfl_tf.methods``: a :class:`~cpcfl_tf.methods.federated.Method` (a clustered-FL
  method; its ``assign`` names a rule, the kit's or a plugin's).

Each registry takes its group's entries at import, like its own, after them: a name the
kit has already, an entry of the wrong kind or one named unlike its entry point is refused
in one line naming the package. A run that uses a plugin's entry says so in its record's
``environment.plugins`` (the entry, its package and version). docs/extending.md.

This module imports nothing of the kit but its errors.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

from cpcfl_tf.errors import UserError

GROUPS = ("cpcfl_tf.ssl_methods", "cpcfl_tf.federated_ssl", "cpcfl_tf.rules", "cpcfl_tf.methods")
"""The entry-point groups the kit reads, one per registry."""

FROM: dict[tuple[str, str], str] = {}
"""(group, entry name) -> "package version" of every entry a plugin gave."""


def entries(group: str, kind: type, known: Mapping[str, Any]) -> dict[str, Any]:
    """The entries the installed packages give ``group``, by name: each loaded, a class
    instantiated, checked to be a ``kind`` named as its entry point and new to ``known``
    (the registry's own entries)."""
    found: dict[str, Any] = {}
    for point in sorted(importlib.metadata.entry_points(group=group), key=lambda p: p.name):
        dist = point.dist.name if point.dist is not None else None
        version = point.dist.version if point.dist is not None else ""
        package = f"{dist} {version}" if dist else "an unnamed package"
        where = f"entry point {point.name!r} of {package} ({group})"
        try:
            entry = point.load()
        except Exception as err:  # a plugin's own error, said in one line
            raise UserError(
                f"{where} could not be loaded: {type(err).__name__}: {err}; "
                f"fix or uninstall {dist or 'the package'}"
            ) from None
        if isinstance(entry, type):
            entry = entry()
        if not isinstance(entry, kind):
            raise UserError(f"{where} is a {type(entry).__name__}, not a {kind.__name__}")
        if getattr(entry, "name", None) != point.name:
            raise UserError(
                f"{where} names a {kind.__name__} called "
                f"{getattr(entry, 'name', None)!r}: name them alike"
            )
        if point.name in known or point.name in found:
            raise UserError(
                f"{where}: the kit has a {kind.__name__} {point.name!r} already; "
                "give the plugin's another name"
            )
        found[point.name] = entry
        FROM[(group, point.name)] = package
    return found


def used(**names: str) -> dict[str, str]:
    """Of the entries a run uses, by kind (``method=``, ``rule=``, ``ssl_method=``,
    ``federated_ssl=``; "": none), those a plugin gave: ``"kind name" -> "package version"``
    (empty for a run of the kit's own methods)."""
    groups = {
        "method": "cpcfl_tf.methods",
        "rule": "cpcfl_tf.rules",
        "ssl_method": "cpcfl_tf.ssl_methods",
        "federated_ssl": "cpcfl_tf.federated_ssl",
    }
    return {
        f"{kind} {name}": FROM[(groups[kind], name)]
        for kind, name in names.items()
        if name and (groups[kind], name) in FROM
    }
