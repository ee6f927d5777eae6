"""Why the simulator's speed-up over a plain Keras loop depends on the machine, measured.

One 60-client IFCA round of the CNN at 32 px (``benchmark_simulator.py``: N = 3, 50
training and 50 test images per client, 3 local epochs) is timed under each setting that
decides how TensorFlow runs it on a CPU: oneDNN kernels on (the kit's default) or off
(TensorFlow's own default on CPUs without AVX512_VNNI/BF16/AMX), the sizes of its two
thread pools, XLA for the local step, and the malloc under it (TCMalloc or jemalloc
preloaded). TensorFlow reads these once, at start-up, so
every variant is a fresh process. The plain per-client Keras loop is timed under the
default, with oneDNN off and under each allocator. Beside them: the round's work in FLOPs and the machine's
float32 peak (from its vector units and clock, and what one large matmul reaches), so
every variant's GFLOP/s says how close a round comes to the peak.

Writes ``<cpu>.json`` per machine and ``speed_study.md`` over every machine measured.
Run it alone on the machine: anything sharing the cores slows some variants and not others.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.experiment import cpu_model, environment, name_list, positive_int
from cpcfl_tf.report import markdown_table
from cpcfl_tf.results import write_json
from cpcfl_tf.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="standard", distribute=False, runs=False)
BENCHMARK = Path(__file__).with_name("benchmark_simulator.py")

VARIANTS: dict[str, tuple[str, dict[str, str], list[str]]] = {
    # name: (what it is, environment, benchmark options)
    "default": ("the kit's default: oneDNN on, TensorFlow's thread pools", {}, []),
    "onednn-off": ("oneDNN off: TensorFlow's default on CPUs without AVX512_VNNI/BF16/AMX",
                   {"TF_ENABLE_ONEDNN_OPTS": "0"}, []),
    "threads-1x2": ("1 intra-op x 2 inter-op threads: clients' ops side by side",
                    {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2"}, []),
    "threads-2x1": ("2 intra-op x 1 inter-op thread: one op at a time on both cores",
                    {"TF_NUM_INTRAOP_THREADS": "2", "TF_NUM_INTEROP_THREADS": "1"}, []),
    "xla": ("XLA-compiled local step (oneDNN on)", {}, ["--xla"]),
    # Malloc replacements, preloaded: TensorFlow frees and allocates every op's output
    # tensors; glibc's malloc returns large blocks to the system and faults them in again.
    "tcmalloc": ("TCMalloc preloaded (libtcmalloc-minimal4)",
                 {"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, []),
    "jemalloc": ("jemalloc preloaded (libjemalloc2)", {"LD_PRELOAD": "libjemalloc.so.2"}, []),
}
BASELINE_VARIANTS = ("default", "onednn-off", "tcmalloc", "jemalloc")
"""Where the plain Keras loop is timed as well (it is bound by Python and Keras' per-call
work, so it should hardly move; an allocator speeds up both loops, so each is compared
with its own as well)."""
PACKAGES = {"libtcmalloc_minimal.so.4": "libtcmalloc-minimal4", "libjemalloc.so.2": "libjemalloc2"}


def check_preloads(names: Sequence[str]) -> None:
    """Every library a variant preloads must be installed: a missing one is silently
    skipped by the loader, and the variant would time the default."""
    from ctypes.util import find_library  # looks, does not load: jemalloc cannot be
    # loaded after start-up (static TLS), only preloaded

    for name in names:
        library = VARIANTS[name][1].get("LD_PRELOAD")
        if library is not None and find_library(library[3:].split(".so")[0]) != library:
            raise UserError(f"variant {name} needs {library}: apt-get install -y "
                            f"{PACKAGES[library]}")


def theoretical_peak() -> dict:
    """float32 peak from /proc/cpuinfo: cores x clock x lanes x 2 (FMA) x 2 FMA units
    (an assumption: most server cores since 2017 have two; some have one)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", info, re.M)]
    flags = set(next(iter(re.findall(r"^flags\s*:(.*)$", info, re.M)), "").split())
    lanes = 16 if "avx512f" in flags else 8 if "avx2" in flags else 4
    fma = "fma" in flags or "avx512f" in flags
    cores = os.cpu_count() or 1
    ghz = max(mhz) / 1000 if mhz else None
    gflops = cores * ghz * lanes * (2 if fma else 1) * 2 if ghz else None
    return {"cores": cores, "ghz": ghz, "float32_lanes": lanes, "fma": fma,
            "fma_units_assumed": 2, "gflops": gflops}


def matmul_peak(sizes: Sequence[int] = (1024, 2048), repeats: int = 5) -> float:
    """GFLOP/s of the best float32 square matmul TensorFlow runs here (the achievable peak)."""
    import time

    import tensorflow as tf

    best = 0.0
    for n in sizes:
        a, b = tf.random.normal((n, n), seed=1), tf.random.normal((n, n), seed=2)
        step = tf.function(tf.matmul)
        step(a, b).numpy()
        for _ in range(repeats):
            started = time.perf_counter()
            step(a, b).numpy()
            best = max(best, 2 * n ** 3 / (time.perf_counter() - started) / 1e9)
    return best


def round_flops(config, clients: int, train: int = 50, test: int = 50) -> dict:
    """FLOPs of one IFCA round of the benchmark: local training (forward + backward taken
    as 3 forwards, the usual estimate), selection (every pool model on every training
    image) and evaluation (each client's cluster model on its test images)."""
    from cpcfl_tf.federated.simulator import build_template
    from cpcfl_tf.flops import count_flops

    fl = config.federated
    size = config.data.image_size
    forward = count_flops(build_template(fl, (size, size, 3), 10))
    parts = {"training": 3 * forward * clients * train * fl.local_epochs,
             "selection": forward * fl.num_clusters * clients * train,
             "evaluation": forward * clients * test}
    return {"forward_per_image": forward, **parts, "total": sum(parts.values())}


