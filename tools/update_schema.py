"""Write the kit's method and starting-encoder names into the run record's schema.

``docs/run-record.schema.json`` is the contract outside tools read, so it lists the kit's
values of ``method`` and ``pretraining`` literally (and accepts any other name, an
installed plugin's: ``cpcfl_tf.plugins``). They come from the kit's two registries
(:data:`cpcfl_tf.methods.federated.METHODS`, :data:`cpcfl_tf.methods.federated.START_LABELS`,
which reads :data:`cpcfl_tf.methods.ssl.SSL_METHODS`); after adding a method,
run::

    python tools/update_schema.py           # rewrite the two lists
    python tools/update_schema.py --check   # exit 1 if they are out of date

Only those two lines change; the rest of the file is written by hand.
"""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import ArgumentParser, run_cli

SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "run-record.schema.json"


def updated(text: str) -> str:
    """``text`` (the schema) with the kit's own names the registries give (an installed
    plugin's are left out: a record may name one when its ``environment.plugins`` does)."""
    from cpcfl_tf.methods.federated import METHODS, START_LABELS, plugins_used

    own_methods = [m for m in METHODS if not any(
        k.startswith(("method ", "rule ")) for k in plugins_used(m, "none"))]
    own_starts = [s for s in START_LABELS if s == "none" or not plugins_used("fedavg", s)]
    for key, names in (("kit_methods", own_methods), ("kit_starts", own_starts)):
        line = f'    "{key}": {{"enum": {json.dumps(names)}}},'
        text, found = re.subn(rf'^    "{key}": {{"enum": \[.*\]}},$', line, text, count=1,
                              flags=re.M)
        assert found == 1, f"no {key} enum in {SCHEMA}'s $defs"
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="python tools/update_schema.py",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args(argv)
    text = SCHEMA.read_text()
    new = updated(text)
    if args.check:
        print("current" if new == text else "out of date: run python tools/update_schema.py")
        sys.exit(0 if new == text else 1)
    SCHEMA.write_text(new)
    print("unchanged" if new == text else f"updated {SCHEMA}")


if __name__ == "__main__":
    run_cli(main)
