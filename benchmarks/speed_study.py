"""What a simulator round's speed is made of, measured: the local step's convolution
kernels against the CPU's float32 peak.

One 60-client round of the CNN at 32 px (``benchmark_simulator.py``: N = 3, 50 training
and 50 test images per client, 3 local epochs) is mostly its local training step, and the
step is its convolutions. This times each convolution's three kernels (forward, gradient
of the filter, gradient of the input) for all clients at the round's two batch sizes,
with their GFLOP/s beside the machine's peak (a large matmul, and cores x clock x lanes x
FMA from ``/proc/cpuinfo``), and the step under four other layouts to show what a
rewrite would gain: two of the same arithmetic in float32 (the last convolution, whose
output is 1x1, as one batched matmul; every convolution as im2col + batched matmul), the
clients' convolutions of each layer as one grouped convolution (``groups`` = clients,
one op instead of one per client), and the kit's layout computed in bfloat16 from
float32 weights (fast only where the CPU has bfloat16 units, AVX512-BF16 or AMX, or on a
GPU). The kit uses none of them by default: each can change the last bits of every
result; ``speed_study.md`` has their times on each kind measured. Settings that were timed and gave
no gain (thread pools, malloc replacements, oneDNN off) are in docs/performance.md.

Writes ``<cpu>.json`` per machine (a run replaces that machine's) and ``speed_study.md``
over every machine measured. Run it alone on the machine: anything sharing the cores
slows some kernels and not others.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cpcfl_tf.errors import run_cli
from cpcfl_tf.records.environment import cpu_model, environment
from cpcfl_tf.records.files import write_json
from cpcfl_tf.running.cli import positive_int
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="standard", distribute=False, runs=False)


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
    from cpcfl_tf.clustered.pool import build_template
    from cpcfl_tf.flops import count_flops
    from cpcfl_tf.plan.resolve import resolve

    run = resolve(config)
    fl = run.federated
    size = config.data.image_size
    forward = count_flops(build_template(run, (size, size, 3), 10))
    parts = {"training": 3 * forward * clients * train * fl.local_epochs,
             "selection": forward * fl.num_clusters * clients * train,
             "evaluation": forward * clients * test}
    return {"forward_per_image": forward, **parts, "total": sum(parts.values())}


def batch_sizes(batch_size: int, images: int = TRAIN_IMAGES) -> list[int]:
    """The per-client batch sizes of one local epoch: full batches and the remainder."""
    return sorted({batch_size, images % batch_size} - {0}, reverse=True)


def _conv_kernels(x, f, dy, strides, padding) -> dict:
    """A Conv2D's three kernels, one call per client: kind -> (function, its arguments)."""
    import tensorflow as tf

    kh, kw, cin, cout = f[0].shape
    b, h, w, _ = x[0].shape
    return {
        "forward": (lambda x, f: [tf.nn.conv2d(a, k, strides, padding)
                                  for a, k in zip(x, f)], (x, f)),
        "filter_gradient": (lambda x, dy: [tf.raw_ops.Conv2DBackpropFilter(
            input=a, filter_sizes=[kh, kw, cin, cout], out_backprop=d,
            strides=strides, padding=padding) for a, d in zip(x, dy)], (x, dy)),
        "input_gradient": (lambda f, dy: [tf.raw_ops.Conv2DBackpropInput(
            input_sizes=[b, h, w, cin], filter=k, out_backprop=d, strides=strides,
            padding=padding) for k, d in zip(f, dy)], (f, dy)),
    }


def kernel_breakdown(classifier, clients: int, batches: Sequence[int], repeats: int = 5
                     ) -> list[dict]:
    """Each Conv2D's forward, filter-gradient and input-gradient kernels, one per client
    as in the stacked step, timed for ``clients`` clients at each batch size."""
    import keras
    import tensorflow as tf

    from cpcfl_tf.pretraining.timing import median_seconds

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
            ops = _conv_kernels(x, f, dy, strides, padding)
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

    from cpcfl_tf.clustered.stacked import stacked_logits

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


def _grouped_logits(layers, params, x):
    """The stacked classifier's logits with each convolution of the K clients as one
    grouped convolution (``groups=K``): the clients' images side by side on the channel
    axis ``(B, h, w, K*c)``, their kernels side by side on the output axis."""
    import tensorflow as tf

    k, b = x.shape[0], tf.shape(x)[1]
    h = tf.reshape(tf.transpose(x, [1, 2, 3, 0, 4]),
                   [b, x.shape[2], x.shape[3], k * x.shape[4]])
    grouped, i = True, 0
    for n, layer in enumerate(layers):
        if layer.kind == "flatten":
            h = tf.reshape(h, [b, h.shape[1], h.shape[2], k, -1])
            h = tf.reshape(tf.transpose(h, [3, 0, 1, 2, 4]), [k, b, -1])
            grouped = False
            continue
        kernel, bias = params[i], params[i + 1]
        i += 2
        if layer.kind == "conv":
            kh, kw, c, o = kernel.shape[1:]
            w = tf.reshape(tf.transpose(kernel, [1, 2, 3, 0, 4]), [kh, kw, c, k * o])
            h = tf.nn.conv2d(h, w, layer.strides, layer.padding) + tf.reshape(bias, [-1])
        else:
            h = tf.einsum("kbi,kio->kbo", h, kernel) + bias[:, None, :]
        if layer.activation == "relu" and n < len(layers) - 1:
            h = tf.nn.relu(h)
    assert not grouped, "a classifier ends in dense layers"
    return h


