"""Speed of one clustered-FL round of the CNN: the simulator against a plain Keras loop.

Random data (speed does not depend on content): C clients with 50 training and 50 test
images each, N random CNN + theta_c models, IFCA rounds (every round selects by
training loss and trains the whole model: the full cost of a CFL round). Ours is
:func:`cpcfl_tf.clustered.simulator.run_federated`. The baseline is the loop a typical
reproduction writes: per client, ``model.evaluate`` each of the N models, then
``model.compile`` (fresh Adam) and ``model.fit`` for 3 epochs, then ``model.evaluate``
on the test data. Both report the mean over rounds after the first (tracing, warm-up).

Writes one JSON per setting into ``--out`` and ``benchmark_simulator.md`` over every JSON
under it (``--report-only`` rewrites that table and times nothing).
"""
from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.records.environment import environment
from cpcfl_tf.running.cli import positive_int, print_metrics
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.script import Script


def plain_keras_round(model, pool, train_x, train_y, test_x, test_y, *, epochs: int,
                      batch_size: int, learning_rate: float):
    """One CFL round written the obvious way, with Keras' high-level API per client."""
    import keras

    from cpcfl_tf.clustered import algorithm

    weights, ids = [], []
    for x, y in zip(train_x, train_y):
        losses = []
        for candidate in pool:
            model.set_weights(candidate)
            model.compile(loss="sparse_categorical_crossentropy")
            losses.append(model.evaluate(x, y, batch_size=batch_size, verbose=0,
                                         return_dict=True)["loss"])
        ids.append(int(np.argmin(losses)))
        model.set_weights(pool[ids[-1]])
        model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0, shuffle=True)
        weights.append(model.get_weights())
    cluster_ids = np.array(ids)
    stacked = [np.stack(a) for a in zip(*weights)]
    state = algorithm.aggregate(algorithm.ServerState(0, pool, 0), stacked, cluster_ids,
                                np.full(len(ids), train_x.shape[1]))
    accuracy = []
    for x, y, n in zip(test_x, test_y, ids):
        model.set_weights(state.models[n])
        accuracy.append(model.evaluate(x, y, batch_size=batch_size, verbose=0,
                                       return_dict=True)["accuracy"])
    return state.models, float(np.mean(accuracy))


SCRIPT = Script(__file__, __doc__, default_preset="standard", distribute=False,
                runs=False)


