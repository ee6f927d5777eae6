"""Check that the code rebuilds a committed results tree byte for byte.

Copies ``results/<preset>`` (or ``--results``) to a temporary folder, runs
``experiments/all.py`` on the copy (finished runs are skipped, so only the reports, CSVs
and figures are rewritten from the run records; a missing run would be made), and compares
the two trees file by file. Exit status 0 when nothing changed, 1 with the list of files
that changed, appeared or went missing. A refactoring that is meant to change no result
passes this on every preset; ``experiments/compare.py`` checks re-made runs against the
committed records bit for bit.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from cpcfl_tf.config import PRESETS
from cpcfl_tf.errors import ArgumentParser, UserError, run_cli

ALL = Path(__file__).resolve().parents[1] / "experiments" / "all.py"


def digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, by path relative to it."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def differences(before: Path, after: Path) -> list[str]:
    """``changed``/``new``/``missing PATH`` for every file that differs between the trees."""
    old, new = digests(before), digests(after)
    return ([f"changed {p}" for p in old if p in new and old[p] != new[p]]
            + [f"new {p}" for p in new if p not in old]
            + [f"missing {p}" for p in old if p not in new])


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="python tools/results_unchanged.py",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="quick", choices=list(PRESETS),
                        help="the preset whose tree to rebuild (default quick)")
    parser.add_argument("--results", type=Path,
                        help="the tree to check (default: results/<preset>)")
    parser.add_argument("--scripts", help="passed to experiments/all.py (default: all)")
    args = parser.parse_args(argv)
    tree = args.results or Path("results") / args.preset
    if not tree.is_dir():
        raise UserError(f"no results tree at {tree}: give --results DIR")
    with tempfile.TemporaryDirectory(prefix="cpcfl-unchanged-") as tmp:
        copy = Path(tmp) / tree.name
        shutil.copytree(tree, copy)
        command = [sys.executable, str(ALL), "--preset", args.preset, "--out", str(copy),
                   *(["--scripts", args.scripts] if args.scripts else [])]
        print("$", " ".join(command[1:]), flush=True)
        if subprocess.run(command).returncode != 0:
            raise UserError("experiments/all.py failed on the copy (its error is above)")
        found = differences(tree, copy)
    for line in found:
        print(line)
    print(f"{tree}: {'unchanged' if not found else f'{len(found)} files differ'}")
    if found:
        raise SystemExit(1)


if __name__ == "__main__":
    run_cli(main)
