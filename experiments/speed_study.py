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

``--parts kernels`` looks inside the local training step, in this process (the kit's
default settings): each convolution's three kernels (forward, gradient of the filter,
gradient of the input) for all clients at the round's two batch sizes, with their
GFLOP/s, and the step under two other layouts of the same arithmetic, timed to show what
a rewrite would gain: the last convolution (1x1 output, its kernel covers its input) as
one batched matmul, and every convolution as im2col + batched matmul. Neither is used by
the kit: both change the last bits of every result.

Writes ``<cpu>.json`` per machine (a run replaces the parts it measured and keeps the
others) and ``speed_study.md`` over every machine measured. Run it alone on the machine:
anything sharing the cores slows some variants and not others.
"""
from __future__ import annotations

import dataclasses
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
    # glibc's malloc kept from giving memory back: no mmap per large block, no trimming,
    # so a freed block is reused without munmap/mmap and page faults.
    "glibc-keep": ("glibc's malloc without mmap or trimming (MALLOC_MMAP_MAX_=0, "
                   "MALLOC_TRIM_THRESHOLD_=64 GiB)",
                   {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(64 << 30)}, []),
}
BASELINE_VARIANTS = ("default", "onednn-off", "tcmalloc", "jemalloc", "glibc-keep")
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


TRAIN_IMAGES = 50
"""Training images per client in the benchmark's round (the paper's protocol)."""


def round_flops(config, clients: int, train: int = TRAIN_IMAGES, test: int = 50) -> dict:
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


def batch_sizes(batch_size: int, images: int = TRAIN_IMAGES) -> list[int]:
    """The per-client batch sizes of one local epoch: full batches and the remainder."""
    return sorted({batch_size, images % batch_size} - {0}, reverse=True)


def kernel_breakdown(classifier, clients: int, batches: Sequence[int], repeats: int = 5
                     ) -> list[dict]:
    """Each Conv2D's forward, filter-gradient and input-gradient kernels, one per client
    as in the stacked step, timed for ``clients`` clients at each batch size."""
    import keras
    import tensorflow as tf

    from cpcfl_tf.contrastive.timing import median_seconds

    rows = []
    convolutions = [layer for layer in classifier.get_layer("encoder").layers
                    if isinstance(layer, keras.layers.Conv2D)]
    for layer in convolutions:
        (_, h, w, cin), (_, oh, ow, cout) = layer.input.shape, layer.output.shape
        kh, kw = layer.kernel_size
        strides, padding = [1, *layer.strides, 1], layer.padding.upper()
        for b in batches:
            rng = tf.random.Generator.from_seed(0)
            x = [rng.normal((b, h, w, cin)) for _ in range(clients)]
            f = [rng.normal((kh, kw, cin, cout)) for _ in range(clients)]
            dy = [rng.normal((b, oh, ow, cout)) for _ in range(clients)]
            ops = {
                "forward": (lambda x, f: [tf.nn.conv2d(a, k, strides, padding)
                                          for a, k in zip(x, f)], (x, f)),
                "filter_gradient": (lambda x, dy: [tf.raw_ops.Conv2DBackpropFilter(
                    input=a, filter_sizes=[kh, kw, cin, cout], out_backprop=d,
                    strides=strides, padding=padding) for a, d in zip(x, dy)], (x, dy)),
                "input_gradient": (lambda f, dy: [tf.raw_ops.Conv2DBackpropInput(
                    input_sizes=[b, h, w, cin], filter=k, out_backprop=d, strides=strides,
                    padding=padding) for k, d in zip(f, dy)], (f, dy)),
            }
            flops = 2 * b * oh * ow * cout * kh * kw * cin * clients
            row = {"layer": layer.name, "input": [h, w, cin], "output": [oh, ow, cout],
                   "batch": b, "gflop": flops / 1e9}
            if layer is convolutions[0]:
                del ops["input_gradient"]  # a step never computes it: images need none
            for kind, (fn, args) in ops.items():
                seconds = median_seconds(tf.function(fn), *args, repeats=repeats)
                row[kind] = {"ms": 1e3 * seconds, "gflops": flops / seconds / 1e9}
            rows.append(row)
    return rows


def _as_matmul_logits(layers, params, x, every: bool):
    """The stacked classifier's logits with convolutions as batched matmuls: every one
    (im2col by strided slices), or only those whose kernel covers their input (1x1
    output: a reshape). The same arithmetic in another order (last bits differ)."""
    import tensorflow as tf

    from cpcfl_tf.federated.backends import stacked_logits

    k, h, i = x.shape[0], x, 0
    for n, layer in enumerate(layers):
        if layer.kind == "flatten":
            h = tf.reshape(h, [k, tf.shape(h)[1], -1])
            continue
        kernel, bias = params[i], params[i + 1]
        i += 2
        if layer.kind == "dense":
            h = tf.einsum("kbi,kio->kbo", h, kernel) + bias[:, None, :]
        elif not (every or h.shape[2] == kernel.shape[1]):  # as the kit runs it
            h = tf.stack(stacked_logits([dataclasses.replace(layer, activation="linear")],
                                        [kernel, bias], h))
        else:
            (kh, kw), s = kernel.shape[1:3], layer.strides[0]
            oh, ow = (h.shape[2] - kh) // s + 1, (h.shape[3] - kw) // s + 1
            cols = tf.concat([h[:, :, a:a + s * (oh - 1) + 1:s, c:c + s * (ow - 1) + 1:s]
                              for a in range(kh) for c in range(kw)], axis=-1)
            flat = tf.reshape(cols, [k, -1, cols.shape[-1]])
            h = tf.matmul(flat, tf.reshape(kernel, [k, -1, kernel.shape[-1]])) + bias[:, None]
            h = tf.reshape(h, [k, -1, oh, ow, kernel.shape[-1]])
        if layer.activation == "relu" and n < len(layers) - 1:
            h = tf.nn.relu(h)
    return h


def step_layouts(classifier, clients: int, batches: Sequence[int], repeats: int = 5
                 ) -> dict[str, dict]:
    """Milliseconds of one stacked training step (all clients, whole model) per batch
    size, as the kit runs it and under the two matmul layouts, with each layout's
    largest logit difference from the kit's, relative to the largest logit. (Logits,
    not gradients: a rounding change can flip a ReLU that sits at 0, which moves a
    gradient by a whole unit's share and says nothing about the layout.)"""
    import numpy as np
    import tensorflow as tf

    from cpcfl_tf.contrastive.timing import compare_seconds
    from cpcfl_tf.data.images import to_float
    from cpcfl_tf.federated.backends import StackedBackend, stacked_logits

    backend = StackedBackend(classifier)

    def matmul_layout(every: bool):
        def logits(params, images):
            return _as_matmul_logits(backend.layers, params, to_float(images), every)

        @tf.function
        def gradients(params, images, labels):
            with tf.GradientTape() as tape:
                tape.watch(params)
                per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels, logits(params, images))
                loss = tf.reduce_sum(tf.reduce_mean(per_example, axis=1))
            return tape.gradient(loss, params)
        return gradients, tf.function(logits)

    layouts = {"kit": (lambda p, x, y: backend._grads(p, x, y, 0),
                       tf.function(lambda p, x: stacked_logits(backend.layers, p, to_float(x)))),
               "last_conv_as_matmul": matmul_layout(False),
               "im2col_matmul": matmul_layout(True)}
    params = [tf.constant(np.stack([a] * clients)) for a in classifier.get_weights()]
    rng = np.random.default_rng(0)
    out = {name: {"ms": {}, "max_relative_difference": 0.0} for name in layouts}
    size, classes = classifier.input_shape[1:], classifier.output_shape[-1]
    for b in batches:
        images = tf.constant(rng.integers(0, 256, (clients, b, *size), dtype=np.uint8))
        labels = tf.constant(rng.integers(0, classes, (clients, b)), tf.int32)
        seconds = compare_seconds({name: step for name, (step, _) in layouts.items()},
                                  params, images, labels, repeats=repeats)
        reference = layouts["kit"][1](params, images).numpy()
        for name, (_, logits) in layouts.items():
            out[name]["ms"][str(b)] = 1e3 * seconds[name]
            difference = np.abs(logits(params, images).numpy() - reference).max()
            out[name]["max_relative_difference"] = max(
                out[name]["max_relative_difference"],
                float(difference / np.abs(reference).max()))
    return out


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


