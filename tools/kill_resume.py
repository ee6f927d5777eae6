"""Reliability: a run killed at any moment and resumed ends exactly as an uninterrupted one.

Runs one CP-CFL (SimCLR) run of the preset from an empty encoder cache, uninterrupted, in
a child process. Then runs it again in a fresh folder and cache, killing the child with
SIGKILL ``--kills`` times: the first kills land while a cache entry, a run checkpoint and
the result are being written (the child kills itself between writing a file's temporary
copy and renaming it), the others at random moments (at the latest while the result is
written, should the run get there first on a machine that got faster). After every kill
it resumes (``--resume``). At the end the record must equal the uninterrupted one (timing
and environment aside), every file the kit wrote must read back, and no partial file may
be left. Writes ``kill_resume.json`` and ``kill_resume.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cpcfl_tf.errors import run_cli
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.running.script import Script

KILL = "CPCFL_KILL"
"""Child only, when to SIGKILL itself: ``write:<kind>:<n>`` at its n-th write of that kind
(cache entry, checkpoint, result), between writing the temporary copy and renaming it;
``moment:<n>:<seconds>`` that long after its n-th write of any kind."""
SPEC = ("cp-cfl-simclr", "cp-cfl", "simclr")


def run_config(preset: str, seed: int, kills: int):
    """The preset with enough rounds that every planned kill finds the run unfinished."""
    from cpcfl_tf.plan.presets import get_preset

    config = get_preset(preset).with_overrides(seed=seed)
    rounds = max(config.federated.rounds, kills + 2)
    return config.with_overrides(federated={"rounds": rounds})


def kind(path: str) -> str:
    if path.startswith("cache"):
        return "cache entry"
    return "checkpoint" if path.endswith(".ckpt.npz") else "result"


def child(folder: Path, preset: str, seed: int, kills: int) -> None:
    """One attempt at the run in ``folder`` (runs/ and cache/), resuming what is there.
    Prints every file it writes, so the parent knows where each kill landed."""
    import threading

    import cpcfl_tf.records.files as results
    from cpcfl_tf.running.runner import Runner, RunSpec

    plan = os.environ.get(KILL, "").split(":")
    counts: dict[str, int] = {}
    replace = os.replace

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def counted(src, dst):
        if results.PARTIAL in Path(src).name:
            what = kind(str(Path(dst).relative_to(folder)))
            for key in (what, "any"):
                counts[key] = counts.get(key, 0) + 1
            print(f"write: {Path(dst).relative_to(folder)}", flush=True)
            if plan[0] == "write" and plan[1] == what and counts[what] == int(plan[2]):
                die()
            if plan[0] == "moment" and what == "result":
                die()  # the moment would come after the run's end (a busy machine sped up)
            out = replace(src, dst)
            if plan[0] == "moment" and counts["any"] == int(plan[1]):
                timer = threading.Timer(float(plan[2]), die)
                timer.daemon = True  # a run that ends first is not killed on its way out
                timer.start()
            return out
        return replace(src, dst)

    results.os.replace = counted  # type: ignore[assignment]  # counts the kit's writes
    os.environ["CPCFL_CACHE"] = str(folder / "cache")
    runner = Runner("kill_resume", run_config(preset, seed, kills), folder / "runs",
                    context=RunContext(resume=True, verbose=0))
    runner.run(RunSpec(*SPEC))


def attempt(folder: Path, preset: str, seed: int, kills: int, plan: str = ""
            ) -> tuple[int, list[str], float]:
    """Run the child once: ``(exit status, files it wrote, seconds)``."""
    env = dict(os.environ, **{KILL: plan}, TF_CPP_MIN_LOG_LEVEL="3")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, __file__, "--child", str(folder), "--preset", preset,
                           "--seed", str(seed), "--kills", str(kills)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    writes = [line.split(": ", 1)[1] for line in proc.stdout.splitlines()
              if line.startswith("write: ")]
    return proc.returncode, writes, time.monotonic() - started


def plans(kills: int, rng: np.random.Generator, seconds_per_round: float) -> list[str]:
    """A cache-entry write first, the result write last, and between them kills at the
    second checkpoint write of an attempt and at random moments after its first write
    (each lets the run advance at least a round before it dies)."""
    middle = ["write:checkpoint:2" if k % 2 == 0 else
              f"moment:1:{rng.uniform(0.0, 2.0 * seconds_per_round):.2f}"
              for k in range(max(0, kills - 2))]
    return (["write:cache entry:1"] + middle + ["write:result:1"])[:kills]


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("timing", "environment")}


def leftovers(folder: Path) -> list[str]:
    """Partial files, and files the kit wrote that do not read back."""
    import keras

    from cpcfl_tf.records.files import PARTIAL

    bad = [str(p.relative_to(folder)) for p in folder.rglob(f"*{PARTIAL}*")]
    for path in folder.rglob("*.json"):
        try:
            json.loads(path.read_text())
        except ValueError:
            bad.append(f"{path.relative_to(folder)} (not JSON)")
    for path in folder.rglob("*.keras"):
        try:
            keras.models.load_model(path)
        except Exception:
            bad.append(f"{path.relative_to(folder)} (not a model)")
    return bad


SCRIPT = Script(__file__, __doc__, default_preset="smoke", distribute=False,
                runs=False)


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs (default 10)")
    parser.add_argument("--work", help="keep the two runs (and their encoder caches) in this "
                                       "folder (default: a temporary one, removed at the end)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the parent's own child runs
    args = parser.parse_args(argv)
    if args.child:
        return child(Path(args.child), args.preset, args.seed, args.kills)
    if args.kills < 0:
        from cpcfl_tf.errors import UserError

        raise UserError(f"--kills must be >= 0, got {args.kills}")
    session = SCRIPT.session(args)
    config, out = session.config, session.out
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="kill_resume-"))
    try:
        summary = check(work, config, args.kills)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    from cpcfl_tf.records.files import write_json

    write_json(out / "kill_resume.json", summary)
    kinds = sorted({k["kind"] for k in summary["kills"] if k["kind"]})
    report = (f"# Kill and resume (preset `{config.preset}`, {SPEC[0]}, "
              f"T = {summary['rounds']})\n\n"
              f"- {summary['kills_survived']} of {args.kills} SIGKILLs hit the run, "
              f"{sum(1 for k in summary['kills'] if k['kind'])} of them while writing "
              f"({', '.join(kinds) or 'none'}); it resumed after each.\n"
              f"- Final record {'identical to' if summary['identical'] else 'DIFFERENT from'} "
              f"the uninterrupted run's (timing and environment aside).\n"
              f"- Partial or unreadable files left: {len(summary['leftovers'])}.\n")
    session.finish(report)
    if not summary["identical"] or summary["leftovers"] or summary["final_exit"] != 0:
        raise SystemExit("error: a killed and resumed run did not end as the uninterrupted one")


def check(work: Path, config, kills_wanted: int) -> dict:
    """The uninterrupted run in ``work/reference``, the killed one in ``work/killed``."""
    for sub in ("reference", "killed"):  # each check starts from nothing
        shutil.rmtree(work / sub, ignore_errors=True)

    status, writes, seconds = attempt(work / "reference", config.preset, config.seed, kills_wanted)
    if status != 0:
        raise SystemExit(f"error: the uninterrupted run failed (exit {status})")
    reference = json.loads((work / "reference" / "runs" / (SPEC[0] + ".json")).read_text())
    per_round = reference["timing"]["seconds_per_round"]
    print(f"uninterrupted: {len(writes)} writes in {seconds:.1f} s", flush=True)
    kills: list[dict[str, Any]] = []
    for k, plan in enumerate(plans(kills_wanted, np.random.default_rng(config.seed), per_round)):
        status, done, _ = attempt(work / "killed", config.preset, config.seed, kills_wanted, plan)
        killed = status == -signal.SIGKILL
        during = (done[-1] if killed and done and (plan.startswith("write")
                                                   or kind(done[-1]) == "result") else None)
        kills.append({"plan": plan, "killed": killed, "writing": during,
                      "kind": kind(during) if during else None})
        print(f"kill {k + 1}/{kills_wanted} ({plan}): "
              + (f"killed{f' writing {during}' if during else ''}" if killed
                 else f"not killed, exit {status}"), flush=True)
    status, _, _ = attempt(work / "killed", config.preset, config.seed, kills_wanted)
    name = SPEC[0] + ".json"
    resumed = json.loads((work / "killed" / "runs" / name).read_text())
    left = leftovers(work / "killed")
    summary = {"preset": config.preset, "seed": config.seed, "run": SPEC[0],
               "rounds": reference["config"]["federated"]["rounds"],
               "writes": len(writes), "kills": kills,
               "kills_survived": sum(k["killed"] for k in kills), "final_exit": status,
               "identical": comparable(resumed) == comparable(reference), "leftovers": left}
    return summary


if __name__ == "__main__":
    run_cli(main)