def benchmark(name: str, clients: int, rounds: int, baseline_rounds: int, tmp: Path) -> dict:
    """``benchmark_simulator.py`` in a fresh process under variant ``name``."""
    _, env, options = VARIANTS[name]
    out = tmp / name
    command = [sys.executable, str(BENCHMARK), "--clients", str(clients), "--clusters", "3",
               "--image-size", "32", "--rounds", str(rounds),
               "--baseline-rounds", str(baseline_rounds), "--out", str(out), *options]
    print(f"{name}: {' '.join(f'{k}={v}' for k, v in env.items())} "
          f"benchmark_simulator.py {' '.join(command[2:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(command, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"the {name} benchmark failed: "
                        f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    (result,) = out.glob("*.json")
    return json.loads(result.read_text())


def machine_slug(cpu: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-")


def report(folder: Path) -> str:
    """``speed_study.md``: one table per machine measured."""
    lines = ["# Speed study: one IFCA round of the CNN at 32 px", "",
             "Written by `python experiments/speed_study.py` from every `<cpu>.json` here.", ""]
    for path in sorted(folder.glob("*.json")):
        study = json.loads(path.read_text())
        peak, work = study["peak"], study["round_flops"]
        lines += [f"## {study['environment']['cpu']}, {peak['theoretical']['cores']} cores, "
                  f"{study['clients']} clients", "",
                  f"- float32 peak: {peak['matmul_gflops']:.0f} GFLOP/s reached by a large "
                  f"matmul; {peak['theoretical']['gflops'] or float('nan'):.0f} GFLOP/s "
                  "theoretical at the clock /proc/cpuinfo reports (cores x clock x lanes x "
                  "FMA x 2 FMA units; turbo clocks can exceed it).",
                  f"- work per round: {work['total'] / 1e9:.0f} GFLOP (training "
                  f"{work['training'] / 1e9:.0f}, selection {work['selection'] / 1e9:.0f}, "
                  f"evaluation {work['evaluation'] / 1e9:.0f}; "
                  f"{work['forward_per_image'] / 1e6:.2f} MFLOP per image forward).", ""]
        rows = []
        for name, v in study["variants"].items():
            rows.append([name, v["about"], f"{v['seconds_per_round']:.2f}",
                         f"{v['gflops']:.0f}", f"{100 * v['of_matmul_peak']:.0f} %",
                         f"{v['baseline_seconds_per_round']:.0f}"
                         if "baseline_seconds_per_round" in v else "",
                         f"{v['speedup']:.1f}x" if "speedup" in v else "",
                         f"{v['baseline_seconds_per_round'] / v['seconds_per_round']:.1f}x"
                         if "baseline_seconds_per_round" in v else ""])
        lines += [*markdown_table(["variant", "what", "s / round", "GFLOP/s",
                                  "of matmul peak", "plain Keras s / round",
                                  "speed-up (against the default's plain loop)",
                                  "speed-up (against its own plain loop)"], rows), ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    parser.add_argument("--clients", type=positive_int, default=60)
    parser.add_argument("--rounds", type=int, default=4,
                        help="simulator rounds per variant; the first (tracing) is left out")
    parser.add_argument("--baseline-rounds", type=int, default=2,
                        help="rounds of the plain Keras loop where it is timed (0: skip it)")
    parser.add_argument("--variants", type=name_list(list(VARIANTS)), default=list(VARIANTS),
                        metavar="NAME[,NAME...]",
                        help=f"which settings to time (default all: {','.join(VARIANTS)})")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.baseline_rounds < 0:
        raise UserError("need --rounds >= 2 and --baseline-rounds >= 0")
    check_preloads(args.variants)
    session = SCRIPT.session(args)
    config, out = session.config, session.out

    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: benchmark(name, args.clients, args.rounds,
                                args.baseline_rounds if name in BASELINE_VARIANTS else 0,
                                Path(tmp)) for name in args.variants}
    work = round_flops(config, args.clients)
    peak = {"theoretical": theoretical_peak(), "matmul_gflops": matmul_peak()}
    reference = runs.get("default", next(iter(runs.values())))
    baseline = reference.get("baseline_seconds_per_round")
    variants = {}
    for name, run in runs.items():
        seconds = run["seconds_per_round"]
        row = {"about": VARIANTS[name][0], "environment": VARIANTS[name][1],
               "seconds_per_round": seconds,
               "simulator_round_seconds": run["simulator_round_seconds"],
               "gflops": work["total"] / seconds / 1e9,
               "of_matmul_peak": work["total"] / seconds / 1e9 / peak["matmul_gflops"],
               "onednn": run["environment"].get("onednn")}
        if run.get("allocator"):
            row["allocator"] = run["allocator"]  # what the child process really ran on
        if "baseline_seconds_per_round" in run:
            row.update(baseline_seconds_per_round=run["baseline_seconds_per_round"],
                       baseline_round_seconds=run["baseline_round_seconds"])
        if baseline:
            row["speedup"] = baseline / seconds
        variants[name] = row
        print(f"{name}: {seconds:.2f} s per round, {row['gflops']:.0f} GFLOP/s"
              + (f", {row['speedup']:.1f}x the plain Keras loop" if baseline else ""))
    study = {"experiment": "speed_study", "clients": args.clients, "clusters": 3,
             "image_size": 32, "round_flops": work, "peak": peak, "variants": variants,
             "environment": environment()}
    path = write_json(out / f"{machine_slug(cpu_model())}.json", study)
    (out / "speed_study.md").write_text(report(out))
    print(f"wrote {path} and {out / 'speed_study.md'}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