def report(folder: Path) -> str:
    """``benchmark_simulator.md``: one row per JSON under ``folder``."""
    rows = []
    for path in sorted(folder.rglob("*.json")):
        r = json.loads(path.read_text())
        plain = r.get("baseline_seconds_per_round")
        memory = r.get("peak_memory_mb")
        rows.append([f"`{path.relative_to(folder)}`", r["environment"].get("cpu", "not recorded"),
                     r["clients"], f"{r.get('participation', 1.0):g}",
                     r.get("max_clients_per_step") or "all", r.get("eval_every", 1),
                     len(r["simulator_round_seconds"]),
                     "yes" if r.get("xla") else "no", f"{r['seconds_per_round']:.2f}",
                     (f"{r['cost_vs_reference']:.2f}x {r['reference_clients']} clients' "
                      f"{r['reference_seconds_per_round']:.2f} s") if "cost_vs_reference" in r
                     else "",
                     f"{plain:.1f}" if plain else "",
                     f"{r['speedup']:.1f}x" if plain else "",
                     f"{memory:,.0f}" if memory else ""])
    return "\n".join([
        "# One IFCA round of the CNN: the simulator against a plain Keras loop", "",
        "Written by `python benchmarks/benchmark_simulator.py` from every JSON under this "
        "folder; each row's CPU is the one it ran on. Rounds after the first, N = 3, 50 "
        "training and 50 test images per client, 3 local epochs; *scored every*: rounds "
        "between scoring every client on its test data (`federated.eval_every`; the rounds "
        "a report reads are scored too: the quarters of the run, every 25th, the last); "
        "*rounds*: the run's length.", "",
        *markdown_table(["file", "CPU", "clients", "participation", "clients per step",
                         "scored every", "rounds", "XLA", "s / round",
                         "against a round of (same run)",
                         "plain Keras s / round", "speed-up", "peak memory (MB)"], rows), ""])


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    parser.add_argument("--clients", type=int, default=60)
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the simulator")
    parser.add_argument("--reference-rounds", type=int,
                        help="rounds of the --reference-clients run (default --rounds)")
    parser.add_argument("--baseline-rounds", type=int, default=2,
                        help="rounds of the plain Keras loop (0: skip it)")
    parser.add_argument("--backend", default="auto", choices=["auto", "stacked", "keras"])
    parser.add_argument("--participation", type=float, default=1.0,
                        help="share of clients drawn each round (default 1.0)")
    parser.add_argument("--xla", action="store_true",
                        help="XLA-compile the local step and forward pass "
                             "(the same as --set federated.jit_compile=true)")
    parser.add_argument("--max-clients-per-step", type=positive_int, default=None, metavar="N",
                        help="train at most N clients per step (bounds memory)")
    parser.add_argument("--eval-every", type=positive_int, default=1,
                        help="score every client every this many rounds and in the last "
                             "(federated.eval_every; default 1)")
    parser.add_argument("--reference-clients", type=positive_int, metavar="K",
                        help="first time a round of K clients, all taking part and scored "
                             "every round, in the same process: the record's "
                             "cost_vs_reference is this run's round over that one")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite benchmark_simulator.md from the JSONs under --out")
    args = parser.parse_args(argv)
    if not 0 < args.participation <= 1:
        raise UserError(f"need 0 < --participation <= 1, got {args.participation}")
    args.reference_rounds = args.reference_rounds or args.rounds
    if (args.clients < 1 or args.clusters < 1 or args.rounds < 2 or args.baseline_rounds < 0
            or args.reference_rounds < 2):
        raise UserError("need --clients >= 1, --clusters >= 1, --rounds >= 2, "
                        "--reference-rounds >= 2, --baseline-rounds >= 0")
    if args.image_size < 32:
        raise UserError(f"--image-size must be at least 32, got {args.image_size}")
    session = SCRIPT.session(args)
    config, out = session.config, session.out
    if args.report_only:
        (out / "benchmark_simulator.md").write_text(report(out))
        return

    from cpcfl_tf.clustered.clients import ClientArrays, Clients
    from cpcfl_tf.clustered.pool import build_template, initial_pool
    from cpcfl_tf.clustered.simulator import run_federated
    from cpcfl_tf.plan.resolve import resolve
    from cpcfl_tf.records.files import write_json

    def timed(clients_count: int, participation: float, eval_every: int, rounds: int):
        """Seconds of each simulator round of ``clients_count`` random clients, and the
        config and clients it ran."""
        rng = np.random.default_rng(args.seed)
        shape = (clients_count, 50, args.image_size, args.image_size, 3)
        data = [ClientArrays(rng.integers(0, 256, shape, np.uint8),
                             rng.integers(0, 10, shape[:2])) for _ in range(2)]
        clients = Clients(data[0], data[1], np.arange(clients_count) % 3, 10,
                          [{"id": u} for u in range(clients_count)])
        run = config.with_overrides(
            data={"image_size": args.image_size},
            federated={"method": "ifca", "pretraining": "none", "rounds": rounds,
                       "head_rounds": 0, "num_clusters": args.clusters,
                       "backend": args.backend, "restart_round": rounds + 1,
                       "participation": participation, "eval_every": eval_every,
                       **({"jit_compile": True} if args.xla else {})})
        stamps = [time.perf_counter()]
        plan = resolve(run)
        context = RunContext(verbose=0, max_clients=args.max_clients_per_step)
        run_federated(plan, clients, context=context,
                      on_round=lambda *_: stamps.append(time.perf_counter()))
        seconds = np.diff(stamps)
        print(f"{clients_count} clients, rounds (s): {', '.join(f'{s:.2f}' for s in seconds)}",
              file=sys.stderr)
        return seconds, plan, data, shape

    reference = None
    if args.reference_clients:  # first, so both share this process's warm-up
        reference, *_ = timed(args.reference_clients, 1.0, 1, args.reference_rounds)
    ours, run, data, shape = timed(args.clients, args.participation, args.eval_every, args.rounds)

    result = {"experiment": "benchmark_simulator", "clients": args.clients,
              "clusters": args.clusters, "image_size": args.image_size,
              "backend": args.backend, "seconds_per_round": float(ours[1:].mean()),
              "simulator_round_seconds": ours.tolist(), "environment": environment()}
    if run.federated.jit_compile:
        result["xla"] = True
    if args.eval_every != 1:
        result["eval_every"] = args.eval_every
    if reference is not None:
        result.update(reference_clients=args.reference_clients,
                      reference_round_seconds=reference.tolist(),
                      reference_seconds_per_round=float(reference[1:].mean()),
                      cost_vs_reference=float(ours[1:].mean() / reference[1:].mean()))
    if args.participation != 1.0 or args.max_clients_per_step:
        import resource  # peak resident memory of this process so far (Linux: KiB)

        result.update(participation=args.participation,
                      max_clients_per_step=args.max_clients_per_step,
                      peak_memory_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if args.baseline_rounds:
        fl = run.federated
        model = build_template(run, shape[2:], 10)
        pool = initial_pool(run, model, None, seed=args.seed, attempt=0)
        to_float = lambda a: a.astype(np.float32) / 255.0  # noqa: E731
        times = []
        for _ in range(args.baseline_rounds):
            started = time.perf_counter()
            pool, _ = plain_keras_round(model, pool, to_float(data[0].images), data[0].labels,
                                        to_float(data[1].images), data[1].labels,
                                        epochs=fl.local_epochs, batch_size=fl.batch_size,
                                        learning_rate=fl.learning_rate)
            times.append(time.perf_counter() - started)
            print(f"plain Keras round: {times[-1]:.1f} s", file=sys.stderr)
        steady = times[1:] or times
        result.update(baseline_round_seconds=times,
                      baseline_seconds_per_round=float(np.mean(steady)),
                      speedup=float(np.mean(steady) / result["seconds_per_round"]))
    print_metrics(result, ("seconds_per_round", "reference_seconds_per_round",
                           "cost_vs_reference", "baseline_seconds_per_round", "speedup",
                           "peak_memory_mb"), 3)
    extra = ("-xla" if run.federated.jit_compile else "") + (
        f"-p{args.participation:g}" if args.participation != 1.0 else "") + (
        f"-e{args.eval_every}" if args.eval_every != 1 else "") + (
        f"-vs{args.reference_clients}" if args.reference_clients else "") + (
        f"-k{args.max_clients_per_step}" if args.max_clients_per_step else "")
    path = write_json(out / f"c{args.clients}-n{args.clusters}-{args.image_size}px-"
                            f"{args.backend}{extra}.json",
                      result)
    (out / "benchmark_simulator.md").write_text(report(out))
    print(f"wrote {path} and {out / 'benchmark_simulator.md'}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
