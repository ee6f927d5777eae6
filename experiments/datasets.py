"""tab:different_datasets: pre-training data vs client data.

For each pair (pre-training data -> client data) of the preset: FedAvg (None, SimCLR),
IFCA (None, FedAvg), CP-CFL (SimCLR), the two centralized baselines from the SimCLR
encoder (all clients pooled; pooled by true group), and the relevance score of the
pre-training data to the client data (mean cross cosine similarity of 300 + 300 images
through the SimCLR encoder). Offline presets map the paper's pairs onto Fashion-MNIST
and digits and print that mapping.
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import run_cli
from cpcfl_tf.evidence.catalogue import COMPARISON_LABELS, comparison_specs
from cpcfl_tf.evidence.dataset_pairs import dataset_pairs
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import Runner, RunSpec
from cpcfl_tf.running.script import Script

CENTRALIZED = {"centralized-all": ("Centralized (all clients)", 1),
               "centralized-group": ("Centralized (by cluster)", None)}
"""The centralized rows: label and number of models (None: one per true group)."""

PAPER = {
    "STL-10 -> STL-10": {"fedavg-none": 44.13, "fedavg-simclr": 59.33, "ifca-none": 67.80,
                         "ifca-fedavg": 70.90, "cp-cfl-simclr": 76.80, "centralized-all": 64.37,
                         "centralized-group": 77.47, "relevance": 0.7346},
    "STL-10 -> CIFAR-10": {"fedavg-none": 40.10, "fedavg-simclr": 48.20, "ifca-none": 65.40,
                           "ifca-fedavg": 70.03, "cp-cfl-simclr": 75.00,
                           "centralized-all": 63.03, "centralized-group": 76.00,
                           "relevance": 0.7306},
    "STL-10 -> MNIST": {"fedavg-none": 95.47, "fedavg-simclr": 93.03, "ifca-none": 98.37,
                        "ifca-fedavg": 98.90, "cp-cfl-simclr": 98.40, "relevance": 0.6108},
    "EMNIST -> MNIST": {"fedavg-none": 95.47, "fedavg-simclr": 94.83, "ifca-none": 98.37,
                        "ifca-fedavg": 98.90, "cp-cfl-simclr": 99.27, "relevance": 0.6714},
}
"""The paper's accuracy (%) at T = 100 and relevance score, per paper pair."""
LABELS = {**COMPARISON_LABELS,
          **{k: label for k, (label, _) in CENTRALIZED.items()}}
SCRIPT = Script(__file__, __doc__, rows=tuple(LABELS))


def specs(config) -> dict[str, list[RunSpec]]:
    """The runs of every pair of ``config``'s preset."""
    groups = config.partition.num_groups
    return {pair.key: comparison_specs(f"{pair.key}-", data=pair.data, partition=pair.partition)
            + [RunSpec(f"{pair.key}-{name}", "centralized", "simclr", data=pair.data,
                       partition=pair.partition, federated={"num_clusters": n or groups},
                       row=name)
               for name, (_, n) in CENTRALIZED.items()]
            for pair in dataset_pairs(config)}


def relevance(runner: Runner, spec: RunSpec) -> float:
    """The relevance score of the spec's pre-training data to its client data."""
    from cpcfl_tf.pretraining.linear_eval import relevance_score

    run = runner.plan_of(spec)
    config = run.requested
    client_images = runner.data.partition(config)[1].images
    encoder = runner.encoders.contrastive(run).encoder
    return relevance_score(encoder, runner.data.unlabeled(config), client_images,
                           seed=config.seed)


def relevance_scores(session, pairs, runs) -> dict[str, float]:
    """Each pair's relevance score, kept in ``relevance.json`` beside the run records with
    the SimCLR encoder it was computed from and the machine: a report rebuilt later, or on
    another kind of CPU (whose pre-training gives other bits), reads the same score; an
    encoder of other settings, or ``--force``, computes it again."""
    from cpcfl_tf.records.environment import environment
    from cpcfl_tf.records.files import read_json, write_json

    path = session.out / "relevance.json"
    stored = ({} if session.args.force or not path.exists()
              else read_json(path, fix="delete it to compute the scores again"))
    scores, changed = {}, False
    for pair in pairs:
        spec = runs[pair.key][-1]  # a centralized baseline: it starts from the server's SimCLR
        encoder = session.runner.encoders.pretrain_folder(
            session.runner.plan_of(spec).pretraining).name
        kept = stored.get(pair.key)
        if kept is None or kept.get("encoder") != encoder:
            kept = stored[pair.key] = {
                "score": relevance(session.runner, spec), "encoder": encoder,
                "environment": environment()}
            changed = True
        scores[pair.key] = kept["score"]
    if changed:
        write_json(path, stored)
    return scores


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv)
    config = session.config
    pairs = dataset_pairs(config)
    for pair in pairs:
        print(f"pair {pair.label} stands for the paper's {pair.paper} "
              f"({'related' if pair.related else 'unrelated'})")
    runs = specs(config)
    kept = {s.name for s in session.kept([spec for pair in pairs for spec in runs[pair.key]])}
    records = {(pair.key, spec.key): session.runner.run(spec)
               for pair in pairs for spec in runs[pair.key] if spec.name in kept}
    scores = relevance_scores(session, pairs, runs)

    lines = [f"# Pre-training data vs client data (preset `{config.preset}`), "
             f"T = {config.federated.rounds}", "",
             "Accuracy (%) at the last round; relevance score in brackets in the header. "
             "Paper (STL-10 family, GPU, T = 100) after the slash.", ""]
    lines += [f"- {p.label} stands for the paper's {p.paper} "
              f"({'related' if p.related else 'unrelated'} data)" for p in pairs]
    table, rows = [], []
    for name, label in LABELS.items():
        if not session.wanted(name):
            continue
        cells = []
        for pair in pairs:
            record = records[(pair.key, name)]
            accuracy = record.final_accuracy
            paper = PAPER[pair.paper].get(name)
            cells.append(f"{100 * accuracy:.2f} / " + (f"{paper:.2f}" if paper else "--"))
            rows.append({"pair": pair.key, "paper_pair": pair.paper, "run": name,
                         "method": record.method, "pretraining": record.pretraining,
                         "accuracy": accuracy, "f1_macro": record.final.scores["f1_macro"],
                         "relevance": scores[pair.key], "clients": len(record.clients)})
        table.append([label, *cells])
    lines += [""] + markdown_table(
        ["method", *(f"{p.label} ({scores[p.key]:.4f} / {PAPER[p.paper]['relevance']:.4f})"
                     for p in pairs)], table)
    session.finish("\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    run_cli(main)