def _bfloat16_logits(layers, params, x):
    """The kit's stacked logits computed in bfloat16 from float32 weights (cast at each
    use, as Keras' mixed_bfloat16 policy does); float32 out."""
    import tensorflow as tf

    from cpcfl_tf.clustered.stacked import stacked_logits

    low = [tf.cast(p, tf.bfloat16) for p in params]
    return tf.cast(stacked_logits(layers, low, tf.cast(x, tf.bfloat16)), tf.float32)


def step_layouts(classifier, clients: int, batches: Sequence[int], repeats: int = 5
                 ) -> dict[str, dict]:
    """Milliseconds of one stacked training step (all clients, whole model) per batch
    size, as the kit runs it and under the other layouts, with each layout's
    largest logit difference from the kit's, relative to the largest logit. (Logits,
    not gradients: a rounding change can flip a ReLU that sits at 0, which moves a
    gradient by a whole unit's share and says nothing about the layout.)"""
    import numpy as np
    import tensorflow as tf

    from cpcfl_tf.clustered.stacked import StackedBackend, stacked_logits
    from cpcfl_tf.data.images import to_float
    from cpcfl_tf.pretraining.timing import compare_seconds

    backend = StackedBackend(classifier)

    def layout(forward):
        def logits(params, images):
            return forward(backend.layers, params, to_float(images))

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
               "last_conv_as_matmul": layout(
                   lambda layers, p, x: _as_matmul_logits(layers, p, x, every=False)),
               "im2col_matmul": layout(
                   lambda layers, p, x: _as_matmul_logits(layers, p, x, every=True)),
               "grouped_convolution": layout(_grouped_logits),
               "bfloat16": layout(_bfloat16_logits)}
    # Each client its own weights (scaled), so a layout that mixed clients up would show.
    params = [tf.constant(np.stack([a * (1 + 0.1 * c) for c in range(clients)]))
              for a in classifier.get_weights()]
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, Any]] = {name: {"ms": {}, "max_relative_difference": 0.0}
                                      for name in layouts}
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


def machine_slug(cpu: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-")


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
    return ["Inside the local step (oneDNN "
            f"{'on' if part['onednn'] else 'off'}, a large matmul at "
            f"{part['peak']['matmul_gflops']:.0f} GFLOP/s that day): each convolution's "
            "kernels for all clients, ms (GFLOP/s). The first layer's input gradient is "
            "never computed in a step (images need none).", "",
            *markdown_table(["layer", "shape", "batch per client", "GFLOP", "forward",
                             "filter gradient", "input gradient"], rows), "",
            "Together, timed one by one as above: " + ", ".join(
                f"{ms:.0f} ms at batch {b}" for b, ms in summed.items()) + ".", "",
            "One training step of all clients (whole model), ms, under the kit's layout "
            "and the layouts it does not use (they change the last bits):", "",
            *markdown_table(["layout", *(f"batch {b}" for b in batches),
                             "largest logit difference (relative)"], layouts), ""]


def report(folder: Path) -> str:
    """``speed_study.md``: one section per machine measured."""
    lines = ["# Speed study: the local step of a 60-client round of the CNN at 32 px", "",
             "Written by `python benchmarks/speed_study.py` from every `<cpu>.json` here.", ""]
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
        lines += kernel_tables(study["kernels"])
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    parser.add_argument("--clients", type=positive_int, default=60)
    session = SCRIPT.session(parser.parse_args(argv))
    config, out = session.config, session.out
    path = out / f"{machine_slug(cpu_model())}.json"
    peak = {"theoretical": theoretical_peak(), "matmul_gflops": matmul_peak()}
    study = {"experiment": "speed_study", "clients": session.args.clients,
             "image_size": config.data.image_size,
             "round_flops": round_flops(config, session.args.clients), "peak": peak,
             "kernels": {**time_kernels(config, session.args.clients), "peak": peak},
             "environment": environment()}
    write_json(path, study)
    (out / "speed_study.md").write_text(report(out))
    print(f"wrote {path} and {out / 'speed_study.md'}", file=sys.stderr)


def time_kernels(config, clients: int) -> dict:
    """The ``kernels`` part: the local step's convolutions and layouts."""
    from cpcfl_tf.clustered.pool import build_template
    from cpcfl_tf.plan.resolve import resolve
    from cpcfl_tf.records.environment import onednn_enabled

    run = resolve(config)
    fl = run.federated
    size = config.data.image_size
    classifier = build_template(run, (size, size, 3), 10)
    batches = batch_sizes(fl.batch_size)
    print(f"kernels: {clients} clients, batches {batches}", file=sys.stderr, flush=True)
    convolutions = kernel_breakdown(classifier, clients, batches)  # in this order
    layouts = step_layouts(classifier, clients, batches)
    part = {"batches": batches, "onednn": onednn_enabled(), "convolutions": convolutions,
            "layouts": layouts}
    for name, layout in layouts.items():
        print(f"step, {name}: " + ", ".join(f"batch {b}: {ms:.0f} ms"
                                             for b, ms in layout["ms"].items()))
    return part


if __name__ == "__main__":
    run_cli(main)