def variant_table(variants: dict) -> list[str]:
    rows = []
    for name, v in variants.items():
        passes = v.get("pass_seconds_per_round", [v["seconds_per_round"]])
        rows.append([name, v["about"], f"{v['seconds_per_round']:.2f}",
                     " / ".join(f"{s:.2f}" for s in passes),
                     f"{v['gflops']:.0f}", f"{100 * v['of_matmul_peak']:.0f} %",
                     f"{v['baseline_seconds_per_round']:.0f}"
                     if "baseline_seconds_per_round" in v else "",
                     f"{v['speedup']:.1f}x" if "speedup" in v else "",
                     f"{v['baseline_seconds_per_round'] / v['seconds_per_round']:.1f}x"
                     if "baseline_seconds_per_round" in v else ""])
    return markdown_table(["variant", "what", "s / round (median pass)", "passes",
                           "GFLOP/s", "of matmul peak",
                           "plain Keras s / round",
                           "speed-up (against the default's plain loop)",
                           "speed-up (against its own plain loop)"], rows)


def kernel_tables(part: dict) -> list[str]:
    """The ``kernels`` part as two tables: per convolution and per layout."""
    kinds = ("forward", "filter_gradient", "input_gradient")

    def cell(k):
        return f"{k['ms']:.0f} ({k['gflops']:.0f})" if k else "-"

    def shape(dims):
        return "x".join(map(str, dims))

    rows = [[c["layer"], f"{shape(c['input'])} -> {shape(c['output'])}", str(c["batch"]),
             f"{c['gflop']:.2f}", *(cell(c.get(k)) for k in kinds)]
            for c in part["convolutions"]]
    batches = [str(b) for b in part["batches"]]
    layouts = [[name, *(f"{v['ms'][b]:.0f}" for b in batches),
                f"{v['max_relative_difference']:.1e}"] for name, v in part["layouts"].items()]
    summed = {b: sum(c[k]["ms"] for c in part["convolutions"] if str(c["batch"]) == b
                     for k in kinds if k in c) for b in batches}
    return ["Inside the local step (`--parts kernels`, oneDNN "
            f"{'on' if part['onednn'] else 'off'}, a large matmul at "
            f"{part['peak']['matmul_gflops']:.0f} GFLOP/s that day): each convolution's "
            "kernels for all clients, ms (GFLOP/s). The first layer's input gradient is "
            "never computed in a step (images need none).", "",
            *markdown_table(["layer", "shape", "batch per client", "GFLOP", "forward",
                             "filter gradient", "input gradient"], rows), "",
            "Together, timed one by one as above: " + ", ".join(
                f"{ms:.0f} ms at batch {b}" for b, ms in summed.items()) + ".", "",
            "One training step of all clients (whole model), ms, under the kit's layout "
            "and two matmul layouts it does not use (they change the last bits):", "",
            *markdown_table(["layout", *(f"batch {b}" for b in batches),
                             "largest logit difference (relative)"], layouts), ""]


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
        if "variants" in study:
            lines += [*variant_table(study["variants"]), ""]
        if "kernels" in study:
            lines += kernel_tables(study["kernels"])
    return "\n".join(lines)


