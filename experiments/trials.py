"""tab:different_client_partitions and the appendix F1/AUROC trial tables
(tab:app_f1_macro .. tab:app_rocauc_ovoweighted): FedAvg, IFCA and CP-CFL over several
independent trials, each redrawing the clients' private and test data; beyond the paper,
CP-CFL+restart (CP-CFL with IFCA's restart rule) beside them.

Trial k uses seed ``--seed + k`` for everything that is drawn: the clients' data, the
initial weights, the batch order and the server's pre-training, so the spread over
trials includes the encoder's. Mean ± SD (ddof = 0, as in the paper) over trials.
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import run_cli
from cpcfl_tf.evidence.catalogue import COMPARISON, COMPARISON_LABELS, comparison_specs
from cpcfl_tf.methods.federated import run_label
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.cli import positive_int
from cpcfl_tf.running.report import markdown_table, trial_table
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

FIXED = "cp-cfl-restart-simclr"
"""Beyond the paper: CP-CFL with IFCA's restart rule, which fixes CP-CFL's merged groups
(a trial where the rule never fires is its CP-CFL run: docs/choices.md)."""
ROWS = (*COMPARISON, FIXED)
SCRIPT = Script(__file__, __doc__, rows=ROWS)

PAPER = {
    "accuracy": {"fedavg-none": (42.73, 41.53, 43.67, 43.03, 42.67),
                 "fedavg-simclr": (58.30, 52.60, 56.10, 55.40, 57.50),
                 "ifca-none": (66.17, 64.37, 66.43, 66.17, 65.80),
                 "ifca-fedavg": (69.57, 66.53, 69.30, 68.20, 69.43),
                 "cp-cfl-simclr": (76.13, 76.47, 77.43, 76.40, 77.00)},
    "f1_macro": {"fedavg-none": (0.3570, 0.3451, 0.3566, 0.3315, 0.3415),
                 "fedavg-simclr": (0.5484, 0.4746, 0.5177, 0.5118, 0.5304),
                 "ifca-none": (0.6701, 0.6479, 0.6684, 0.6685, 0.6668),
                 "ifca-fedavg": (0.7002, 0.6681, 0.6984, 0.6876, 0.7006),
                 "cp-cfl-simclr": (0.7640, 0.7593, 0.7757, 0.7630, 0.7698)},
    "f1_weighted": {"fedavg-none": (0.3817, 0.3662, 0.3859, 0.3633, 0.3692),
                    "fedavg-simclr": (0.5641, 0.4933, 0.5311, 0.5306, 0.5440),
                    "ifca-none": (0.6606, 0.6404, 0.6638, 0.6602, 0.6577),
                    "ifca-fedavg": (0.6942, 0.6624, 0.6922, 0.6807, 0.6925),
                    "cp-cfl-simclr": (0.7575, 0.7560, 0.7714, 0.7601, 0.7655)},
    "auroc_ovr_macro": {"fedavg-none": (0.8321, 0.8278, 0.8355, 0.8379, 0.8306),
                        "fedavg-simclr": (0.9033, 0.8928, 0.8990, 0.9019, 0.9080),
                        "ifca-none": (0.9544, 0.9550, 0.9553, 0.9573, 0.9542),
                        "ifca-fedavg": (0.9614, 0.9571, 0.9592, 0.9593, 0.9597),
                        "cp-cfl-simclr": (0.9756, 0.9753, 0.9766, 0.9761, 0.9759)},
    "auroc_ovr_weighted": {"fedavg-none": (0.8291, 0.8269, 0.8341, 0.8366, 0.8300),
                           "fedavg-simclr": (0.9040, 0.8930, 0.8987, 0.9020, 0.9079),
                           "ifca-none": (0.9465, 0.9472, 0.9481, 0.9501, 0.9461),
                           "ifca-fedavg": (0.9549, 0.9500, 0.9521, 0.9525, 0.9526),
                           "cp-cfl-simclr": (0.9718, 0.9720, 0.9734, 0.9732, 0.9723)},
    "auroc_ovo_macro": {"fedavg-none": (0.8361, 0.8308, 0.8395, 0.8409, 0.8339),
                        "fedavg-simclr": (0.9062, 0.8937, 0.9022, 0.9037, 0.9097),
                        "ifca-none": (0.9584, 0.9586, 0.9585, 0.9605, 0.9578),
                        "ifca-fedavg": (0.9646, 0.9605, 0.9624, 0.9625, 0.9631),
                        "cp-cfl-simclr": (0.9778, 0.9774, 0.9786, 0.9782, 0.9779)},
    "auroc_ovo_weighted": {"fedavg-none": (0.8325, 0.8285, 0.8364, 0.8384, 0.8316),
                           "fedavg-simclr": (0.9046, 0.8929, 0.9000, 0.9025, 0.9084),
                           "ifca-none": (0.9524, 0.9529, 0.9531, 0.9552, 0.9520),
                           "ifca-fedavg": (0.9598, 0.9553, 0.9572, 0.9575, 0.9580),
                           "cp-cfl-simclr": (0.9747, 0.9746, 0.9758, 0.9755, 0.9750)},
}
"""The paper's five STL-10 trials (GPU, T = 100) per metric and run."""
PAPER_MEAN_SD = {
    "accuracy": {"fedavg-none": (42.73, 0.69), "fedavg-simclr": (55.98, 1.97),
                 "ifca-none": (65.79, 0.74), "ifca-fedavg": (68.61, 1.14),
                 "cp-cfl-simclr": (76.69, 0.47)},
    "f1_macro": {"fedavg-none": (0.3463, 0.0096), "fedavg-simclr": (0.5166, 0.0245),
                 "ifca-none": (0.6643, 0.0083), "ifca-fedavg": (0.6910, 0.0124),
                 "cp-cfl-simclr": (0.7664, 0.0057)},
    "f1_weighted": {"fedavg-none": (0.3733, 0.0089), "fedavg-simclr": (0.5326, 0.0231),
                    "ifca-none": (0.6565, 0.0083), "ifca-fedavg": (0.6844, 0.0120),
                    "cp-cfl-simclr": (0.7621, 0.0056)},
    "auroc_ovr_macro": {"fedavg-none": (0.8328, 0.0036), "fedavg-simclr": (0.9010, 0.0050),
                        "ifca-none": (0.9552, 0.0011), "ifca-fedavg": (0.9593, 0.0014),
                        "cp-cfl-simclr": (0.9759, 0.0004)},
    "auroc_ovr_weighted": {"fedavg-none": (0.8313, 0.0035), "fedavg-simclr": (0.9011, 0.0050),
                           "ifca-none": (0.9476, 0.0014), "ifca-fedavg": (0.9524, 0.0015),
                           "cp-cfl-simclr": (0.9725, 0.0006)},
    "auroc_ovo_macro": {"fedavg-none": (0.8363, 0.0037), "fedavg-simclr": (0.9031, 0.0054),
                        "ifca-none": (0.9587, 0.0009), "ifca-fedavg": (0.9626, 0.0013),
                        "cp-cfl-simclr": (0.9780, 0.0004)},
    "auroc_ovo_weighted": {"fedavg-none": (0.8335, 0.0035), "fedavg-simclr": (0.9017, 0.0052),
                           "ifca-none": (0.9531, 0.0011), "ifca-fedavg": (0.9576, 0.0014),
                           "cp-cfl-simclr": (0.9751, 0.0005)},
}
"""The paper's printed mean ± SD of the five trials, copied (recomputing them from the
rounded per-trial values gives other last digits in eight cells)."""
TITLES = {"accuracy": "Accuracy (%)", "f1_macro": "F1 score (macro)",
          "f1_weighted": "F1 score (weighted)", "auroc_ovr_macro": "AUROC (OvR, macro)",
          "auroc_ovr_weighted": "AUROC (OvR, weighted)", "auroc_ovo_macro": "AUROC (OvO, macro)",
          "auroc_ovo_weighted": "AUROC (OvO, weighted)"}
