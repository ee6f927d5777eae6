"""Where a federated run's time goes, stage by stage.

Runs one federated run in this process, as ``experiments/run.py`` makes it (``--preset``,
``--method``, ``--pretraining``, ``--set``; its starting encoder from the cache, so put
the shipped encoders there first: ``python tools/encoders.py unpack
results/quick/encoders/encoders.tar``), or with ``--clients`` one of
``benchmark_simulator.py``'s random-data IFCA runs (``--participation``,
``--eval-every``), and times each stage of its rounds by wrapping the functions that do
it: the clients' local training (the stacked step and its Adam updates), selection (every
pool model's loss on each client's training data), scoring (each client's test data with
its cluster's model, F1/AUROC at the report rounds), the server's aggregation, the
checkpoint, and the rest of the rounds (Python between the stages, the round's plan,
the progress line). Nothing of the run changes: the wrappers only read the clock.

Prints one table; ``--out FILE`` also writes it with the machine as JSON. Run it alone:
anything sharing the cores slows some stages and not others.

``--feature-bits`` only checks what caching the frozen encoder's features through the Tc
phase (computed once instead of in every step, selection and scoring) would need to keep
every record's bits: that a feature computed in another batch has the same bits.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cpcfl_tf.errors import ArgumentParser, UserError, run_cli
from cpcfl_tf.plan.context import RunContext

STAGES = (
    ("training", "cpcfl_tf.clustered.stacked", "StackedBackend", "train"),
    ("training, heads only", None, None, None),
    ("selection", "cpcfl_tf.clustered.simulator", None, "client_losses"),
    ("scoring", "cpcfl_tf.clustered.simulator", None, "client_probabilities"),
    ("scores", "cpcfl_tf.clustered.simulator", None, "pooled_scores"),
    ("aggregation", "cpcfl_tf.clustered.algorithm", None, "aggregate"),
    ("checkpoint", "cpcfl_tf.clustered.simulator", None, "_save"),
)
"""(stage, module, class or None, function): what each stage's time is the time of. The
local training of a round whose clients train the heads only (the Tc phase) is its own
stage."""


@contextlib.contextmanager
def timed_stages(seconds: dict[str, float], calls: dict[str, int]):
    """Within the block each stage's function adds its wall time to ``seconds[stage]``
    and its calls to ``calls[stage]`` (a stage inside another's is counted in both)."""
    import importlib

    undo = []
    for stage, module_name, owner_name, name in STAGES:
        if module_name is None or name is None:  # a part of another stage's function
            continue
        owner = importlib.import_module(module_name)
        if owner_name:
            owner = getattr(owner, owner_name)
        real = getattr(owner, name)

        def wrapper(*args, _real=real, _stage=stage, **kwargs):
            if _stage == "training" and all(p == "head" for p in args[5]):  # epoch parts
                _stage = "training, heads only"  # the Tc phase: the encoder frozen
            began = time.perf_counter()
            try:
                return _real(*args, **kwargs)
            finally:
                seconds[_stage] = seconds.get(_stage, 0.0) + time.perf_counter() - began
                calls[_stage] = calls.get(_stage, 0) + 1

        setattr(owner, name, wrapper)
        undo.append((owner, name, real))
    try:
        yield
    finally:
        for owner, name, real in reversed(undo):
            setattr(owner, name, real)


def random_run(clients: int, participation: float, eval_every: int, rounds: int, seed: int):
    """``benchmark_simulator.py``'s run: ``clients`` random clients of 50 training and 50
    test 32-px images, IFCA with N = 3 from random weights."""
    from cpcfl_tf.clustered.clients import ClientArrays, Clients
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.plan.resolve import resolve

    rng = np.random.default_rng(seed)
    shape = (clients, 50, 32, 32, 3)
    data = [ClientArrays(rng.integers(0, 256, shape, np.uint8),
                         rng.integers(0, 10, shape[:2])) for _ in range(2)]
    made = Clients(data[0], data[1], np.arange(clients) % 3, 10,
                   [{"id": u} for u in range(clients)])
    config = get_preset("standard").with_overrides(
        data={"image_size": 32},
        federated={"method": "ifca", "pretraining": "none", "rounds": rounds,
                   "head_rounds": 0, "num_clusters": 3, "restart_round": rounds + 1,
                   "participation": participation, "eval_every": eval_every})
    return resolve(config), made, None


def kit_run(preset: str, method: str, pretraining: str, sets: Sequence[str]):
    """The run ``experiments/run.py`` would make, its clients and its starting encoder."""
    from cpcfl_tf.clustered.starting import StartingEncoders
    from cpcfl_tf.plan.overrides import parse_settings
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.plan.resolve import resolve
    from cpcfl_tf.running.run_data import DataCache

    config = get_preset(preset).with_overrides(None, **parse_settings(  # None: its seed
        [f"federated.method={method}", f"federated.pretraining={pretraining}", *sets]))
    run = resolve(config)
    encoders = StartingEncoders(context=RunContext(verbose=0))
    if not run.start.ready(encoders, run):
        raise UserError(f"{run.start.status(encoders, run)}: put it in the cache first (python "
                        f"tools/encoders.py unpack results/{preset}/encoders/encoders.tar), "
                        "or time a run from another start")
    return run, DataCache().clients(config), encoders(run)


def feature_bits(seed: int = 0, batch: int = 32, images: int = 50) -> float:
    """The largest difference between the CNN encoder's features of the same images
    computed in a batch of ``batch`` and within all ``images`` at once (inference, one
    client's training set): 0.0 when a feature's bits do not depend on the batch it is
    computed in, which a cache of the frozen encoder's features (the Tc phase) would need
    to leave the records' bits as they are."""
    import tensorflow as tf

    from cpcfl_tf.data.images import to_float
    from cpcfl_tf.models import build_encoder
    from cpcfl_tf.models.seeding import seeded

    with seeded(seed):
        encoder = build_encoder("cnn", (32, 32, 3))
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (images, 32, 32, 3), np.uint8)
    features = tf.function(lambda a: encoder(to_float(a), training=False))
    whole = features(tf.constant(x)).numpy()
    order = rng.permutation(images)
    return max(float(np.abs(features(tf.constant(x[order[lo:lo + batch]])).numpy()
                            - whole[order[lo:lo + batch]]).max())
               for lo in range(0, images, batch))


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="python benchmarks/round_stages.py",
                            description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--method", default="cp-cfl")
    parser.add_argument("--pretraining", default="simclr")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--clients", type=int, default=None,
                        help="time a random-data IFCA run of this many clients instead")
    parser.add_argument("--participation", type=float, default=1.0)
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4, help="rounds of a random-data run")
    parser.add_argument("--max-clients-per-step", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the table as JSON here")
    parser.add_argument("--feature-bits", action="store_true",
                        help="only say whether a frozen encoder's features keep their bits "
                             "in another batch")
    args = parser.parse_args(argv)
    if args.feature_bits:
        diff = feature_bits(args.seed)
        print(f"features of one image in a batch of 32 and in one of 50: largest difference "
              f"{diff:.3g} ({'the same bits' if diff == 0 else 'other bits'})")
        return
    if args.clients is not None and (args.clients < 1 or args.rounds < 1
                                     or not 0 < args.participation <= 1
                                     or args.eval_every < 1):
        raise UserError("need --clients >= 1, --rounds >= 1, 0 < --participation <= 1, "
                        "--eval-every >= 1")
    if args.out and Path(args.out).is_dir():
        raise UserError(f"--out {args.out} is a folder; name a file")

    from cpcfl_tf.clustered.simulator import run_federated
    from cpcfl_tf.records.environment import environment

    if args.clients is not None:
        run, clients, encoder = random_run(args.clients, args.participation, args.eval_every,
                                           args.rounds, args.seed)
        what = (f"IFCA, {args.clients} random clients, participation {args.participation:g}, "
                f"scored every {args.eval_every}, {args.rounds} rounds")
    else:
        run, clients, encoder = kit_run(args.preset, args.method, args.pretraining, args.set)
        what = (f"{args.method} ({args.pretraining}), preset {args.preset}, "
                f"{run.config.federated.rounds} rounds")
    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    stamps, after_first = [time.perf_counter()], []

    def on_round(*_):
        stamps.append(time.perf_counter())
        if len(stamps) == 2:  # the first round traces every step: left out of the table
            after_first.append((dict(seconds), dict(calls)))

    with timed_stages(seconds, calls):
        context = RunContext(verbose=0, max_clients=args.max_clients_per_step)
        run_federated(run, clients, encoder_weights=encoder, context=context,
                      on_round=on_round)
    rounds = np.diff(stamps)
    if len(rounds) < 2:
        raise UserError("time at least 2 rounds: the first one traces the steps")
    first_s, first_n = after_first[0]
    steady = {k: v - first_s.get(k, 0.0) for k, v in seconds.items()}
    counted = {k: n - first_n.get(k, 0) for k, n in calls.items()}
    total = float(rounds[1:].sum())
    rest = total - sum(steady.values())
    rows = [(s, steady.get(s, 0.0), counted.get(s, 0)) for s, *_ in STAGES] + [
        ("the rest of the rounds", rest, len(rounds) - 1)]
    print(f"# Where the time of one run goes: {what}\n")
    print(f"Rounds after the first: {len(rounds) - 1}, {total:.1f} s, "
          f"{total / (len(rounds) - 1):.2f} s each (the first, which traces the steps: "
          f"{rounds[0]:.1f} s)\n")
    print("| stage | seconds | share | calls |\n|---|---|---|---|")
    for stage, s, n in rows:
        print(f"| {stage} | {s:.1f} | {100 * s / total:.0f} % | {n} |")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "run": what, "round_seconds": rounds.tolist(),
            "stages": {s: {"seconds": v, "calls": n} for s, v, n in rows},
            "environment": environment()}, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