PARTS = ("rounds", "kernels")


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
    parser.add_argument("--repeats", type=positive_int, default=1,
                        help="passes over the variants, every other one in reverse order; "
                             "each row is the median pass (default 1)")
    parser.add_argument("--parts", type=name_list(PARTS), default=["rounds"],
                        metavar="PART[,PART...]",
                        help="rounds: a round under each variant (default); kernels: the "
                             "local step's kernels and layouts, in this process")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.baseline_rounds < 0:
        raise UserError("need --rounds >= 2 and --baseline-rounds >= 0")
    if "rounds" in args.parts:
        check_preloads(args.variants)
    session = SCRIPT.session(args)
    config, out = session.config, session.out
    path = out / f"{machine_slug(cpu_model())}.json"
    # A run replaces the parts it measures and keeps the others of this machine.
    study = json.loads(path.read_text()) if path.exists() else {}
    peak = {"theoretical": theoretical_peak(), "matmul_gflops": matmul_peak()}
    if "rounds" in args.parts or not study:  # the machine as the rounds were timed
        study.update({"experiment": "speed_study", "clients": args.clients, "clusters": 3,
                      "image_size": 32, "round_flops": round_flops(config, args.clients),
                      "peak": peak, "environment": environment()})
    if "rounds" in args.parts:
        study["variants"] = time_variants(args, study["round_flops"], peak)
    if "kernels" in args.parts:
        study["kernels"] = {**time_kernels(config, args.clients), "peak": peak,
                            "environment": environment()}
    write_json(path, study)
    (out / "speed_study.md").write_text(report(out))
    print(f"wrote {path} and {out / 'speed_study.md'}", file=sys.stderr)


