"""What one registered node sending every weight as 1e30 does to a federation, under each
defence and at each cluster size.

The ServerApp and the ClientApps of the preset run in one process (the Flower apps
themselves, without the transport: ``cpcfl_tf.flower.in_process``), FedAvg from the
server's SimCLR encoder (N = 1: every node's reply is in the one cluster, so the cluster
has as many members as there are nodes), the last node started with
``tamper="huge-weights"`` (every weight of every training reply 1e30: finite, of the
right shapes, so it passes the server's checks and counts).

Two tables:

- three nodes, honest and poisoned, under ``federated.aggregation`` mean (the paper's),
  median and trimmed-mean (``trim_fraction`` at its default, 0.2) and under
  ``federated.update_norm`` (the largest update norm an honest node sent in the honest
  run with the mean): the largest absolute weight of the model after every round and each
  honest node's final accuracy;
- clusters of ``--sizes`` nodes (default 1-6), one of them poisoned, under each defence
  and each robust aggregation with the norm bound behind it: the largest absolute weight
  after every round, or the one line a run that cannot hold the defence is refused with.

Writes ``poisoned_node.json`` and ``poisoned_node.md``.
"""
from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="smoke", distribute=False, runs=False)
NODES = 3
"""The first table's nodes; the last one sends 1e30."""
DEFENCES: dict[str, dict[str, Any]] = {"mean": {}, "median": {"aggregation": "median"},
            "trimmed-mean": {"aggregation": "trimmed-mean"}}
BOUND = "update-norm"
"""The update bound's row: its value is measured in the honest run."""


def groups_of(nodes: int) -> int:
    """The partition's groups for ``nodes`` clients: the preset's 3 where they divide them,
    else the most that do (each group needs as many clients)."""
    return max(g for g in (1, 2, 3) if nodes % g == 0)


def federation(preset: str, seed: int, settings: dict, poisoned: bool, folder: Path,
               rounds: int, nodes: int = NODES) -> dict:
    """One in-process run of ``nodes`` nodes: its record, the largest |weight| after each
    round, and the L2 norm of every honest update it received."""
    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.flower import remote
    from cpcfl_tf.flower.in_process import run_in_process

    largest, norms = [], []
    aggregate, train = algorithm.aggregate, remote.Nodes.train
    bad = nodes - 1

    def watched(state, *args, **kwargs):
        new = aggregate(state, *args, **kwargs)
        largest.append(float(max(np.abs(w).max() for m in new.models for w in m)))
        return new

    def measured(self, models, plan):
        replies = train(self, models, plan)
        for u, client in enumerate(replies.clients):
            if not (poisoned and client == bad):
                sent = models[replies.cluster_ids[u]]
                norms.append(float(np.sqrt(sum(np.square(
                    w[u].astype(np.float64) - s.astype(np.float64)).sum()
                    for w, s in zip(replies.weights, sent)))))
        return replies

    # watched for this run, put back below
    algorithm.aggregate, remote.Nodes.train = watched, measured  # type: ignore[method-assign]
    try:
        run = {"preset": preset, "method": "fedavg", "pretraining": "simclr",
               "num-clusters": 1, "rounds": rounds, "head-rounds": 0, "num-clients": nodes,
               "seed": seed, "out": str(folder / "record.json"),
               "set": " ".join([f"partition.num_groups={groups_of(nodes)}",
                                *(f"federated.{k}={v}" for k, v in settings.items())])}
        configs = [{"partition-id": k, "num-partitions": nodes,
                    **({"tamper": "huge-weights"} if poisoned and k == bad else {})}
                   for k in range(nodes)]
        record = run_in_process(run, configs)
    finally:
        algorithm.aggregate, remote.Nodes.train = aggregate, train  # type: ignore[method-assign]
    return {"record": record, "largest": largest, "honest_norms": norms}


def sweep(preset: str, seed: int, rounds: int, sizes: Sequence[int], bound: float,
          work: Path) -> dict:
    """For each defence and each cluster size: the poisoned run's largest weight after
    every round, or the line it was refused with."""
    defences = {**DEFENCES, BOUND: {"update_norm": bound},
                **{f"{name} + {BOUND}": {**settings, "update_norm": bound}
                   for name, settings in DEFENCES.items() if settings}}
    rows: dict[str, dict[str, Any]] = {}
    for name, settings in defences.items():
        rows[name] = {"settings": settings, "sizes": {}}
        for size in sizes:
            try:
                run = federation(preset, seed, settings, True, work, rounds, size)
                rows[name]["sizes"][str(size)] = {"largest_weight": run["largest"]}
            except UserError as err:
                rows[name]["sizes"][str(size)] = {"refused": str(err)}
    return rows


