"""The whole suite on every core: ``python tests/parallel.py [-n WORKERS] [PYTEST ARGS]``.

Most tests run small tensors, where TensorFlow keeps one core busy, so one pytest
process leaves the other core of a 2-core machine idle for most of the suite. This runs
one pytest process per slow test file (one for the medium files, one for all the fast
files), ``WORKERS`` at a time (default: the number of CPUs), slowest first so the last to
finish are short. Every
process gets its own ``--basetemp``, so its temporary files and encoder cache are its own
and the tests need no change; ``python -m pytest -q`` runs the same tests in one process.

A file's summary line is printed when it ends, its whole output if it failed; the exit
status is 0 when every process passed (or collected nothing under ``-k``), else the
first failing process's pytest status.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SLOW = ["test_flower.py", "test_scripts.py", "test_table2.py", "test_simulator.py",
        "test_flower_nodes.py", "test_experiments.py", "test_linear_eval.py",
        "test_reliability.py", "test_contrastive.py", "test_mirrored.py"]
"""Slowest first (seconds in a one-process run, ``--durations``), one process each. The
order only decides how well the processes fill the cores; a file missing from every list
runs in a process of its own after these. (``test_mirrored.py`` must be alone: it sets
TensorFlow's logical devices before anything else initialises them.)"""
MEDIUM = ["test_families.py", "test_cli.py", "test_committed_tables.py", "test_results.py",
          "test_claims.py", "test_parallel.py"]
"""Files of 20-45 s each: one process for all, so TensorFlow is imported and the session
fixtures built once rather than six times."""
FAST = ["test_algorithm.py", "test_centralized.py", "test_config.py", "test_docs.py",
        "test_folder_source.py", "test_methods.py", "test_metrics.py",
        "test_layers.py", "test_models.py", "test_partition.py", "test_record_schema.py",
        "test_sources.py"]
"""Files of a few seconds each: one process for all, so TensorFlow is imported once."""
NOTHING_COLLECTED = 5  # pytest's exit status when -k leaves a process no test


def jobs(folder: Path = HERE) -> list[list[str]]:
    """The test files, grouped into one list per pytest process, slowest first."""
    files = sorted(p.name for p in folder.glob("test_*.py"))
    slow = [f for f in SLOW if f in files]
    alone = [f for f in files if f not in SLOW + MEDIUM + FAST]
    medium, fast = ([f for f in group if f in files] for group in (MEDIUM, FAST))
    return [[f] for f in slow] + ([medium] if medium else []) + [[f] for f in alone] \
        + ([fast] if fast else [])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--workers", type=int, default=os.cpu_count() or 1,
                        help="pytest processes at a time (default: the number of CPUs)")
    parser.add_argument("--folder", type=Path, default=HERE, help=argparse.SUPPRESS)
    args, pytest_args = parser.parse_known_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    queue, running, statuses = jobs(args.folder), [], []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cpcfl-tests-") as tmp:
        while queue or running:
            while queue and len(running) < args.workers:
                files = queue.pop(0)
                log = Path(tmp) / f"{files[0]}.log"
                command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--basetemp={Path(tmp) / files[0].removesuffix('.py')}",
                           *(str(args.folder / f) for f in files), *pytest_args]
                with log.open("w") as out:
                    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            cwd=HERE.parent)
                running.append((proc, files, log, time.monotonic()))
            time.sleep(0.5)
            for job in [j for j in running if j[0].poll() is not None]:
                running.remove(job)
                proc, files, log, began = job
                text = log.read_text()
                lines = text.strip().splitlines() or ["(no output)"]
                name = files[0] if len(files) == 1 else f"{len(files)} fast files"
                print(f"{name}: {lines[-1].strip('= ')} ({time.monotonic() - began:.0f} s)",
                      flush=True)
                if proc.returncode not in (0, NOTHING_COLLECTED):
                    print(text, flush=True)
                statuses.append(proc.returncode)
    failed = [s for s in statuses if s not in (0, NOTHING_COLLECTED)]
    print(f"{len(statuses)} pytest processes, {args.workers} at a time: "
          f"{'all passed' if not failed else f'{len(failed)} failed'} in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    if failed:
        return failed[0]
    return NOTHING_COLLECTED if statuses and all(s == NOTHING_COLLECTED for s in statuses) else 0


if __name__ == "__main__":
    sys.exit(main())