def time_variants(args, work: dict, peak: dict) -> dict[str, dict]:
    """One benchmark per variant and pass, each in a fresh process.

    With ``--repeats`` R the variants run R times, every other pass in reverse order, and
    each row gives the median pass: on a shared 2-core VM one process can be 10 % slower
    than the next for no reason of its own, so a single pass ranks nothing.
    """
    passes: dict[str, list[dict]] = {name: [] for name in args.variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name in (args.variants if r % 2 == 0 else args.variants[::-1]):
                passes[name].append(benchmark(
                    name, args.clients, args.rounds,
                    args.baseline_rounds if name in BASELINE_VARIANTS else 0,
                    Path(tmp) / f"pass{r + 1}"))
    reference = passes.get("default", next(iter(passes.values())))
    baseline = _median([run.get("baseline_seconds_per_round") for run in reference])
    variants = {}
    for name, runs in passes.items():
        seconds = _median([run["seconds_per_round"] for run in runs])
        last = runs[-1]
        row = {"about": VARIANTS[name][0], "environment": VARIANTS[name][1],
               "seconds_per_round": seconds,
               "pass_seconds_per_round": [run["seconds_per_round"] for run in runs],
               "simulator_round_seconds": [run["simulator_round_seconds"] for run in runs],
               "gflops": work["total"] / seconds / 1e9,
               "of_matmul_peak": work["total"] / seconds / 1e9 / peak["matmul_gflops"],
               "onednn": last["environment"].get("onednn")}
        if last.get("allocator"):
            row["allocator"] = last["allocator"]  # what the child process really ran on
        if last.get("malloc_settings"):
            row["malloc_settings"] = last["malloc_settings"]  # as the child saw them
        own = _median([run.get("baseline_seconds_per_round") for run in runs])
        if own:
            row.update(baseline_seconds_per_round=own,
                       baseline_round_seconds=[run["baseline_round_seconds"] for run in runs])
        if baseline:
            row["speedup"] = baseline / seconds
        variants[name] = row
        print(f"{name}: {seconds:.2f} s per round, {row['gflops']:.0f} GFLOP/s"
              + (f", {row['speedup']:.1f}x the plain Keras loop" if baseline else ""))
    return variants


def _median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are there (``None`` if none is)."""
    import statistics

    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def time_kernels(config, clients: int) -> dict:
    """The ``kernels`` part: the local step's convolutions and layouts."""
    from cpcfl_tf.experiment import onednn_enabled
    from cpcfl_tf.federated.simulator import build_template

    fl = config.federated
    size = config.data.image_size
    classifier = build_template(fl, (size, size, 3), 10)
    batches = batch_sizes(fl.batch_size)
    print(f"kernels: {clients} clients, batches {batches}", file=sys.stderr, flush=True)
    part = {"batches": batches, "onednn": onednn_enabled(),
            "convolutions": kernel_breakdown(classifier, clients, batches),
            "layouts": step_layouts(classifier, clients, batches)}
    for name, layout in part["layouts"].items():
        print(f"step, {name}: " + ", ".join(f"batch {b}: {ms:.0f} ms"
                                             for b, ms in layout["ms"].items()))
    return part


if __name__ == "__main__":
    run_cli(main)