def study(preset: str, seed: int, rounds: int, sizes: Sequence[int]) -> dict:
    with tempfile.TemporaryDirectory(prefix="poisoned_node-") as tmp:
        work = Path(tmp)
        honest = federation(preset, seed, {}, False, work, rounds)
        bound = max(honest["honest_norms"])
        defences = {**DEFENCES, BOUND: {"update_norm": bound}}
        rows = {}
        for name, settings in defences.items():
            runs = {"honest": honest if name == "mean" else
                    federation(preset, seed, settings, False, work, rounds),
                    "poisoned": federation(preset, seed, settings, True, work, rounds)}
            rows[name] = {"settings": settings, **{
                kind: {"largest_weight": run["largest"],
                       "client_accuracy": {k: v for k, v in run["record"]["final"][
                           "client_accuracy"].items() if k != str(NODES - 1)}}
                for kind, run in runs.items()}}
        sizes_rows = sweep(preset, seed, rounds, sizes, bound, work)
    return {"preset": preset, "seed": seed, "rounds": rounds, "nodes": NODES,
            "poisoned_node": NODES - 1, "update_norm": bound, "defences": rows,
            "sizes": list(sizes), "by_size": sizes_rows}


def _settings(settings: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in settings.items()) or "the paper's"


def report(summary: dict) -> str:
    lines = [f"# One node sends every weight as 1e30 (preset `{summary['preset']}`, FedAvg "
             f"from SimCLR, T = {summary['rounds']})", "",
             "Written by `python tools/poisoned_node.py --preset "
             f"{summary['preset']}`. The poisoned node's replies pass the server's checks "
             "(finite, the right shapes) and count. The update bound is the largest update "
             f"norm an honest node sent in the honest run of {summary['nodes']} nodes with "
             f"the mean: {summary['update_norm']:.4g}.", "",
             f"## {summary['nodes']} nodes, node {summary['poisoned_node']} poisoned", "",
             "Largest absolute weight of the model after each round, and the honest nodes' "
             "final accuracy (%), honest run -> with the poisoned node.", "",
             "| aggregation | largest weight, honest | largest weight, poisoned | "
             "honest nodes' accuracy, honest -> poisoned |", "|---|---|---|---|"]
    def weights(row, kind):
        return " / ".join(f"{w:.3g}" for w in row[kind]["largest_weight"])

    for name, row in summary["defences"].items():
        accuracy = "; ".join(
            f"node {k}: {100 * row['honest']['client_accuracy'][k]:.1f} -> "
            f"{100 * row['poisoned']['client_accuracy'][k]:.1f}"
            for k in sorted(row["honest"]["client_accuracy"]))
        lines.append(f"| {name} ({_settings(row['settings'])}) | {weights(row, 'honest')} | "
                     f"{weights(row, 'poisoned')} | {accuracy} |")
    sizes = summary["sizes"]
    lines += ["", "## One poisoned node in a cluster of n", "",
              "The largest absolute weight of the model after the last round (FedAvg: "
              "the cluster is every node, one of them poisoned), or `refused` where the run "
              "is refused before it starts (a robust aggregation without the norm bound, "
              "where the cluster has fewer than 3 members).", "",
              "| defence | " + " | ".join(f"n = {n}" for n in sizes) + " |",
              "|---|" + "---|" * len(sizes)]
    refusals: dict[str, tuple[int, str]] = {}
    for name, row in summary["by_size"].items():
        cells = []
        for n in sizes:
            cell = row["sizes"][str(n)]
            if "refused" in cell:
                cells.append("refused")
                refusals.setdefault(name, (n, cell["refused"]))
            else:
                cells.append(f"{cell['largest_weight'][-1]:.3g}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, (n, line) in refusals.items():
        lines += ["", f"{name} at n = {n} is refused in one line: \"{line}\""]
    return "\n".join(lines) + "\n"


def _sizes(text: str) -> list[int]:
    low, _, high = text.partition("-")
    try:
        sizes = list(range(int(low), int(high or low) + 1))
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise UserError(f"--sizes {text!r}: give node counts as N or N-M, at least 1 (e.g. 1-6)")
    return sizes


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each run (default 3)")
    parser.add_argument("--sizes", default="1-6", help="cluster sizes (nodes) of the second "
                                                      "table, N or N-M (default 1-6)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise UserError(f"--rounds must be >= 1, got {args.rounds}")
    sizes = _sizes(args.sizes)
    session = SCRIPT.session(args)
    summary = study(session.config.preset, session.config.seed, args.rounds, sizes)
    from cpcfl_tf.records.files import write_json

    write_json(session.out / "poisoned_node.json", summary)
    session.finish(report(summary))


if __name__ == "__main__":
    run_cli(main)
