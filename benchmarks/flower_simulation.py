"""Seconds per round and peak memory of one run under Flower's Simulation Engine against
the same run in the simulator.

Both drivers run the preset's partition (``--clients`` K, one virtual SuperNode per
client under the engine) with the same method, seeds and rounds, each in processes of
its own, and are measured the same way: ``timing.seconds_per_round`` of the run record
each writes (the rounds as the server timed them), the wall time of the whole command
(start-up included), and the peak over the run of the summed proportional set size
(PSS, shared pages split between the processes that map them) of every process the run
started, sampled every half second. Several ``--clients`` values find how far one
machine goes. Needs ``pip install -e ".[flower-sim]"``. Run it alone on the machine.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.records.environment import cpu_model, environment
from cpcfl_tf.records.files import write_json
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="quick", distribute=False, runs=False)
MARK = "CPCFL_BENCHMARK_RUN"
"""Environment variable every process of a measured run inherits: how they are found."""


def _pss_mb(token: str) -> float:
    """Summed PSS (MB) of the processes whose environment carries ``MARK=token``."""
    needle = f"{MARK}={token}".encode()
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            for line in (proc / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:  # gone, or not ours
            continue
    return total / 1024


def measured(command: list[str], env: dict[str, str], token: str, log: Path
             ) -> tuple[float, float, int]:
    """Run ``command``; its wall seconds, peak PSS (MB) and exit status."""
    peak, done = [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _pss_mb(token))
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    sampler.start()
    with open(log, "wb") as fh:
        status = subprocess.run(command, env={**env, MARK: token}, stdout=fh,
                                stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    return seconds, peak[0], status


SIMULATOR = """
import json, sys
from cpcfl_tf.flower.common import run_config
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.running.runner import Runner
settings = json.loads(sys.argv[1])
config = run_config(settings)
runner = Runner("flower_simulation", config, sys.argv[2], RunContext(verbose=0))
from cpcfl_tf.clustered.simulator import run_federated
from cpcfl_tf.records.record import write_record
from cpcfl_tf.plan.resolve import resolve
run = resolve(config)
record, _ = run_federated(run, runner.data.clients(config),
                          encoder_weights=runner.encoders(run), context=runner.context)
write_record(sys.argv[3], record)
"""


def one(settings: dict, driver: str, work: Path) -> dict:
    """One run of ``settings`` under ``driver`` (simulator | engine), measured."""
    from cpcfl_tf.flower.simulation import (
        check_own_superlink,
        simulation_command,
        stop_local_superlink,
    )

    out = work / driver / "result.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    token = f"{driver}-{settings['num-clients']}-{time.time_ns()}"
    if driver == "simulator":
        command = [sys.executable, "-c", SIMULATOR, json.dumps(settings), str(work / driver),
                   str(out)]
    else:
        command, env = simulation_command({**settings, "out": str(out)},
                                          int(settings["num-clients"]),
                                          work / driver / "flwr-home", env=env)
    try:
        seconds, peak, status = measured(command, env, token, work / driver / "run.log")
    finally:
        if driver == "engine":
            stop_local_superlink(work / driver / "flwr-home")
    if status != 0 or not out.exists():
        tail = (work / driver / "run.log").read_text(errors="replace").strip().splitlines()[-1:]
        raise UserError(f"the {driver} run with {settings['num-clients']} clients failed: {tail}")
    if driver == "engine":  # its seconds and memory would be another SuperLink's
        check_own_superlink(work / driver / "flwr-home", env, work / driver / "run.log")
    record = json.loads(out.read_text())
    return {"seconds_per_round": record["timing"]["seconds_per_round"],
            "wall_seconds": seconds, "peak_pss_mb": peak,
            "cluster_ids": [r["cluster_ids"] for r in record["rounds"]]}


def _memory_mb() -> float | None:
    """This machine's memory (``MemTotal``), MB."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _extrapolation(folder: Path) -> list[str]:
    """Per CPU and driver: the least-squares line of peak memory against clients over
    every run measured, and how many clients the machine's memory would hold at that
    rate (an extrapolation, not a measurement)."""
    by_cpu: dict[str, dict] = {}
    for path in sorted(folder.glob("*.json")):
        study = json.loads(path.read_text())
        entry = by_cpu.setdefault(study["environment"]["cpu"], {"memory": None, "points": {}})
        entry["memory"] = study.get("memory_mb") or entry["memory"]
        for k, drivers in study["runs"].items():
            for driver, r in drivers.items():
                entry["points"].setdefault(driver, []).append((int(k), r["peak_pss_mb"]))
    lines = []
    for cpu, entry in by_cpu.items():
        for driver, points in entry["points"].items():
            ks = sorted({k for k, _ in points})
            if len(ks) < 2:
                continue
            import numpy as np

            slope, base = np.polyfit([k for k, _ in points], [m for _, m in points], 1)
            line = (f"- {cpu}, {driver}: peak memory grows by about {slope:.0f} MB per client "
                    f"over {ks[0]}-{ks[-1]} clients (from {base:,.0f} MB)")
            if entry["memory"] and slope > 0:
                line += (f"; at that rate this machine's {entry['memory'] / 1024:.0f} GiB "
                         f"would hold about {(entry['memory'] - base) / slope:,.0f} clients "
                         "(extrapolated, not run)")
            lines.append(line + ".")
    return lines


