"""Check that the code rebuilds a committed results tree byte for byte.

Copies ``results/<preset>`` (or ``--results``) and ``results/README.md`` into a sandbox
laid out like the repository (``<sandbox>/results/<preset>``), runs every script there
from the sandbox, as the kit's own tree, and compares the two trees file by file:
``experiments/all.py`` (each of the paper's tables whose folder the tree holds, and the
report), then each script beyond the paper whose folder the tree holds, then
``experiments/claims.py``. Finished runs are skipped, so only reports, CSVs and figures
are rewritten from the run records. A script made of runs is asked with ``--dry-run``
first; one that would make a run (one it takes from another folder only on the machine
kind that made it, say) is not run: it is listed as not checked here, with what it would
make. Exit status 0 when nothing changed, 1 with the list of files that changed,
appeared or went missing. A refactoring that is meant to change no result passes this on
every preset; ``experiments/compare.py`` checks re-made runs against the committed
records bit for bit.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from cpcfl_tf.errors import ArgumentParser, UserError, run_cli
from cpcfl_tf.plan.presets import PRESETS
from cpcfl_tf.running.script import load_script

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
BEYOND = {"cfl_families": ("--report",), "clustering_reliability": ("--report",),
          "encoder_selection": (), "federated_pretraining": ("--report",),
          "local_optimizer": (), "partition": (), "personalization": ("--report",)}
"""The scripts beyond ``experiments/all.py``'s whose folder a tree may hold, with the
options that make them write their report from what is kept (no run, no scoring).
``--report`` makes nothing, so a folder of some of a study's runs is checked too; a
script without it is run with ``--resume`` where its dry run would make nothing."""
MAKES = (": to run", ": to resume", "to pre-train", "to train")
"""What a dry run's line says when the script would make something."""


def digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under ``root``, by path relative to it, but for the hidden
    ones (``.*``: an interrupted run's checkpoint, a cache lock), which git ignores and a
    run under way rewrites."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def differences(before: Path, after: Path) -> list[str]:
    """``changed``/``new``/``missing PATH`` for every file that differs between the trees."""
    old, new = digests(before), digests(after)
    return ([f"changed {p}" for p in old if p in new and old[p] != new[p]]
            + [f"new {p}" for p in new if p not in old]
            + [f"missing {p}" for p in old if p not in new])


def _run(command: list[str], sandbox: Path, capture: bool = False) -> subprocess.CompletedProcess:
    print("$", " ".join([Path(command[1]).relative_to(EXPERIMENTS.parent).as_posix(),
                         *command[2:]]), flush=True)
    env = {**os.environ, "CPCFL_CACHE": str(Path(os.environ.get("CPCFL_CACHE", "cache"))
                                            .expanduser().resolve())}
    return subprocess.run(command, cwd=sandbox, env=env, text=True,
                          capture_output=capture)


def would_make(name: str, preset: str, sandbox: Path) -> list[str]:
    """The lines of ``name``'s dry run in the sandbox that say it would make something."""
    done = _run([sys.executable, str(EXPERIMENTS / f"{name}.py"), "--preset", preset,
                 "--dry-run"], sandbox, capture=True)
    if done.returncode != 0:
        raise UserError(f"{name}.py --dry-run failed in the sandbox: "
                        f"{done.stderr.strip().splitlines()[-1:]}")
    return [line.strip() for line in done.stdout.splitlines()
            if any(word in line for word in MAKES)]


def not_checkable(name: str, preset: str, sandbox: Path) -> str | None:
    """Why ``name`` cannot be rebuilt from the sandbox's records (a script made of runs
    whose dry run would make one), or None."""
    making = would_make(name, preset, sandbox) if _load(name).SCRIPT.runs else []
    return (f"{name}: not checked here, it would make {len(making)} thing(s), e.g. "
            f"{making[0]}") if making else None


def _must_run(script: str, args: list[str], sandbox: Path) -> None:
    """Run ``experiments/<script>.py args`` in the sandbox; a one-line error if it fails."""
    if _run([sys.executable, str(EXPERIMENTS / f"{script}.py"), *args], sandbox).returncode:
        raise UserError(f"experiments/{script}.py failed in the sandbox (its error is above)")


def rebuild(preset: str, sandbox: Path, scripts: list[str] | None) -> list[str]:
    """Run every script over the sandbox's tree; the scripts not checked, with why."""
    tree = sandbox / "results" / preset
    table_scripts = _load("all").SCRIPTS
    wanted = scripts or [*table_scripts, *BEYOND, "claims"]
    unknown = set(wanted) - {*table_scripts, *BEYOND, "claims"}
    if unknown:
        raise UserError(f"unknown script(s) {', '.join(sorted(unknown))}; known: "
                        + ",".join([*table_scripts, *BEYOND, "claims"]))
    unchecked: list[str] = []
    tables: list[str] = []
    for name in [s for s in table_scripts if s in wanted and (tree / s).is_dir()]:
        why = not_checkable(name, preset, sandbox)
        (unchecked if why else tables).append(why or name)
    if tables:
        _must_run("all", ["--preset", preset, "--scripts", ",".join(tables)], sandbox)
    for name in [s for s in BEYOND if s in wanted and (tree / s).is_dir()]:
        why = None if "--report" in BEYOND[name] else not_checkable(name, preset, sandbox)
        if why:
            unchecked.append(why)
        else:
            _must_run(name, ["--preset", preset, "--resume", *BEYOND[name]], sandbox)
    if "claims" in wanted and (tree / "claims.md").exists():
        _must_run("claims", ["--preset", preset], sandbox)
    return unchecked


def _load(name: str) -> ModuleType:
    """``experiments/<name>.py`` as a module."""
    return load_script(EXPERIMENTS / f"{name}.py")


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="python tools/results_unchanged.py",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="quick", choices=list(PRESETS),
                        help="the preset whose tree to rebuild (default quick)")
    parser.add_argument("--results", type=Path,
                        help="the tree to check (default: results/<preset>)")
    parser.add_argument("--scripts", help="the scripts to run, comma-separated: all.py's, "
                                          "those beyond the paper, claims (default: all)")
    args = parser.parse_args(argv)
    tree = args.results or Path("results") / args.preset
    if not tree.is_dir():
        raise UserError(f"no results tree at {tree}: give --results DIR")
    scripts = args.scripts.split(",") if args.scripts else None
    readme = tree.parent / "README.md"
    with tempfile.TemporaryDirectory(prefix="cpcfl-unchanged-") as tmp:
        sandbox = Path(tmp)
        copy = sandbox / "results" / args.preset
        shutil.copytree(tree, copy)
        if readme.is_file():
            shutil.copy2(readme, copy.parent / "README.md")
        unchecked = rebuild(args.preset, sandbox, scripts)
        found = differences(tree, copy)
        if readme.is_file() and readme.read_bytes() != (copy.parent / "README.md").read_bytes():
            found.append(f"changed {readme}")
    for line in [*unchecked, *found]:
        print(line)
    print(f"{tree}: {'unchanged' if not found else f'{len(found)} files differ'}"
          + (f" ({len(unchecked)} script(s) not checked here)" if unchecked else ""))
    if found:
        raise SystemExit(1)


if __name__ == "__main__":
    run_cli(main)
