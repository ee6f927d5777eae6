"""What the ``paper`` preset needs: memory and time per stage at STL-10's full data shape.

tfds cannot download here, so a stand-in of STL-10's size takes its place:
``tfds.testing.mock_data`` serves random 96x96x3 images with the real split sizes (train
5,000, test 8,000, unlabelled 100,000) and labels 0-9 in turn. The ``paper`` preset
then runs through the kit's runner, stage by stage, as ``table2.py`` would run
CP-CFL (SimCLR): load the unlabeled images, pre-train SimCLR, load the client images and
draw the 60 clients, then the federated run. Short by default (``--set
pretrain.epochs=1 federated.rounds=2 federated.head_rounds=1``: round 1 with the
encoder frozen, round 2 selecting by loss and training the whole model); other
``--set`` values go on top. For each stage: seconds, peak resident memory (sampled every
20 ms) and what it holds at the end; for the loading stages, the peak over the image
array's own size (the kit's loaders hold at most one extra copy while they read).

Writes ``paper_shape.json`` and ``paper_shape.md``; the stand-in's run record and
encoder stay in ``runs/`` and ``cache/`` beside them, apart from the real cache. Run it
alone on the machine.
"""
from __future__ import annotations

import contextlib
import resource
import sys
import threading
import time
from collections.abc import Iterator, Sequence

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.records.environment import environment
from cpcfl_tf.records.files import cache_at, write_json
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="paper", distribute=False, runs=False,
                stand_in=True)
SHORT = ["pretrain.epochs=1", "federated.rounds=2", "federated.head_rounds=1"]
STL10_SPLITS = {"train": 5_000, "test": 8_000, "unlabelled": 100_000}
"""STL-10's split sizes (tfds ``stl10``)."""


def _rss() -> int:
    """Resident memory of this process now, in bytes (Linux)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


class Stages:
    """Seconds and peak resident memory of named stages, sampled by a background thread."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.rows: list[dict] = []
        self._peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, _rss())

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[dict]:
        """Measure the block; a loading stage puts its images' ``array_bytes`` in the
        dict it gets, to have its peak compared with the array's size."""
        before = _rss()
        self._peak = before
        started = time.perf_counter()
        print(f"{name} ...", file=sys.stderr, flush=True)
        loaded: dict = {}
        yield loaded
        seconds = time.perf_counter() - started
        after = _rss()
        self._peak = peak = max(self._peak, after)
        row = {"stage": name, "seconds": seconds, "rss_before_mb": before / 2**20,
               "peak_rss_mb": peak / 2**20, "rss_after_mb": after / 2**20}
        size = loaded.get("array_bytes")
        if size:
            row.update(array_mb=size / 2**20, peak_over_array=(peak - before) / size)
        self.rows.append(row)
        print(f"{name}: {seconds:.1f} s, peak {peak / 2**30:.2f} GiB", file=sys.stderr,
              flush=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def stand_in_sizes(scale: float) -> dict[str, int]:
    return {name: max(1, round(size * scale)) for name, size in STL10_SPLITS.items()}


@contextlib.contextmanager
def stl10_stand_in(scale: float = 1.0, num_classes: int = 10) -> Iterator[None]:
    """tfds's ``stl10`` as random images of its real shape, ``scale`` x its split sizes."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    sizes = stand_in_sizes(scale)

    def as_dataset(self, split, *args, **kwargs):
        del self, args, kwargs
        base = str(split).split("[")[0]
        size = sizes[base]
        salt = list(sizes).index(base)

        def example(i):
            image = tf.random.stateless_uniform((96, 96, 3), seed=tf.stack([i, salt]),
                                                maxval=256, dtype=tf.int32)
            return {"image": tf.cast(image, tf.uint8), "label": i % num_classes}

        return tf.data.Dataset.range(size).map(example, num_parallel_calls=tf.data.AUTOTUNE)

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        yield


def report(study: dict) -> str:
    rows = [[r["stage"], f"{r['seconds']:.0f}", f"{r['peak_rss_mb'] / 1024:.2f}",
             f"{r['rss_after_mb'] / 1024:.2f}",
             f"{r['array_mb'] / 1024:.2f} GiB, peak {r['peak_over_array']:.2f}x its size"
             if "array_mb" in r else ""] for r in study["stages"]]
    return "\n".join([
        "# The paper preset at STL-10's full data shape", "",
        f"`{' '.join(['python experiments/paper_shape.py', *study['argv']])}` on "
        f"{study['environment']['cpu']}, {study['environment']['device']}; a random "
        "stand-in of STL-10's size (tfds mock data), the preset's settings with "
        f"`{' '.join(study['settings'])}`.", "",
        *markdown_table(["stage", "seconds", "peak GiB", "GiB held after",
                         "image array (peak growth over its size)"], rows), "",
        f"Peak resident memory of the whole command: {study['peak_rss_mb'] / 1024:.2f} GiB. "
        f"Final accuracy (random labels, so chance): {study['final_accuracy']:.4f}.", ""])


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = SCRIPT.parser()
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of STL-10's split sizes the stand-in serves (default 1)")
    args = parser.parse_args(argv)
    if not 0 < args.scale <= 1:
        raise UserError(f"need 0 < --scale <= 1, got {args.scale}")
    args.set = SHORT + list(args.set)  # later values win
    session = SCRIPT.session(args)
    config, out = session.config, session.out

    from cpcfl_tf.running.runner import Runner

    spec = RunSpec("cp-cfl-simclr", "cp-cfl", "simclr")
    # The stand-in's encoder must never be taken for a real STL-10 one: its own cache.
    sizes = stand_in_sizes(args.scale)
    stages = Stages()
    with cache_at(out / "cache"), stl10_stand_in(args.scale):
        runner = Runner("paper_shape", config, out / "runs",
                        context=RunContext(resume=args.resume, force=args.force))
        run_config = spec.config(config)
        with stages.stage(f"load the unlabeled images ({sizes['unlabelled']:,} x 96x96x3)"
                          ) as loaded:
            loaded["array_bytes"] = runner.data.unlabeled(run_config).nbytes
        with stages.stage(f"pre-train SimCLR ({run_config.pretrain.epochs} epoch(s))"):
            runner.encoders.contrastive(runner.plan_of(spec))
        with stages.stage(f"load the client images and draw the "
                          f"{run_config.partition.num_clients} clients") as loaded:
            _, train, test = runner.data.partition(run_config)
            loaded["array_bytes"] = train.images.nbytes + test.images.nbytes
        with stages.stage(f"federated CP-CFL (SimCLR), {run_config.federated.rounds} rounds"):
            record = runner.run(spec)
    stages.close()
    study = {"experiment": "paper_shape", "argv": argv, "settings": args.set,
             "stand_in": {"dataset": "stl10", "splits": sizes, "image_shape": [96, 96, 3]},
             "stages": stages.rows,
             "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
             "final_accuracy": record.final.accuracy, "environment": environment()}
    write_json(out / "paper_shape.json", study)
    (out / "paper_shape.md").write_text(report(study))
    print(report(study))


if __name__ == "__main__":
    run_cli(main)
