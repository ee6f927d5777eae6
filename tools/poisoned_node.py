"""What one registered node sending every weight as 1e30 does to a federation, under each aggregation.

The ServerApp and three ClientApps of the preset run in one process (the Flower apps
themselves, without the transport: ``cpcfl_tf.flower.in_process``), FedAvg from the
server's SimCLR encoder (N = 1: every node's reply is in the one cluster), once honest and
once with node 2 started with ``tamper="huge-weights"`` (every weight of every training
reply 1e30: finite, of the right shapes, so it passes the server's checks and counts).
Each under ``federated.aggregation`` mean (the paper's), median, trimmed-mean (with
``trim_fraction`` 0.34, so that one of three is cut; the default 0.2 cuts none of three)
and under ``federated.update_norm`` (the largest update norm an honest node sent in the
honest run with the mean). Writes ``poisoned_node.json`` and ``poisoned_node.md``: the
largest absolute weight of the model after every round and each honest node's final
accuracy.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from cpcfl_tf.errors import run_cli
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="smoke", distribute=False, runs=False)
NODES, BAD = 3, 2
"""Three nodes; node 2 sends 1e30."""
TRIM = 0.34
DEFENCES = {"mean": {}, "median": {"aggregation": "median"},
            "trimmed-mean": {"aggregation": "trimmed-mean", "trim_fraction": TRIM}}


def federation(preset: str, seed: int, settings: dict, poisoned: bool, folder: Path,
               rounds: int) -> dict:
    """One in-process run: its record, the largest |weight| after each round, and the
    L2 norm of every honest update it received."""
    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.flower import remote
    from cpcfl_tf.flower.in_process import run_in_process

    largest, norms = [], []
    aggregate, train = algorithm.aggregate, remote.Nodes.train

    def watched(state, *args, **kwargs):
        new = aggregate(state, *args, **kwargs)
        largest.append(float(max(np.abs(w).max() for m in new.models for w in m)))
        return new

    def measured(self, models, plan):
        replies = train(self, models, plan)
        for u, client in enumerate(replies.clients):
            if client != BAD:
                sent = models[replies.cluster_ids[u]]
                norms.append(float(np.sqrt(sum(np.square(
                    w[u].astype(np.float64) - s.astype(np.float64)).sum()
                    for w, s in zip(replies.weights, sent)))))
        return replies

    algorithm.aggregate, remote.Nodes.train = watched, measured
    try:
        run = {"preset": preset, "method": "fedavg", "pretraining": "simclr",
               "num-clusters": 1, "rounds": rounds, "head-rounds": 0, "num-clients": NODES,
               "seed": seed, "out": str(folder / "record.json"),
               "set": " ".join(f"federated.{k}={v}" for k, v in settings.items())}
        nodes = [{"partition-id": k, "num-partitions": NODES,
                  **({"tamper": "huge-weights"} if poisoned and k == BAD else {})}
                 for k in range(NODES)]
        record = run_in_process(run, nodes)
    finally:
        algorithm.aggregate, remote.Nodes.train = aggregate, train
    return {"record": record, "largest": largest, "honest_norms": norms}


def study(preset: str, seed: int, rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="poisoned_node-") as work:
        work = Path(work)
        honest = federation(preset, seed, {}, False, work, rounds)
        bound = max(honest["honest_norms"])
        defences = {**DEFENCES, "update-norm": {"update_norm": bound}}
        rows = {}
        for name, settings in defences.items():
            runs = {"honest": honest if name == "mean" else
                    federation(preset, seed, settings, False, work, rounds),
                    "poisoned": federation(preset, seed, settings, True, work, rounds)}
            rows[name] = {"settings": settings, **{
                kind: {"largest_weight": run["largest"],
                       "client_accuracy": {k: v for k, v in run["record"]["final"][
                           "client_accuracy"].items() if k != str(BAD)}}
                for kind, run in runs.items()}}
    return {"preset": preset, "seed": seed, "rounds": rounds, "nodes": NODES,
            "poisoned_node": BAD, "update_norm": bound, "defences": rows}


def report(summary: dict) -> str:
    lines = [f"# One node of {summary['nodes']} sends every weight as 1e30 (preset "
             f"`{summary['preset']}`, FedAvg from SimCLR, T = {summary['rounds']})", "",
             "Written by `python tools/poisoned_node.py --preset "
             f"{summary['preset']}`. Node {summary['poisoned_node']}'s replies pass the "
             "server's checks (finite, the right shapes) and count. Largest absolute weight "
             "of the model after each round, and the honest nodes' final accuracy (%), "
             "honest run -> with the poisoned node. The update bound is the largest update "
             f"norm an honest node sent in the honest run: {summary['update_norm']:.4g}.", "",
             "| aggregation | largest weight, honest | largest weight, poisoned | "
             "honest nodes' accuracy, honest -> poisoned |", "|---|---|---|---|"]
    for name, row in summary["defences"].items():
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in row["settings"].items()) or "the paper's"

        def weights(kind):
            return " / ".join(f"{w:.3g}" for w in row[kind]["largest_weight"])

        accuracy = "; ".join(
            f"node {k}: {100 * row['honest']['client_accuracy'][k]:.1f} -> "
            f"{100 * row['poisoned']['client_accuracy'][k]:.1f}"
            for k in sorted(row["honest"]["client_accuracy"]))
        lines.append(f"| {name} ({shown}) | {weights('honest')} | {weights('poisoned')} | "
                     f"{accuracy} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each run (default 3)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        from cpcfl_tf.errors import UserError

        raise UserError(f"--rounds must be >= 1, got {args.rounds}")
    session = SCRIPT.session(args)
    summary = study(session.config.preset, session.config.seed, args.rounds)
    from cpcfl_tf.records.files import write_json

    write_json(session.out / "poisoned_node.json", summary)
    session.finish(report(summary))


if __name__ == "__main__":
    run_cli(main)
