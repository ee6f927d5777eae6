"""A run's settings as text: ``--set SECTION.FIELD=VALUE`` (the scripts' option, a Flower
run config's ``set``) parsed into the overrides :meth:`cpcfl_tf.plan.config.Config.with_overrides`
takes, each value by its field's type."""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Sequence
from typing import Any

from cpcfl_tf.errors import UserError, require
from cpcfl_tf.plan.sections import SECTIONS


def parse_settings(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["federated.rounds=200", "partition.num_clients=120", ...]`` as overrides per
    section (for :meth:`Config.with_overrides`), each value parsed by its field's type:
    integers, numbers, ``true``/``false``, ``none``, comma-separated integers for tuples,
    JSON for ``pretrain.augment``, ``pretrain.options`` and ``federated.options``, or one
    key at a time: ``pretrain.options.byol.target_decay=0.99`` (no JSON quoting: what a
    Flower run config's ``set`` can carry). Unknown sections or fields and
    values of the wrong type are a one-line :class:`UserError` naming what is allowed."""
    overrides: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        section, dot, name = key.strip().partition(".")
        require(bool(sep and dot and name), f"--set takes SECTION.FIELD=VALUE, got {item!r}")
        require(
            section in SECTIONS,
            f"unknown config section {section!r} in --set {item}; "
            f"choose one of {', '.join(SECTIONS)}",
        )
        fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
        name, _, path = name.partition(".")  # pretrain.options.byol.target_decay=0.99
        require(
            name in fields,
            f"unknown field {section}.{name} in --set; known: {', '.join(sorted(fields))}",
        )
        kind = typing.get_type_hints(SECTIONS[section])[name]
        if path:
            base = typing.get_origin(kind) or kind
            args = [a for a in typing.get_args(kind) if a is not type(None)]
            base = typing.get_origin(args[0]) if args and base is not dict else base
            require(
                base is dict,
                f"--set {section}.{name} is not a mapping; drop "
                f".{path} (e.g. {section}.{name}=VALUE)",
            )
            inner = overrides.setdefault(section, {}).setdefault(name, {})
            require(isinstance(inner, dict), f"--set {section}.{name} given twice")
            *parents, leaf = path.split(".")
            for key in parents:
                inner = inner.setdefault(key, {})
            inner[leaf] = _scalar(text.strip())
            continue
        overrides.setdefault(section, {})[name] = _parse_value(
            f"{section}.{name}", kind, text.strip()
        )
    return overrides


def _scalar(text: str) -> Any:
    """One value of a mapping set key by key (``pretrain.options.fed.rounds=5``): JSON
    (numbers, true/false, null, quoted strings), else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"none": None}.get(text.lower(), text)


def _parse_value(field: str, kind: Any, text: str) -> Any:
    optional = type(None) in typing.get_args(kind)  # X | None
    if optional:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
        if text.lower() in ("none", "null"):
            return None
    base = typing.get_origin(kind) or kind
    try:
        if base is bool:
            require(text.lower() in ("true", "false", "1", "0", "yes", "no"), "")
            return text.lower() in ("true", "1", "yes")
        if base is int:
            return int(text)
        if base is float:
            return float(text)
        if base is tuple:
            return tuple(int(v) for v in text.split(",") if v.strip())
        if base is dict:
            value = json.loads(text)
            require(isinstance(value, dict), "")
            return value
        return text
    except (ValueError, UserError):
        wanted = {
            bool: "true or false",
            int: "an integer",
            float: "a number",
            tuple: "comma-separated integers",
            dict: "a JSON object",
        }[base]
        none = " or none" if optional else ""
        raise UserError(f"--set {field} takes {wanted}{none}, got {text!r}") from None
