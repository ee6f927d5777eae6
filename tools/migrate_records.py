"""Rewrite run records written by an older kit in today's layout.

Reads every run record (a JSON file with ``config``, ``rounds`` and ``final``) under the
given folders, and writes it back as :class:`cpcfl_tf.records.record.RunRecord` writes it now:
config fields added since then at their defaults, ``pretrain.method`` dropped (the
method is ``federated.pretraining``). Seeds, clients, rounds, cluster ids, metrics and
timing are checked to come out unchanged to the byte; a record that would change there
is left alone and reported. Records already in today's layout are not touched.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import ArgumentParser, UserError, run_cli

KEPT = ("experiment", "preset", "method", "pretraining", "seeds", "nodes", "clients", "rounds",
        "final", "timing", "environment")
"""What a migration must leave exactly as it was."""


def migrate(data: dict) -> dict:
    """``data`` (an older run record) in today's layout."""
    from cpcfl_tf.records.record import RunRecord

    data = json.loads(json.dumps(data))
    for section in (data["config"], data["config"].get("requested", {})):
        section.get("pretrain", {}).pop("method", None)  # now federated.pretraining
    return RunRecord.from_json(data).to_json()


def is_run_record(data) -> bool:
    return isinstance(data, dict) and {"config", "rounds", "final"} <= set(data)


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="python tools/migrate_records.py",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", default=["results"],
                        help="folders to search for run records (default: results)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a record is not in today's layout")
    args = parser.parse_args(argv)
    missing = [f for f in args.folders if not Path(f).is_dir()]
    if missing:
        raise UserError(f"no folder {missing[0]}; pass folders that hold run records")

    from cpcfl_tf.records.files import read_json, write_json

    migrated, current, refused = [], 0, []
    for path in sorted(p for f in args.folders for p in Path(f).rglob("*.json")):
        data = read_json(path, fix="restore it (e.g. git checkout) or delete it")
        if not is_run_record(data):
            continue
        new = migrate(data)
        if new == data and path.read_text() == json.dumps(new, indent=1) + "\n":
            current += 1
            continue
        if any(json.dumps(data.get(k)) != json.dumps(new.get(k)) for k in KEPT):
            refused.append(path)
            continue
        migrated.append(path)
        if not args.check:
            write_json(path, new)
    verb = "to migrate" if args.check else "migrated"
    print(f"{len(migrated)} {verb}, {current} already current, {len(refused)} refused")
    for path in refused:
        print(f"refused (its rounds, clients or metrics would change): {path}")
    if refused or (args.check and migrated):
        raise SystemExit(1)


if __name__ == "__main__":
    run_cli(main)
