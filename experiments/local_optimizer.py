"""Why FedAvg's accuracy zig-zags: FedAvg (None) and CP-CFL (SimCLR) under the paper's
local training and variants that isolate the cause.

The paper trains every client with Adam 1e-3 for 3 epochs of batch 32 (Sec.
"Experimental settings"), and the kit gives each client a fresh Adam state every round.
The variants change one thing each: a 10x smaller learning rate, plain SGD, Adam moments
kept by each client between rounds, one local epoch. For each run the script reports the
final and best accuracy, the zig-zag amplitude (mean of |a[t+1] - 2 a[t] + a[t-1]| / 2
over the second half of the rounds) and the cosine between successive server updates
(-1: each round undoes the last), and it records the accuracy of every class and client
in every round (``<run>.rounds.json``) to show which of them flip.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cpcfl_tf.errors import run_cli
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import Runner, RunSpec
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__)

VARIANTS: dict[str, tuple[dict[str, Any], str]] = {
    "paper": ({}, "Adam 1e-3, fresh state (paper)"),
    "lr1e-4": ({"learning_rate": 1e-4}, "Adam 1e-4, fresh state"),
    "sgd": ({"local_optimizer": "sgd", "learning_rate": 0.05}, "SGD 0.05"),
    "kept": ({"optimizer_state": "client"}, "Adam 1e-3, state kept per client"),
    "e1": ({"local_epochs": 1}, "Adam 1e-3, fresh state, E = 1"),
}
"""Variant name: (federated overrides, label)."""
METHODS = {"fedavg-none": ("fedavg", "none", "FedAvg (None)"),
           "cp-cfl-simclr": ("cp-cfl", "simclr", "CP-CFL (SimCLR)")}
SPECS = [RunSpec(f"{method}-{variant}", fl_method, pre, dict(overrides), row=method)
         for method, (fl_method, pre, _) in METHODS.items()
         for variant, (overrides, _) in VARIANTS.items()]


class RoundProbe:
    """``on_round`` callback recording, per round, each class's and each client's test
    accuracy and the server update (its norm, and its cosine with the previous round's),
    into ``path`` (rewritten every round, so a resumed run keeps the earlier rounds)."""

    def __init__(self, path: Path, clients, backend):
        self.path, self.clients, self.backend = path, clients, backend
        self.rounds = read_probe(path)
        self._last: tuple[list[np.ndarray], list[np.ndarray] | None] | None = None
        """(models, update) of the previous round this process saw."""

    def __call__(self, record: dict, state) -> None:
        """``record``: the round's record as the round loop made it (JSON)."""
        from cpcfl_tf.clustered.backends import client_probabilities
        from cpcfl_tf.clustered.metrics import class_accuracy, client_accuracy
        from cpcfl_tf.records.files import write_json

        ids = np.asarray(record["cluster_ids"])
        probs = client_probabilities(self.backend, state.models, ids, self.clients.test)
        flat = [np.concatenate([a.ravel() for a in m]) for m in state.models]
        entry = {"round": record["round"],
                 "class_accuracy": class_accuracy(self.clients.test.labels, probs,
                                                  self.clients.num_classes).tolist(),
                 "client_accuracy": client_accuracy(self.clients.test.labels, probs).tolist()}
        if self._last is not None:
            previous, before = self._last
            update = [m - p for m, p in zip(flat, previous)]
            entry["update_norm"] = float(np.mean([np.linalg.norm(u) for u in update]))
            if before is not None:
                entry["update_cosine"] = float(np.mean([
                    u @ b / max(np.linalg.norm(u) * np.linalg.norm(b), 1e-30)
                    for u, b in zip(update, before)]))
            self._last = (flat, update)
        else:
            self._last = (flat, None)
        self.rounds = [r for r in self.rounds if r["round"] < entry["round"]] + [entry]
        write_json(self.path, {"rounds": self.rounds})


def read_probe(path: Path) -> list[dict]:
    """The rounds a :class:`RoundProbe` recorded in ``path`` (none if it does not exist)."""
    from cpcfl_tf.records.files import read_file

    if not path.exists():
        return []
    return read_file(path, lambda p: json.loads(p.read_text())["rounds"],
                     fix="delete it and rerun this script with --force")


def probe_for(runner: Runner, spec: RunSpec) -> RoundProbe:
    from cpcfl_tf.clustered.backends import backend_of
    from cpcfl_tf.clustered.pool import build_template

    run = runner.plan_of(spec)
    clients = runner.data.clients(run.requested)
    fl = run.federated
    template = build_template(run, clients.test.images.shape[2:], clients.num_classes)
    return RoundProbe(runner.out / f"{spec.name}.rounds.json", clients,
                      backend_of(template, fl))


def summary(record: RunRecord, probe_rounds: list[dict]) -> dict:
    """Final and best accuracy, zig-zag amplitude, and over the second half: the mean cosine
    of successive server updates and the mean correlation of successive rounds' changes
    of per-class accuracy (both -1 when every round undoes the one before)."""
    from cpcfl_tf.clustered.metrics import zigzag_amplitude

    accuracy = np.array([r.accuracy for r in record.rounds])
    half = len(accuracy) // 2
    late = [r for r in probe_rounds if r["round"] > half]
    cosines = [r["update_cosine"] for r in late if "update_cosine" in r]
    change = np.diff([r["class_accuracy"] for r in late], axis=0)
    flips = [np.corrcoef(a, b)[0, 1] for a, b in zip(change, change[1:])
             if a.std() > 0 and b.std() > 0]
    return {"final": float(accuracy[-1]), "best": float(accuracy.max()),
            "zigzag": zigzag_amplitude(accuracy),
            "update_cosine": float(np.mean(cosines)) if cosines else float("nan"),
            "class_flip": float(np.mean(flips)) if flips else float("nan")}


def flip_lines(record: RunRecord, probe_rounds: list[dict], groups: np.ndarray) -> list[str]:
    """Per-class and per-group accuracy at the two consecutive rounds of the second half
    between which the mean accuracy jumps most."""
    by_round = {r["round"]: r for r in probe_rounds}
    accuracy = {r.round: r.accuracy for r in record.rounds if r.accuracy is not None}
    half = len(accuracy) // 2
    pairs = [(t, t + 1) for t in accuracy
             if t > half and t + 1 in accuracy and t + 1 in by_round and t in by_round]
    if not pairs:
        return ["(no per-round probe for this run: rerun it with --force to record one)"]
    t, u = max(pairs, key=lambda p: abs(accuracy[p[1]] - accuracy[p[0]]))
    a, b = by_round[t], by_round[u]
    classes = range(len(a["class_accuracy"]))
    lines = [f"Rounds {t} and {u}: mean client accuracy {100 * accuracy[t]:.2f} -> "
             f"{100 * accuracy[u]:.2f} %.", ""]
    lines += markdown_table(["round", *(f"class {c}" for c in classes)],
                            [[e["round"], *(f"{100 * v:.0f}" for v in e["class_accuracy"])]
                             for e in (a, b)])
    group_ids = np.unique(groups)
    lines += [""] + markdown_table(
        ["round", *(f"group {g} clients" for g in group_ids)],
        [[e["round"], *(f"{100 * np.array(e['client_accuracy'])[groups == g].mean():.1f}"
                        for g in group_ids)] for e in (a, b)])
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv)
    config, out = session.config, session.out
    records, probes = {}, {}
    for spec in session.kept(SPECS):
        probe = probe_for(session.runner, spec)
        records[spec.name] = session.runner.run(spec, on_round=probe)
        probes[spec.name] = read_probe(out / f"{spec.name}.rounds.json")

    from cpcfl_tf.evidence.plots import plot_accuracy_curves, plot_class_accuracy

    rounds = config.federated.rounds
    lines = [f"# Local optimizer and FedAvg's zig-zag (preset `{config.preset}`), "
             f"{config.partition.num_clients} clients, T = {rounds}", "",
             "zig-zag: mean |a[t+1] - 2a[t] + a[t-1]| / 2 over the second half (points of "
             "accuracy); cosine: mean cosine between successive server updates; class flip: "
             "mean correlation between successive rounds' changes of per-class accuracy "
             "(both over the second half; -1: every round undoes the previous one).", ""]
    table, rows = [], []
    for spec in SPECS:
        method, variant = spec.key, spec.name[len(spec.key) + 1:]
        s = summary(records[spec.name], probes[spec.name])
        table.append([VARIANTS[variant][1], METHODS[method][2], f"{100 * s['final']:.2f}",
                      f"{100 * s['best']:.2f}", f"{100 * s['zigzag']:.2f}",
                      f"{s['update_cosine']:.3f}", f"{s['class_flip']:.3f}"])
        rows.append({"run": spec.name, "method": method, "variant": variant, **s})
    lines += markdown_table(["local training", "method", "final (%)", "best (%)",
                             "zig-zag (points)", "cosine", "class flip"], table)
    groups = np.array([c["group"] for c in records["fedavg-none-paper"].clients])
    for variant in ("paper", "sgd", "lr1e-4"):  # two that zig-zag, one that does not
        name = f"fedavg-none-{variant}"
        lines += ["", f"## Which classes and clients flip: {METHODS['fedavg-none'][2]}, "
                      f"{VARIANTS[variant][1]}", ""]
        lines += flip_lines(records[name], probes[name], groups)
    for method, (_, _, label) in METHODS.items():
        plot_accuracy_curves({VARIANTS[v][1]: records[f"{method}-{v}"] for v in VARIANTS},
                             out / f"accuracy-{method}.png",
                             title=f"{label} by local training (preset {config.preset})")
    if probes["fedavg-none-paper"]:
        plot_class_accuracy(probes["fedavg-none-paper"], out / "class_accuracy-fedavg-none.png",
                            title="FedAvg (None), Adam 1e-3 fresh: test accuracy per class")
    session.finish("\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    run_cli(main)