LABELS = {**COMPARISON_LABELS, FIXED: run_label("cp-cfl-restart", "simclr")}


def _options(parser) -> None:
    parser.add_argument("--trials", type=positive_int, default=5,
                        help="number of trials (default 5)")


def _clustering(record) -> str:
    """ARI / last cluster change / restarts; a one-model run has no clusters to score."""
    if record.config.federated.num_clusters == 1:
        return "one model"
    return (f"{record.final.ari:.3f} / {record.last_cluster_change()} / "
            f"{record.final.restarts}")


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv, _options)
    config, args = session.config, session.args
    specs = session.kept([spec for k in range(args.trials) for spec in [
        *comparison_specs(f"trial{k + 1}-", seed=args.seed + k),
        RunSpec(f"trial{k + 1}-{FIXED}", "cp-cfl-restart", "simclr", seed=args.seed + k,
                row=FIXED)]])  # after its CP-CFL run, which it is where the rule never fires
    records: dict[str, list[RunRecord]] = {name: [] for name in ROWS if session.wanted(name)}
    session.reuse_committed()  # a trial's CP-CFL+restart run made by another script
    for spec in specs:
        records[spec.key].append(session.runner.run(spec))

    lines = [f"# Trials (preset `{config.preset}`): {args.trials} client partitions (seeds "
             f"{args.seed}..{args.seed + args.trials - 1}), {config.partition.num_clients} "
             f"clients, T = {config.federated.rounds}", "",
             "The paper's mean ± SD over its five STL-10 trials (GPU, T = 100) in the last "
             "column.", ""]
    for metric, title in TITLES.items():
        paper = PAPER_MEAN_SD[metric]
        lines += [f"## {title}", ""] + trial_table(
            records, LABELS, lambda r, m=metric: r.final.metric(m),
            percent=metric == "accuracy", paper=paper) + [""]
    lines += ["## Clustering per trial", "",
              "ARI of the final cluster ids against the true groups / the round after which "
              "no client changed cluster again (counted in the attempt kept after IFCA's "
              "restarts) / IFCA restarts (FedAvg trains one model: nothing to cluster).", ""]
    lines += markdown_table(
        ["method", *(f"trial {k + 1}" for k in range(args.trials))],
        [[LABELS[name], *map(_clustering, runs)] for name, runs in records.items()])
    lines.append("")
    rows = [{"run": name, "trial": k + 1, "seed": record.seeds["data"],
             **{m: record.final.metric(m) for m in TITLES}, "ari": record.final.ari,
             "last_cluster_change": record.last_cluster_change(),
             "restarts": record.final.restarts}
            for name, runs in records.items() for k, record in enumerate(runs)]
    session.finish("\n".join(lines), rows)


if __name__ == "__main__":
    run_cli(main)