def report(folder: Path) -> str:
    lines = ["# Flower's Simulation Engine against the simulator", "",
             "Written by `python benchmarks/flower_simulation.py` from every JSON here. "
             "Seconds per round as each run's record times its rounds; wall time of the "
             "whole command (start-up included); peak summed PSS of every process of the "
             "run.", ""]
    rows = []
    for path in sorted(folder.glob("*.json")):
        study = json.loads(path.read_text())
        for k, drivers in sorted(study["runs"].items(), key=lambda kv: int(kv[0])):
            sim, eng = drivers["simulator"], drivers.get("engine")
            rows.append([study["environment"]["cpu"], study["run"]["preset"], k,
                         study["run"]["method"], study["run"]["rounds"],
                         f"`{study['run']['set']}`" if study["run"].get("set") else "",
                         f"{sim['seconds_per_round']:.1f}", f"{sim['wall_seconds']:.0f}",
                         f"{sim['peak_pss_mb']:,.0f}",
                         *((f"{eng['seconds_per_round']:.1f}", f"{eng['wall_seconds']:.0f}",
                            f"{eng['peak_pss_mb']:,.0f}",
                            "yes" if eng["cluster_ids"] == sim["cluster_ids"] else "no")
                           if eng else ("", "", "", ""))])
    lines += markdown_table(["CPU", "preset", "clients", "method", "rounds", "--set",
                             "simulator s / round", "simulator wall s", "simulator peak MB",
                             "engine s / round", "engine wall s", "engine peak MB",
                             "same cluster ids"], rows)
    lines += ["", *_extrapolation(folder)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    parser.add_argument("--clients", default="15",
                        help="comma-separated client counts, one run per driver each "
                             "(default 15, the quick preset's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--method", default="ifca")
    parser.add_argument("--pretraining", default="none")
    parser.add_argument("--num-clusters", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        counts = [int(c) for c in args.clients.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or args.rounds < 1:
        raise UserError("--clients takes comma-separated integers >= 1 and --rounds >= 1")
    settings = {"preset": args.preset, "method": args.method, "pretraining": args.pretraining,
                "num-clusters": args.num_clusters, "rounds": args.rounds, "head-rounds": 0,
                "seed": args.seed, "set": " ".join(args.set)}
    from cpcfl_tf.flower.common import run_config

    for k in counts:  # every setting checked before anything runs
        run_config({**settings, "num-clients": k})
    session = SCRIPT.session(args)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="cpcfl-flower-sim-") as tmp:
        for k in counts:
            run = {**settings, "num-clients": k}
            runs[str(k)] = {d: one(run, d, Path(tmp) / str(k)) for d in ("simulator", "engine")}
            for d, r in runs[str(k)].items():
                print(f"{k} clients, {d}: {r['seconds_per_round']:.1f} s per round, "
                      f"{r['wall_seconds']:.0f} s in all, peak {r['peak_pss_mb']:,.0f} MB",
                      flush=True)
    # One file per machine and run settings; client counts measured earlier are kept.
    slug = re.sub(r"[^a-z0-9]+", "-", " ".join(
        [cpu_model(), args.method, args.pretraining, f"r{args.rounds}", *args.set]).lower())
    path = session.out / f"{slug.strip('-')}.json"
    if path.exists():
        earlier = json.loads(path.read_text())
        if earlier["run"] == settings:
            runs = {**earlier["runs"], **runs}
    path = write_json(path, {"experiment": "flower_simulation", "run": settings,
                             "runs": dict(sorted(runs.items(), key=lambda kv: int(kv[0]))),
                             "memory_mb": _memory_mb(), "environment": environment()})
    (session.out / "flower_simulation.md").write_text(report(session.out))
    print(f"wrote {path} and {session.out / 'flower_simulation.md'}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
